//! `rdzv_version`: which library a program loaded.

use std::ffi::c_char;

static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The library's version, `MAJOR.MINOR.PATCH` (for example `"0.1.0"`): a static NUL-terminated
/// string owned by the library, never freed. Safe from any thread; never fails. It equals
/// `RDZV_VERSION` of the header the library was built with; a program can compare the two to
/// see which library it loaded against which header it was compiled with.
#[no_mangle]
pub extern "C" fn rdzv_version() -> *const c_char {
    VERSION.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn version_is_the_crates_and_the_headers() {
        // SAFETY: rdzv_version returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(rdzv_version()) }.to_str().unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        let header = include_str!("../../include/rdzv.h");
        let define = |name: &str| {
            header
                .lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("include/rdzv.h lacks {name}"))
                .to_string()
        };
        assert_eq!(define("RDZV_VERSION"), format!("\"{v}\""));
        let numbers = [
            define("RDZV_VERSION_MAJOR"),
            define("RDZV_VERSION_MINOR"),
            define("RDZV_VERSION_PATCH"),
        ]
        .join(".");
        assert!(
            v == numbers || v.starts_with(&format!("{numbers}-")),
            "RDZV_VERSION_* say {numbers}, the library {v}"
        );
    }
}
