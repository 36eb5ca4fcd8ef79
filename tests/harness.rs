//! The test harness itself: what a test starts ends with the test process, even when that
//! process is killed (a watchdog, a CI timeout) and runs no destructor. Four etcd servers
//! were once found orphaned after such runs.

mod common;

use common::{Etcd, SpawnTied};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Set in the copy of this test binary that plays the killed test.
const ROLE: &str = "RDZV_HARNESS_TEST_ROLE";

/// Waits at most `timeout` for process `pid` (not our child) to exit.
fn wait_for_exit(pid: u32, timeout: Duration) -> bool {
    // SAFETY: plain system calls on a descriptor we own.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) as libc::c_int;
        if fd < 0 {
            return true; // already gone (and reaped)
        }
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut poll, 1, timeout.as_millis() as libc::c_int);
        libc::close(fd);
        ready == 1
    }
}

#[test]
fn etcd_dies_with_a_killed_test_process() {
    if std::env::var_os(ROLE).is_some() {
        // The killed test: starts etcd from a test thread that ends before the kill, says
        // its pid, then waits to be killed.
        let etcd = std::thread::spawn(Etcd::start).join().unwrap();
        println!("etcd-pid {}", etcd.pid());
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        return;
    }
    let mut test = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "etcd_dies_with_a_killed_test_process",
            "--nocapture",
        ])
        .env(ROLE, "killed")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn_tied()
        .unwrap();
    let etcd_pid: u32 = BufReader::new(test.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("etcd-pid ").map(|p| p.parse().unwrap()))
        .expect("the test process started etcd");
    test.kill().unwrap(); // SIGKILL: no destructor runs
    test.wait().unwrap();
    assert!(
        wait_for_exit(etcd_pid, Duration::from_secs(10)),
        "etcd (pid {etcd_pid}) outlived the killed test process"
    );
}
