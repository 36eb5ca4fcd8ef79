//! What the launcher learns from the machine it runs on, and nothing it decides: its CPUs
//! (`cpus`), the kernel's files that describe it (`sysfs`, under `RDZV_SYSFS_ROOT` in tests),
//! its accelerators (`accelerators`: how many for `--nproc-per-node`, which ones for a
//! binding), the CPUs near each (`numa`, `--numa-binding`), its name and the OS's randomness.
//!
//! Each submodule uses only those listed before it: cpus, sysfs, accelerators, numa.

pub mod cpus;
pub mod sysfs;

pub mod accelerators;
pub mod numa;

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

/// A random number for ids and directory names.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS: enough for a name that must not collide by accident.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
