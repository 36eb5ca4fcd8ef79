//! What every area's tests share: the shell worker (`WORKER`, its mode the first argument), a
//! scratch directory with it, launchers started without the caller's torchrun settings, the
//! worker's START lines read back as fields, and the operator commands run to completion.

use crate::launch::{Launcher, RDZV};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The test worker. `MODE` selects what it does after printing its environment.
const WORKER: &str = r#"#!/bin/sh
echo "START rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE group=$GROUP_RANK groups=$GROUP_WORLD_SIZE lws=$LOCAL_WORLD_SIZE role=$ROLE_NAME role_rank=$ROLE_RANK role_world=$ROLE_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT restart=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS run=$TORCHELASTIC_RUN_ID agent_store=$TORCHELASTIC_USE_AGENT_STORE nccl=$TORCH_NCCL_ASYNC_ERROR_HANDLING omp=${OMP_NUM_THREADS:-unset} cuda=${CUDA_VISIBLE_DEVICES:-unset} sigs=$TORCHELASTIC_SIGNALS_TO_HANDLE errfile=$TORCHELASTIC_ERROR_FILE pid=$$"
case "$1" in
  ok) exit 0 ;;
  err)
    echo "ERR from rank $RANK" >&2
    exit 0 ;;
  hold)
    # Keeps a child of its own, to show that what a worker started is stopped too.
    trap 'echo "GOT TERM"; exit 0' TERM
    trap 'echo "GOT USR1"; exit 0' USR1
    sleep 600 &
    echo "CHILD $!"
    wait
    exit 0 ;;
  stubborn)
    trap '' TERM
    sleep 600 &
    echo "CHILD $!"
    wait
    exit 0 ;;
  fail) exit "$2" ;;
  signal) kill -"$2" $$ ;;
  fail-once)
    [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 1
    exit 0 ;;
  errfile)
    printf '{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "tb", "timestamp": "%s"}}}' "$(date +%s)" > "$TORCHELASTIC_ERROR_FILE"
    exit 7 ;;
  fifo)
    read line < "$2"
    exit 0 ;;
  cpus)
    # grep inherits the worker's CPU affinity.
    echo "CPUS local=$LOCAL_RANK allowed=$(grep Cpus_allowed_list: /proc/self/status | cut -f2) order=$CUDA_DEVICE_ORDER"
    exit 0 ;;
  errfile1)
    # Rank 1 fails with a torch-like error file; the others wait to be stopped.
    if [ "$RANK" = 1 ]; then
      printf '{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"w.py\\", line 1\\nValueError: boom", "timestamp": "%s"}}}' "$(date +%s)" > "$TORCHELASTIC_ERROR_FILE"
      exit 7
    fi
    trap 'exit 143' TERM
    sleep 600 &
    wait
    exit 0 ;;
esac
"#;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A scratch directory with the worker script in it.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "rdzv-launcher-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let worker = dir.join("worker.sh");
        std::fs::write(&worker, WORKER).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch { dir }
    }
    pub fn worker(&self) -> String {
        self.dir.join("worker.sh").display().to_string()
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `rdzv run --rdzv URL FLAGS worker MODE`: one node of the run at `url`.
    pub fn node(&self, url: &str, flags: &[&str], mode: &str) -> Launcher {
        let worker = self.worker();
        rdzv(&[&["run", "--rdzv", url], flags, &[&worker, mode]].concat())
    }

    /// `n` nodes of the run at `url`, as `node` starts them.
    pub fn nodes(&self, n: usize, url: &str, flags: &[&str], mode: &str) -> Vec<Launcher> {
        (0..n).map(|_| self.node(url, flags, mode)).collect()
    }

    /// `rdzv run --standalone FLAGS worker MODE`.
    pub fn standalone(&self, flags: &[&str], mode: &str) -> Launcher {
        let worker = self.worker();
        rdzv(&[&["run", "--standalone"], flags, &[&worker, mode]].concat())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `rdzv ARGS`.
pub fn rdzv(args: &[&str]) -> Launcher {
    rdzv_env(args, &[])
}

/// Starts `rdzv ARGS` with `env` and a TMPDIR of its own; the caller's torchrun settings
/// (PET_*, LOGLEVEL, RDZV_LOG) do not leak into the test, only those in `env` are set.
pub fn rdzv_env(args: &[&str], env: &[(&str, &str)]) -> Launcher {
    let mut cmd = Command::new(RDZV);
    cmd.args(args).envs(env.iter().copied());
    for (k, _) in std::env::vars() {
        let torchrun_setting = k.starts_with("PET_") || k == "LOGLEVEL" || k == "RDZV_LOG";
        if torchrun_setting && !env.iter().any(|(e, _)| *e == k) {
            cmd.env_remove(k);
        }
    }
    Launcher::spawn_in_own_tmpdir(cmd)
}

/// What a launcher's output says of the test workers, and how a test ends a launcher.
pub trait WorkerLines {
    /// The fields of the next START line of a worker, within `secs`.
    fn start(&mut self, secs: u64) -> Fields;
    /// The line that says `text`; fails the test if there is none.
    fn line_with(&self, text: &str) -> String;
    /// The launcher exits with `want` within `secs`.
    fn exits_with(&mut self, want: i32, secs: u64);
    /// SIGTERM to the launcher, which exits by it (128 + SIGTERM) within 30 s.
    fn terminate(&mut self);
    /// SIGKILL to the launcher alone, as a crash; it is gone within 10 s.
    fn crash(&mut self);
}

impl WorkerLines for Launcher {
    fn start(&mut self, secs: u64) -> Fields {
        fields(&self.wait_line(secs, |l| l.contains("START rank=")))
    }

    fn line_with(&self, text: &str) -> String {
        match self.lines_with(text).next() {
            Some(line) => line.to_string(),
            None => panic!(
                "no line says {text:?}; the launcher said:\n{}",
                self.output()
            ),
        }
    }

    fn exits_with(&mut self, want: i32, secs: u64) {
        let got = code(self.exit(secs));
        assert_eq!(got, want, "{}", self.output());
    }

    fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
        self.exits_with(128 + libc::SIGTERM, 30);
    }

    fn crash(&mut self) {
        self.signal(libc::SIGKILL);
        self.died(10);
    }
}

pub type Fields = HashMap<String, String>;

/// `key=value` fields of a worker's START line.
pub fn fields(line: &str) -> Fields {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn num(f: &Fields, key: &str) -> u32 {
    f[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {f:?}"))
}

/// The worker's pid from its START line.
pub fn pid(f: &Fields) -> i32 {
    f["pid"]
        .parse()
        .unwrap_or_else(|_| panic!("pid is not a number in {f:?}"))
}

/// Each of `nodes` starts its next worker, within `secs`, in a world of `world`: their START
/// fields, node by node.
pub fn formed(nodes: &mut [Launcher], world: u32, secs: u64) -> Vec<Fields> {
    nodes
        .iter_mut()
        .map(|n| {
            let f = n.start(secs);
            assert_eq!(num(&f, "world"), world, "{}", n.output());
            f
        })
        .collect()
}

/// Waits (by pidfd, not by polling) until process `pid` has exited, within `secs`.
pub fn wait_gone(pid: i32, secs: u64) {
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return; // already gone (and reaped)
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let n = unsafe { libc::poll(&mut p, 1, (secs * 1000) as i32) };
    unsafe { libc::close(fd) };
    assert_eq!(n, 1, "process {pid} still exists after {secs} s");
}

/// A pid from a worker's `CHILD pid` line.
pub fn child_pid(line: &str) -> i32 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

pub fn code(status: ExitStatus) -> i32 {
    status.code().unwrap_or(-1)
}

/// The one run directory `--log-dir=logs` holds.
pub fn run_dir(logs: &Path) -> PathBuf {
    std::fs::read_dir(logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// Runs an operator command to completion: (exit code, stdout, stderr).
pub fn op(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(RDZV)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Runs an operator command that must succeed: its stdout.
pub fn op_ok(args: &[&str]) -> String {
    let (c, out, err) = op(args);
    assert_eq!(c, 0, "{args:?}: {err}");
    out
}

/// Runs an operator command that must fail with exit code `want`: its stderr.
pub fn op_fails(args: &[&str], want: i32) -> String {
    let (c, _, err) = op(args);
    assert_eq!(c, want, "{args:?}: {err}");
    err
}

pub fn status_json(url: &str) -> serde_json::Value {
    serde_json::from_str(&op_ok(&["status", "--json", url])).unwrap()
}

/// The node id a launcher printed when it joined (`joining run ... as node ID`), the id
/// `rdzv drain` takes.
pub fn node_id(l: &mut Launcher) -> String {
    let joined = l.wait_line(5, |l| l.contains("as node "));
    joined
        .split("as node ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_string()
}

/// A run id no other test of this process uses.
pub fn unique_run_id(prefix: &str) -> String {
    format!("{prefix}-{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Fast rounds for tests: a short last call and lease.
pub const FAST: &str = "last_call_timeout=1&lease_ttl=2";
