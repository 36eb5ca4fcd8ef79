//! Launchers for the `rdzv` command's tests: `rdzv run` (or torchrun) processes whose output a
//! test reads line by line as it comes or collects to the end. Each leads its own process
//! group, so a test can SIGKILL a whole node as a machine loss would, and a launcher still
//! running when its `Launcher` is dropped (a failed assertion) is killed with its workers.
//! Framework workers report by writing whole JSON files into a results directory, which
//! `records` reads.
#![allow(dead_code)] // each test binary uses a part of it

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

pub const RDZV: &str = env!("CARGO_BIN_EXE_rdzv");

/// The python of a cached environment: the one `variable` names, else the newest complete
/// `PREFIX-<version>` under the cache directory the scripts/*-env.sh scripts use; `None`
/// where there is none (the caller skips, saying so).
pub fn cached_python(variable: &str, prefix: &str) -> Option<PathBuf> {
    // Set but empty: no environment, even where the cache has one (the test command runs
    // these suites once, in a step of their own).
    if let Some(p) = std::env::var_os(variable) {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let cache = std::env::var_os("RDZV_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("rdzv")))
        .unwrap_or_else(|| home.join(".cache/rdzv"));
    let mut venvs: Vec<PathBuf> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{prefix}-")) && !n.ends_with(".lock"))
                && p.join(".complete").exists()
        })
        .collect();
    venvs.sort();
    venvs.pop().map(|v| v.join("bin/python"))
}

/// One launcher process (`rdzv` or torchrun, for a comparison), in a process group of its own
/// and tied to the test process. Every line it writes, stdout and stderr, arrives on one
/// channel (each pipe read on a thread of its own, so a chatty launcher never blocks on a full
/// pipe). A test either waits for lines as they come (`wait_line`, `exit`) or runs it to its
/// end (`finish`). Still running when dropped (a failed assertion), its group is SIGKILLed.
/// Each line is stamped with the wall-clock time it was read from its pipe (`wait_line_at`),
/// whenever the test gets to it.
pub struct Launcher {
    child: Child,
    lines: mpsc::Receiver<(String, SystemTime)>,
    /// Every line received, for assertions on the whole output and for failure messages.
    seen: Vec<String>,
    /// Lines received while waiting for another one, not yet returned by a wait.
    passed: VecDeque<(String, SystemTime)>,
    /// A TMPDIR of the launcher's own (where `rdzv run` keeps logs without --log-dir),
    /// removed on drop.
    tmp: Option<PathBuf>,
}

impl Launcher {
    /// Starts `rdzv run ARGS PROGRAM` with `python` for `.py` programs.
    pub fn run(python: &Path, args: &[&str], program: &Path, env: &[(&str, &str)]) -> Launcher {
        let mut command = Command::new(RDZV);
        command
            .arg("run")
            .args(args)
            .arg(program)
            .env("PYTHON_EXEC", python)
            .envs(env.iter().copied());
        Launcher::spawn(command)
    }

    /// Starts `command`.
    pub fn spawn(mut command: Command) -> Launcher {
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = crate::common::spawn(command).unwrap();
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for stream in [Box::new(out) as Box<dyn Read + Send>, Box::new(err)] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send((line, SystemTime::now()));
                }
            });
        }
        Launcher {
            child,
            lines,
            seen: Vec::new(),
            passed: VecDeque::new(),
            tmp: None,
        }
    }

    /// Starts `command` with a TMPDIR of its own, removed when the `Launcher` is dropped.
    pub fn spawn_in_own_tmpdir(mut command: Command) -> Launcher {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let tmp = std::env::temp_dir().join(format!(
            "rdzv-launcher-tmp-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&tmp).unwrap();
        command.env("TMPDIR", &tmp);
        let mut launcher = Launcher::spawn(command);
        launcher.tmp = Some(tmp);
        launcher
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the launcher alone (not its group).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on a pid this process has not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGKILL to the node's process group (the launcher; its workers lead groups of their
    /// own and die with it through PR_SET_PDEATHSIG), as a lost machine would.
    pub fn kill_node(&mut self) {
        // SAFETY: plain syscall on the group this launcher leads.
        unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// The first line matching `pred` that no earlier wait returned, within `secs`. Lines
    /// passed over by earlier waits count too: the launcher's own lines (stderr) and its
    /// workers' (stdout) are read on two threads, so their order here is not the order written.
    pub fn wait_line(&mut self, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        self.wait_line_at(secs, pred).0
    }

    /// `wait_line`, with the time the line arrived.
    pub fn wait_line_at(&mut self, secs: u64, pred: impl Fn(&str) -> bool) -> (String, SystemTime) {
        if let Some(i) = self.passed.iter().position(|(l, _)| pred(l)) {
            return self.passed.remove(i).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((line, at)) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return (line, at);
                    }
                    self.passed.push_back((line, at));
                }
                Err(e) => panic!(
                    "no matching line within {secs} s ({e}); the launcher said:\n{}",
                    self.output()
                ),
            }
        }
    }

    /// Takes in every line until the output closes (true) or `deadline` passes (false).
    fn read_to_end(&mut self, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((line, at)) => {
                    self.seen.push(line.clone());
                    self.passed.push_back((line, at));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return true,
                Err(mpsc::RecvTimeoutError::Timeout) => return false,
            }
        }
    }

    /// Waits for the launcher to exit (its output closed), within `secs`; fails the test if
    /// it does not.
    pub fn exit(&mut self, secs: u64) -> ExitStatus {
        if !self.read_to_end(Instant::now() + Duration::from_secs(secs)) {
            panic!(
                "launcher did not exit within {secs} s; it said:\n{}",
                self.output()
            );
        }
        self.child.wait().unwrap()
    }

    /// Waits for the launcher process itself to exit (by pidfd) within `secs`, not for its
    /// output to close: workers write to the launcher's stdout and stderr directly, so a
    /// worker's own child that outlives a SIGKILLed launcher keeps them open. Fails the test
    /// if it does not exit; the lines that arrived by then are kept.
    pub fn died(&mut self, secs: u64) -> ExitStatus {
        // SAFETY: plain syscalls on a pid this process has not reaped.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.child.id() as i32, 0) } as i32;
        if fd >= 0 {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            unsafe { libc::poll(&mut p, 1, (secs * 1000) as i32) };
            unsafe { libc::close(fd) };
        }
        let Some(status) = self.child.try_wait().unwrap() else {
            panic!(
                "launcher did not exit within {secs} s; it said:\n{}",
                self.output()
            );
        };
        while let Ok((line, at)) = self.lines.try_recv() {
            self.seen.push(line.clone());
            self.passed.push_back((line, at));
        }
        status
    }

    /// Waits for the launcher until `deadline` (killing it then) and returns its exit code,
    /// if it exited, and everything it wrote.
    pub fn finish(mut self, deadline: Instant) -> (Option<i32>, String) {
        let code = wait_or_kill(&mut self.child, deadline);
        // Its output closes as it exits; what a killed one wrote last gets a moment to arrive.
        self.read_to_end(deadline.max(Instant::now() + Duration::from_secs(5)));
        (code, self.output())
    }

    /// Whether any line so far contains `text`.
    pub fn said(&self, text: &str) -> bool {
        self.seen.iter().any(|l| l.contains(text))
    }

    /// The lines so far that contain `text`.
    pub fn lines_with<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.seen
            .iter()
            .map(String::as_str)
            .filter(move |l| l.contains(text))
    }

    /// Every line so far, in the order received.
    pub fn output(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_node();
        }
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_dir_all(tmp);
        }
    }
}

/// Waits for `child` by pidfd until `deadline`; kills it then. Its exit code, if it exited.
pub fn wait_or_kill(child: &mut Child, deadline: Instant) -> Option<i32> {
    let left = deadline.saturating_duration_since(Instant::now());
    // SAFETY: plain syscalls on a pid this process has not reaped.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as i32, 0) } as i32;
    if fd >= 0 {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        unsafe { libc::close(fd) };
    }
    match child.try_wait().unwrap() {
        Some(status) => status.code(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

/// An empty directory for one test's results.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rdzv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The records workers wrote for a world of `world` (files named `<world>-...json`), waiting
/// (polling the directory, at most until `deadline`) until there are `count` of them. Each
/// must say `"ok": true`.
pub fn records(
    results: &Path,
    world: u32,
    count: usize,
    deadline: Instant,
) -> Vec<serde_json::Value> {
    loop {
        let found: Vec<serde_json::Value> = std::fs::read_dir(results)
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                (name.starts_with(&format!("{world}-")) && name.ends_with(".json")).then_some(name)
            })
            .map(|name| {
                let text = std::fs::read_to_string(results.join(name)).unwrap();
                serde_json::from_str(&text).unwrap()
            })
            .collect();
        if found.len() >= count {
            for r in &found {
                assert_eq!(r["ok"], true, "{r}");
            }
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "only {} workers of a world of {world} reported",
            found.len()
        );
        std::thread::sleep(Duration::from_millis(50)); // polling files the workers write
    }
}

/// Waits until something accepts connections on 127.0.0.1:`port`, retrying a refused connect
/// every 50 ms (nothing announces a listener), for at most `limit`; fails the test then.
pub fn wait_for_listener(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on port {port} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
