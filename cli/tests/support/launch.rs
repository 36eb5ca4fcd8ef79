//! `rdzv run` launchers of real framework programs (JAX, Lightning) for multi-node tests:
//! each launcher leads its own process group, so a test can SIGKILL a whole node as a machine
//! loss would, and a launcher still running when its `Launcher` is dropped (a failed
//! assertion) is killed with its workers; its output is read to the end on threads of its
//! own, so a chatty launcher never blocks on a full pipe. Workers report by writing whole JSON
//! files into a results directory, which `records` reads.
#![allow(dead_code)] // each test binary uses a part of it

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const RDZV: &str = env!("CARGO_BIN_EXE_rdzv");

/// The python of a cached environment: the one `variable` names, else the newest complete
/// `PREFIX-<version>` under the cache directory the scripts/*-env.sh scripts use; `None`
/// where there is none (the caller skips, saying so).
pub fn cached_python(variable: &str, prefix: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(variable) {
        return Some(PathBuf::from(p));
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

pub struct Launcher {
    child: Child,
    output: Option<JoinHandle<String>>,
}

impl Launcher {
    /// Starts `rdzv run ARGS PROGRAM` with `python` for `.py` programs, in a process group of
    /// its own, tied to the test process.
    pub fn start(python: &Path, args: &[&str], program: &Path, env: &[(&str, &str)]) -> Launcher {
        let mut command = Command::new(RDZV);
        command
            .arg("run")
            .args(args)
            .arg(program)
            .env("PYTHON_EXEC", python)
            .envs(env.iter().copied());
        Launcher::spawn(command)
    }

    /// Starts any launcher (torchrun, for a comparison) the same way.
    pub fn spawn(mut command: Command) -> Launcher {
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = crate::common::spawn(command).unwrap();
        let output = Some(drain(&mut child));
        Launcher { child, output }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL to the node's process group (the launcher; its workers lead groups of their
    /// own and die with it through PR_SET_PDEATHSIG), as a lost machine would.
    pub fn kill_node(&mut self) {
        // SAFETY: plain syscall on the group this launcher leads.
        unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// Waits for the launcher until `deadline` (killing it then) and returns its exit code,
    /// if it exited, and everything it wrote.
    pub fn finish(mut self, deadline: Instant) -> (Option<i32>, String) {
        let code = wait_with_deadline(&mut self.child, deadline);
        let output = self.output.take().unwrap().join().unwrap_or_default();
        (code, output)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_node();
        }
    }
}

/// Waits for `child` by pidfd until `deadline`; kills it then. Its exit code, if it exited.
pub fn wait_with_deadline(child: &mut Child, deadline: Instant) -> Option<i32> {
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

/// Reads a child's stdout and stderr to the end on threads of their own, so a chatty child
/// never blocks on a full pipe; the handle gives both, stdout first.
pub fn drain(child: &mut Child) -> JoinHandle<String> {
    use std::io::Read;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let err_text = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s + &err_text.join().unwrap_or_default()
    })
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
