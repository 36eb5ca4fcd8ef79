//! What the launcher learns from the machine it runs on, and nothing it decides: its CPUs
//! (`cpus`), the kernel's files that describe it (`sysfs`, under `RDZV_SYSFS_ROOT` in tests),
//! its accelerators (`accelerators`: how many for `--nproc-per-node`, which ones for a
//! binding), the CPUs near each (`numa`, `--numa-binding`), its name, the programs on its PATH
//! and the OS's randomness.
//!
//! Each submodule uses only those listed before it: cpus, sysfs, accelerators, numa.

pub mod cpus;
pub mod sysfs;

pub mod accelerators;
pub mod numa;

/// The first runnable file named `name` in `dirs` (an executable regular file).
pub fn executable_in(
    name: &str,
    dirs: impl IntoIterator<Item = std::path::PathBuf>,
) -> Option<std::path::PathBuf> {
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|p| runnable(p))
}

/// Whether `path` is a file this process may run.
pub fn runnable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The directories of PATH, in order (none without PATH).
pub fn path_dirs() -> Vec<std::path::PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default()
}

/// This machine's host name (`localhost` if it has none), as the failure report names it.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match rc {
        0 => String::from_utf8_lossy(&buf[..len]).into_owned(),
        _ => "localhost".into(),
    }
}

/// The host's name as Python's `socket.getfqdn()` gives it, for torchrun's failure report:
/// the name its address resolves back to (the host name if it does not resolve).
pub fn fqdn() -> String {
    let host = hostname();
    let Ok(name) = std::ffi::CString::new(host.clone()) else {
        return host;
    };
    // SAFETY: getaddrinfo is given a NUL-terminated name and zeroed hints, and its result is
    // freed with freeaddrinfo; getnameinfo writes at most the buffer's length.
    unsafe {
        let mut hints: libc::addrinfo = std::mem::zeroed();
        hints.ai_family = libc::AF_UNSPEC;
        hints.ai_socktype = libc::SOCK_STREAM;
        let mut found: *mut libc::addrinfo = std::ptr::null_mut();
        if libc::getaddrinfo(name.as_ptr(), std::ptr::null(), &hints, &mut found) != 0
            || found.is_null()
        {
            return host;
        }
        let mut buf = [0 as libc::c_char; 1025];
        let rc = libc::getnameinfo(
            (*found).ai_addr,
            (*found).ai_addrlen,
            buf.as_mut_ptr(),
            buf.len() as libc::socklen_t,
            std::ptr::null_mut(),
            0,
            libc::NI_NAMEREQD,
        );
        libc::freeaddrinfo(found);
        match rc {
            0 => std::ffi::CStr::from_ptr(buf.as_ptr())
                .to_string_lossy()
                .into_owned(),
            _ => host,
        }
    }
}

/// A random number for ids and directory names.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS: enough for a name that must not collide by accident.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
