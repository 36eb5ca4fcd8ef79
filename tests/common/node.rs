//! `rdzv-node` processes for multi-node tests: JSON lines arrive on a channel, and a process
//! still running when its `Node` is dropped is killed, so a failed test leaves nothing behind.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The node fixture, built with the tests of its package (rdzv-tests) into the target
/// directory, beside the deps/ folder the test program runs from.
pub fn node_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test program's path");
    let bin = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("a test program lives in target/<profile>/deps")
        .join("rdzv-node");
    assert!(
        bin.exists(),
        "{} is missing: rdzv-node is built with rdzv-tests' tests",
        bin.display()
    );
    bin
}

pub struct Node {
    pub child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Node {
    pub fn spawn(url: &str, args: &[&str]) -> Node {
        Node::spawn_command(Command::new(node_bin()), url, args)
    }

    /// Runs `command` (for example `ip netns exec NS rdzv-node`) with the node's arguments.
    pub fn spawn_command(mut command: Command, url: &str, args: &[&str]) -> Node {
        command
            .arg(url)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = super::spawn(command).unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).expect("rdzv-node prints JSON"));
            }
        });
        Node { child, lines }
    }

    /// The next JSON line, waiting at most `secs`.
    pub fn line(&self, secs: u64) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(secs))
            .unwrap_or_else(|e| panic!("node printed nothing within {secs} s ({e})"))
    }

    /// The next line that reports a round, skipping "change" lines; fails on an error line.
    pub fn round(&self, secs: u64) -> Value {
        loop {
            let line = self.line(secs);
            assert!(line.get("error").is_none(), "node failed: {line}");
            if line.get("rank").is_some() {
                return line;
            }
        }
    }

    /// Waits at most `secs` for the process to exit (printing nothing more) and returns its
    /// exit code.
    pub fn finish(mut self, secs: u64) -> i32 {
        // The stdout reader hangs up when the process closes stdout, i.e. when it exits.
        match self.lines.recv_timeout(Duration::from_secs(secs)) {
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("node did not exit within {secs} s"),
            Ok(line) => panic!("node printed more than expected: {line}"),
        }
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The escaped run id of a test URL (`etcd://host/RUN?...`).
pub fn run_of(url: &str) -> String {
    let path = url.split('/').nth(3).unwrap();
    path.split('?').next().unwrap().to_string()
}

/// The prefix of a round's join keys, for waiting on joiners.
pub fn joiners_of_round(url: &str, round: u64) -> String {
    format!("/rdzv/{}/r/{round:020}/join/", run_of(url))
}
