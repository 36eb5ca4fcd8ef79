//! What a test process killed by SIGKILL (a watchdog, a CI timeout, the harness's own test of
//! that) leaves behind. It runs no destructor: its etcd servers die with it (see `spawn`), but
//! their data directories stay, 123 MB each: a machine that had run the test command many
//! times held 113 of them, 14 GB. Every etcd a test starts first removes the data directories
//! of test processes that are gone. (Network namespaces: see `netns`.)

/// The kinds of temporary directory named `rdzv-{kind}-{pid}-{seq}...` by the harness.
const KINDS: [&str; 4] = ["test", "cluster", "etcd", "pki"];

/// True while process `pid` exists.
pub fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The pid in the name of a directory the harness made: `rdzv-test-123-4`,
/// `rdzv-cluster-123-4-m0`.
fn creator_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("rdzv-")?;
    let (kind, rest) = rest.split_once('-')?;
    if !KINDS.contains(&kind) {
        return None;
    }
    let mut numbers = rest.split('-');
    let pid = numbers.next()?.parse().ok()?;
    numbers.next()?.parse::<u32>().ok()?;
    Some(pid)
}

/// Removes the harness's directories in the temporary directory whose process is gone.
pub fn remove_data_dirs_of_dead_processes() {
    let dir = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let dead = name
            .to_str()
            .and_then(creator_pid)
            .is_some_and(|pid| pid != std::process::id() && !process_alive(pid));
        if dead {
            // Another test process may be removing it too.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
