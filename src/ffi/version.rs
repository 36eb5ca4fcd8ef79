//! `rdzv_version`: which library a program loaded.

use std::ffi::c_char;

static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The library's version, `MAJOR.MINOR.PATCH` (for example `"0.1.0"`): a static NUL-terminated
/// string owned by the library, never freed. Safe from any thread; never fails.
#[no_mangle]
pub extern "C" fn rdzv_version() -> *const c_char {
    VERSION.as_ptr().cast()
}
