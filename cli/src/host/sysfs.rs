//! Reads the kernel's view of the machine (sysfs, and the device nodes in /dev) under a root:
//! `/`, or `RDZV_SYSFS_ROOT` when set, a made-up machine for tests. Paths are given relative
//! to the root (`sys/bus/pci/devices`), so one tree stands for the whole machine.

use super::cpus::{parse_list, Cpus};
use std::path::PathBuf;

/// The machine's files under one root.
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// The real machine, or the made-up one `RDZV_SYSFS_ROOT` names.
    pub fn from_env() -> Sysfs {
        let root = std::env::var_os("RDZV_SYSFS_ROOT").map_or_else(|| "/".into(), PathBuf::from);
        Sysfs { root }
    }

    fn full(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    pub fn read(&self, path: &str) -> Result<String, String> {
        let full = self.full(path);
        std::fs::read_to_string(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
    }

    pub fn cpus(&self, path: &str) -> Result<Cpus, String> {
        let text = self.read(path)?;
        parse_list(&text).ok_or_else(|| format!("{path}: not a CPU list: {:?}", text.trim()))
    }

    pub fn number(&self, path: &str) -> Result<i64, String> {
        let text = self.read(path)?;
        text.trim()
            .parse()
            .map_err(|_| format!("{path}: not a number: {:?}", text.trim()))
    }

    /// The names in a directory, sorted; none if it cannot be read.
    pub fn entries(&self, path: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.full(path))
            .map(|dir| {
                dir.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The last component of a symbolic link's target (a device's `driver`: `xe`).
    pub fn link_name(&self, path: &str) -> Option<String> {
        let target = std::fs::read_link(self.full(path)).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }
}

/// A made-up machine for tests: a fresh root to write the kernel's files under, removed when
/// dropped.
#[cfg(test)]
pub struct MadeUp {
    root: PathBuf,
}

#[cfg(test)]
impl MadeUp {
    pub fn new(name: &str) -> MadeUp {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("rdzv-{name}-{}-{seq}", std::process::id()));
        MadeUp { root }
    }

    /// Writes a file (`sys/...`, `dev/...`), with the directories above it.
    pub fn write(&self, path: &str, text: &str) {
        let full = self.root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
    }

    /// Makes `path` a symbolic link to the directory `target` (both under the root).
    pub fn link(&self, path: &str, target: &str) {
        let target = self.root.join(target);
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(target, self.root.join(path)).unwrap();
    }

    /// The machine's files, as the probes read them.
    pub fn sysfs(&self) -> Sysfs {
        Sysfs {
            root: self.root.clone(),
        }
    }
}

#[cfg(test)]
impl Drop for MadeUp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
