//! `rdzv run` end to end: real launcher processes on a real etcd, with small shell workers
//! that print their environment (the launcher forwards their lines as they are, which the
//! tests read through pipes). Every wait is bounded and waits on an event: a line on a pipe,
//! a process exit (pidfd), an etcd watch.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{Launcher, RDZV};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
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
    fn worker(&self) -> String {
        self.dir.join("worker.sh").display().to_string()
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `rdzv run --rdzv URL FLAGS worker MODE`: one node of the run at `url`.
    fn node(&self, url: &str, flags: &[&str], mode: &str) -> Launcher {
        let worker = self.worker();
        rdzv(&[&["run", "--rdzv", url], flags, &[&worker, mode]].concat())
    }

    /// `n` nodes of the run at `url`, as `node` starts them.
    fn nodes(&self, n: usize, url: &str, flags: &[&str], mode: &str) -> Vec<Launcher> {
        (0..n).map(|_| self.node(url, flags, mode)).collect()
    }

    /// `rdzv run --standalone FLAGS worker MODE`.
    fn standalone(&self, flags: &[&str], mode: &str) -> Launcher {
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
fn rdzv(args: &[&str]) -> Launcher {
    rdzv_env(args, &[])
}

/// Starts `rdzv ARGS` with `env` and a TMPDIR of its own; the caller's torchrun settings
/// (PET_*, LOGLEVEL, RDZV_LOG) do not leak into the test, only those in `env` are set.
fn rdzv_env(args: &[&str], env: &[(&str, &str)]) -> Launcher {
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
trait WorkerLines {
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

type Fields = HashMap<String, String>;

/// `key=value` fields of a worker's START line.
fn fields(line: &str) -> Fields {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(f: &Fields, key: &str) -> u32 {
    f[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {f:?}"))
}

/// The worker's pid from its START line.
fn pid(f: &Fields) -> i32 {
    f["pid"]
        .parse()
        .unwrap_or_else(|_| panic!("pid is not a number in {f:?}"))
}

/// Each of `nodes` starts its next worker, within `secs`, in a world of `world`: their START
/// fields, node by node.
fn formed(nodes: &mut [Launcher], world: u32, secs: u64) -> Vec<Fields> {
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
fn wait_gone(pid: i32, secs: u64) {
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
fn child_pid(line: &str) -> i32 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn code(status: ExitStatus) -> i32 {
    status.code().unwrap_or(-1)
}

/// The one run directory `--log-dir=logs` holds.
fn run_dir(logs: &Path) -> PathBuf {
    std::fs::read_dir(logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// Runs an operator command to completion: (exit code, stdout, stderr).
fn op(args: &[&str]) -> (i32, String, String) {
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
fn op_ok(args: &[&str]) -> String {
    let (c, out, err) = op(args);
    assert_eq!(c, 0, "{args:?}: {err}");
    out
}

/// Runs an operator command that must fail with exit code `want`: its stderr.
fn op_fails(args: &[&str], want: i32) -> String {
    let (c, _, err) = op(args);
    assert_eq!(c, want, "{args:?}: {err}");
    err
}

fn status_json(url: &str) -> serde_json::Value {
    serde_json::from_str(&op_ok(&["status", "--json", url])).unwrap()
}

/// The node id a launcher printed when it joined (`joining run ... as node ID`), the id
/// `rdzv drain` takes.
fn node_id(l: &mut Launcher) -> String {
    let joined = l.wait_line(5, |l| l.contains("as node "));
    joined
        .split("as node ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_string()
}

/// A run id no other test of this process uses.
fn unique_run_id(prefix: &str) -> String {
    format!("{prefix}-{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Fast rounds for tests: a short last call and lease.
const FAST: &str = "last_call_timeout=1&lease_ttl=2";

#[test]
fn launchers_with_different_worker_counts_form_one_job() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let run = unique_run_id("job");
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id = format!("--rdzv-id={run}");
    let node = |nproc: &str| {
        rdzv(&[
            "run",
            "--nnodes=2",
            nproc,
            &endpoint,
            &id,
            "--local-addr=127.0.0.1",
            &w,
            "ok",
        ])
    };
    let mut a = node("--nproc-per-node=2");
    let mut b = node("--nproc-per-node=1");
    let mut starts = vec![a.start(30), a.start(30), b.start(30)];
    a.exits_with(0, 30);
    b.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    let ranks: Vec<u32> = starts.iter().map(|f| num(f, "rank")).collect();
    assert_eq!(ranks, [0, 1, 2], "global ranks are unique and dense");
    let master = &starts[0]["master"];
    assert!(
        master.starts_with("127.0.0.1:"),
        "--local-addr is MASTER_ADDR: {master}"
    );
    for f in &starts {
        assert_eq!(num(f, "world"), 3);
        assert_eq!(num(f, "groups"), 2);
        assert_eq!(&f["master"], master, "every worker has the same master");
        assert_eq!(f["run"], run);
        assert_eq!(f["agent_store"], "False");
        assert_eq!(f["nccl"], "1");
        assert_eq!(f["role"], "default");
        assert_eq!(num(f, "role_world"), 3);
        assert_eq!(num(f, "role_rank"), num(f, "rank"));
        assert_eq!(num(f, "restart"), 0);
        assert_eq!(num(f, "max"), 0);
        assert!(f["errfile"].ends_with("error.json"), "{f:?}");
    }
    // The node with two workers holds the lower or the higher ranks, consistently.
    let node_of = |f: &Fields| (num(f, "group"), num(f, "lws"), f["omp"].clone());
    let two = starts
        .iter()
        .filter(|f| num(f, "lws") == 2)
        .collect::<Vec<_>>();
    let one = starts.iter().find(|f| num(f, "lws") == 1).unwrap();
    assert_eq!(node_of(two[0]), node_of(two[1]));
    assert_eq!(
        two[0]["omp"], "1",
        "OMP_NUM_THREADS=1 with several workers per node"
    );
    assert_eq!(
        one["omp"], "unset",
        "as torchrun: one worker per node keeps OMP_NUM_THREADS as it is"
    );
    let locals: Vec<u32> = two.iter().map(|f| num(f, "local")).collect();
    assert_eq!(locals, [0, 1]);
    assert!(a.said("exit barrier") && b.said("exit barrier"));
}

#[test]
fn min_equals_max_and_the_exit_barrier_waits_for_the_slow_node() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("barrier", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let fifo = s.path("release");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut fast = s.node(&url, &[], "ok");
    let fifo_arg = fifo.display().to_string();
    let mut slow = rdzv(&["run", "--rdzv", &url, &s.worker(), "fifo", &fifo_arg]);
    fast.start(30);
    slow.start(30);
    fast.wait_line(30, |l| l.contains("exit barrier"));
    assert!(
        fast.running(),
        "a node whose workers finished waits for the others"
    );
    // Release the slow worker: opening the FIFO for writing unblocks its read.
    std::fs::write(&fifo, "go\n").unwrap();
    slow.exits_with(0, 30);
    fast.exits_with(0, 30);
    assert!(fast.said("every node finished"), "{}", fast.output());
    // A finished job leaves nothing in etcd.
    assert_eq!(status_json(&url)["exists"], false);
}

#[test]
fn a_node_that_arrives_grows_the_world_without_spending_restarts() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("grow", &format!("min_nodes=1&max_nodes=3&{FAST}"));
    let mut a = s.node(&url, &["--max-restarts=0"], "hold");
    let first = a.start(30);
    assert_eq!(num(&first, "world"), 1);
    let mut b = s.node(&url, &["--max-restarts=0"], "hold");
    a.wait_line(30, |l| l.contains("waiting to join"));
    let again = a.start(30);
    let joined = b.start(30);
    assert_eq!(num(&again, "world"), 2);
    assert_eq!(num(&joined, "world"), 2);
    assert_eq!(
        num(&again, "restart"),
        0,
        "a membership change spends no restart"
    );
    assert_eq!(num(&again, "rank"), 0, "the first node keeps rank 0");
    assert_eq!(num(&joined, "rank"), 1);
    a.signal(libc::SIGTERM);
    b.signal(libc::SIGTERM);
    a.exits_with(128 + libc::SIGTERM, 30);
    b.exits_with(128 + libc::SIGTERM, 30);
}

#[test]
fn survivors_re_form_within_about_the_lease_ttl_after_a_node_is_killed() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("loss", &format!("min_nodes=2&max_nodes=3&{FAST}"));
    let mut nodes = s.nodes(3, &url, &[], "hold");
    let pids: Vec<(u32, i32)> = formed(&mut nodes, 3, 30)
        .iter()
        .map(|f| (num(f, "rank"), pid(f)))
        .collect();
    // Kill the node whose worker is rank 2, launcher and all, as a machine would die.
    let victim = pids.iter().position(|(rank, _)| *rank == 2).unwrap();
    let mut dead = nodes.remove(victim);
    let worker_pid = pids[victim].1;
    let killed = Instant::now();
    dead.crash();
    wait_gone(worker_pid, 10); // PR_SET_PDEATHSIG: no worker outlives its launcher
    for f in formed(&mut nodes, 2, 30) {
        assert_eq!(num(&f, "restart"), 0, "a lost node spends no restart");
    }
    let took = killed.elapsed();
    eprintln!(
        "survivors restarted {:.2} s after SIGKILL (lease_ttl 2 s, last call 1 s)",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(12), "took {took:?}");
    nodes.iter_mut().for_each(WorkerLines::terminate);
}

/// A signal that lands as the launcher goes from stopping its workers to rejoining is pending
/// when its `next` starts, and the launcher cancels `next` before first polling it. That cancel
/// was lost, and the launcher then waited out `join_timeout` alone: a CI run hung this way.
#[test]
fn a_sigterm_as_the_launcher_rejoins_ends_it() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    // The signal lands in the gap about one time in four: twelve trials miss it rarely.
    for trial in 0..12 {
        eprintln!("trial {trial}"); // shown with the output of a failed trial
                                    // A join timeout far beyond the exit wait: a lost signal shows as a hang.
        let url = etcd.url(
            &format!("rejoin-signal-{trial}"),
            &format!("min_nodes=2&max_nodes=2&join_timeout=300&{FAST}"),
        );
        let (mut a, mut b) = (s.node(&url, &[], "hold"), s.node(&url, &[], "hold"));
        a.start(30);
        b.start(30);
        a.terminate();
        // b's worker says this as b stops it to re-form without a: b is about to rejoin.
        b.wait_line(30, |l| l.contains("GOT TERM"));
        b.terminate();
    }
}

/// A node SIGTERMed at each step of re-forming after a peer's loss exits by the signal (143),
/// as it does while its workers run: a scheduler must not take a terminated node for one
/// that finished. The steps: just after the loss, as it stops its workers, as it rejoins, and
/// once the new round formed.
#[test]
fn a_sigterm_at_each_step_of_re_forming_after_a_loss_exits_by_the_signal() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let steps = [
        None,
        Some("to form a new round"),
        Some("joining run"),
        Some("round 1 formed"),
    ];
    for (trial, step) in steps.into_iter().enumerate() {
        eprintln!("trial {trial}: SIGTERM at {step:?}"); // shown with a failed trial's output
                                                         // A last call long enough that both launchers join round 0 on a loaded machine (with
                                                         // 1 s the first once sealed it alone); a round of one waits it out once per trial.
        let url = etcd.url(
            &format!("reform-signal-{trial}"),
            "min_nodes=1&max_nodes=2&last_call_timeout=4&lease_ttl=2",
        );
        let mut nodes = s.nodes(2, &url, &[], "hold");
        formed(&mut nodes, 2, 30);
        let [a, b] = &mut nodes[..] else {
            unreachable!()
        };
        a.wait_line(30, |l| l.contains("joining run")); // its first join
        b.crash(); // its watchdog releases it: a sees the loss at once
        if let Some(step) = step {
            a.wait_line(30, |l| l.contains(step));
        }
        a.terminate();
    }
}

#[test]
fn rdzv_drain_stops_one_node_which_exits_0_and_the_others_re_form_without_spending_restarts() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    // A lease and a last call far beyond the waits below: the survivors can re-form in time
    // only because the drain is seen at once and nobody waits for the drained node.
    let url = etcd.url(
        "drain",
        "min_nodes=2&max_nodes=3&last_call_timeout=60&lease_ttl=60",
    );
    let mut nodes = s.nodes(3, &url, &["--max-restarts=0"], "hold");
    let ranks: Vec<u32> = formed(&mut nodes, 3, 90)
        .iter()
        .map(|f| num(f, "rank"))
        .collect();
    // The node running rank 1, by the id its launcher printed when it joined.
    let victim = ranks.iter().position(|r| *r == 1).unwrap();
    let node_id = node_id(&mut nodes[victim]);
    let out = op_ok(&["drain", "--reason", "scale down", &url, &node_id]);
    assert!(out.contains("drained"), "{out}");
    let mut drained = nodes.remove(victim);
    drained.exits_with(0, 30);
    assert!(
        drained.said("GOT TERM"),
        "its workers were stopped gracefully"
    );
    assert!(drained.said("drained"), "{}", drained.output());
    for f in formed(&mut nodes, 2, 30) {
        assert_eq!(num(&f, "restart"), 0, "a drain spends no restart");
    }
    let members = status_json(&url)["sealed"]["members"].clone();
    assert!(
        members
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["node"] != node_id.as_str()),
        "{members}"
    );
    // Draining what is not a node of the run is a usage error naming it.
    let err = op_fails(&["drain", &url, "0000000000000000"], 2);
    assert!(err.contains("0000000000000000"), "{err}");
    nodes.iter_mut().for_each(WorkerLines::terminate);
}

#[test]
fn a_worker_that_always_fails_spends_the_budget_and_closes_the_run() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("budget", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let mut healthy = s.node(&url, &["--max-restarts=2"], "hold");
    let mut failing = s.node(&url, &["--max-restarts=2"], "errfile");
    let mut restarts = Vec::new();
    let mut rank = 0;
    for _ in 0..3 {
        let f = failing.start(60);
        restarts.push(num(&f, "restart"));
        rank = num(&f, "rank");
    }
    assert_eq!(restarts, [0, 1, 2]);
    // Which node joins first, and so runs rank 0, is a race between the two launchers.
    let root_cause = format!("rank {rank} ");
    failing.exits_with(1, 60);
    let out = failing.output();
    assert!(out.contains("restart budget spent (2 of 2"), "{out}");
    let report = failing.line_with("first failure");
    assert!(report.contains("exit code 7"), "{report}");
    let errfile = failing.line_with("error file");
    assert!(
        errfile.contains("error.json") && errfile.contains("ValueError: boom"),
        "{errfile}"
    );
    let path = errfile
        .split("error file ")
        .nth(1)
        .unwrap()
        .split(": ")
        .next()
        .unwrap();
    assert!(
        PathBuf::from(path).is_file(),
        "the reported error file is kept: {path}"
    );
    // The other node restarted with it each time (a membership change for it, no budget
    // spent), then answered that it was alive, heard that the job failed, ended its workers
    // gracefully and failed too: a scheduler sees the job's failure on every node.
    healthy.exits_with(1, 30);
    assert!(healthy.said("GOT TERM"));
    assert!(
        healthy.said(&format!("the job failed on another node: {root_cause}"))
            && healthy.said("exit code 7"),
        "{}",
        healthy.output()
    );
    let status = status_json(&url);
    assert_eq!(status["closed"], true);
    let failure = status["failure"].as_str().unwrap_or_default();
    assert!(failure.contains("exit code 7"), "{status}");
    let shown = op_ok(&["status", &url]);
    assert!(
        shown.contains(&format!("closed: the job failed ({root_cause}")),
        "{shown}"
    );
}

#[test]
fn a_worker_that_fails_once_is_restarted_and_the_job_succeeds() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("once", FAST);
    let mut l = s.node(
        &url,
        &["--nproc-per-node=2", "--max-restarts=1"],
        "fail-once",
    );
    l.exits_with(0, 60);
    assert!(l.said("restarting the worker group (restart 1 of 1)"));
    // The first group may be stopped before its second worker prints anything; the restarted
    // group runs to its end.
    let second = l
        .lines_with("START rank=")
        .filter(|x| x.contains("restart=1"));
    assert_eq!(second.count(), 2, "both workers ran again: {}", l.output());
    assert!(l.said("restart=0"));
    assert_eq!(
        status_json(&url)["closed"],
        false,
        "success does not close the run"
    );
}

#[test]
fn sigterm_is_forwarded_to_every_worker_and_nothing_is_orphaned() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("signal", FAST);
    let mut l = s.node(&url, &["--nproc-per-node=2"], "hold");
    // Two workers, each with a child: their pids, in whatever order the lines arrive.
    let pids: Vec<i32> = (0..4)
        .map(|_| {
            let line = l.wait_line(30, |x| x.contains("START rank=") || x.contains("CHILD "));
            match line.contains("CHILD ") {
                true => child_pid(&line),
                false => pid(&fields(&line)),
            }
        })
        .collect();
    l.terminate();
    assert_eq!(l.lines_with("GOT TERM").count(), 2, "{}", l.output());
    for pid in pids {
        wait_gone(pid, 10);
    }
    let status = status_json(&url);
    assert_eq!(
        status["closed"], false,
        "a launcher leaving does not close the run"
    );
    assert_eq!(status["alive"], 0, "it released its node");
}

#[test]
fn a_worker_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--shutdown-timeout=1"], "stubborn");
    let pid = pid(&l.start(30));
    let child = child_pid(&l.wait_line(10, |x| x.contains("CHILD ")));
    l.terminate();
    assert!(l.said("SIGKILL"), "{}", l.output());
    wait_gone(pid, 10);
    wait_gone(child, 10);
}

#[test]
fn workers_die_with_a_launcher_killed_by_sigkill() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--nproc-per-node=2"], "hold");
    let pids = [pid(&l.start(30)), pid(&l.start(30))];
    l.crash();
    for pid in pids {
        wait_gone(pid, 10);
    }
}

#[test]
fn rdzv_close_ends_a_running_job() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("close", &format!("min_nodes=2&{FAST}"));
    let mut a = s.node(&url, &[], "hold");
    let mut b = s.node(&url, &[], "hold");
    a.start(30);
    b.start(30);
    let out = op_ok(&["close", &url]);
    assert!(out.contains("closed"), "{out}");
    for n in [&mut a, &mut b] {
        n.exits_with(0, 30);
        assert!(n.said("GOT TERM") && n.said("the run was closed"));
    }
    // A job started later under the closed id fails clearly instead of ending quietly.
    let err = op_fails(&["run", "--rdzv", &url, &s.worker(), "ok"], 1);
    assert!(err.contains("is closed"), "{err}");
}

#[test]
fn pet_variables_configure_the_launcher_and_flags_win() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let endpoint = etcd.endpoint();
    let run = unique_run_id("pet");
    let mut l = rdzv_env(
        &["run", "--nproc-per-node=2", &s.worker(), "ok"],
        &[
            ("PET_NNODES", "1"),
            ("PET_NPROC_PER_NODE", "3"),
            ("PET_RDZV_BACKEND", "etcd-v2"),
            ("PET_RDZV_ENDPOINT", &endpoint),
            ("PET_RDZV_ID", &run),
            ("PET_RDZV_CONF", "last_call_timeout=1,lease_ttl=2"),
            ("PET_MAX_RESTARTS", "4"),
            ("PET_ROLE", "trainer"),
        ],
    );
    let f = l.start(30);
    l.exits_with(0, 30);
    assert_eq!(
        num(&f, "lws"),
        2,
        "--nproc-per-node wins over PET_NPROC_PER_NODE"
    );
    assert_eq!(f["run"], run);
    assert_eq!(num(&f, "max"), 4);
    assert_eq!(f["role"], "trainer");
    assert!(l.said("rdzv speaks etcd's v3 API"), "{}", l.output());
    assert_eq!(l.lines_with("START rank=").count(), 2);
}

#[test]
fn standalone_runs_without_etcd() {
    let s = Scratch::new();
    // No etcd on PATH either: --standalone needs none.
    let bare = s.path("no-etcd-path");
    std::fs::create_dir_all(&bare).unwrap();
    for tool in ["sh", "sleep", "grep", "cut", "date", "printf"] {
        if let Some(found) = which(tool) {
            let _ = std::os::unix::fs::symlink(found, bare.join(tool));
        }
    }
    let w = s.worker();
    let mut l = rdzv_env(
        &["run", "--standalone", "--nproc-per-node=3", &w, "ok"],
        &[("PATH", bare.to_str().unwrap())],
    );
    let mut starts: Vec<_> = (0..3).map(|_| l.start(30)).collect();
    l.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    for (i, f) in starts.iter().enumerate() {
        assert_eq!(num(f, "rank"), i as u32);
        assert_eq!(num(f, "local"), i as u32);
        assert_eq!(num(f, "world"), 3);
        assert!(f["master"].starts_with("localhost:"), "{f:?}");
        assert_eq!(f["master"], starts[0]["master"]);
    }
    // Worker lines reach the console as the worker wrote them, as under torchrun.
    assert!(
        l.lines_with("START rank=2 ")
            .any(|x| x.starts_with("START ")),
        "{}",
        l.output()
    );
}

#[test]
fn log_dir_keeps_per_worker_files() {
    let s = Scratch::new();
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = s.standalone(&["--nproc-per-node=2", "--redirects=1", &logs_arg], "ok");
    l.exits_with(0, 30);
    assert!(
        !l.said("START rank="),
        "--redirects=1 keeps stdout off the console"
    );
    let run_dir = run_dir(&logs);
    for rank in 0..2 {
        let out =
            std::fs::read_to_string(run_dir.join(format!("attempt_0/{rank}/stdout.log"))).unwrap();
        assert!(out.starts_with(&format!("START rank={rank} ")), "{out}");
        // Only the redirected stream has a file, as torchrun lays it out.
        assert!(!run_dir
            .join(format!("attempt_0/{rank}/stderr.log"))
            .exists());
    }
}

#[test]
fn bad_input_fails_fast_with_one_line() {
    let s = Scratch::new();
    let w = s.worker();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["run", "--bogus", &w], 2, "--bogus"),
        (
            vec!["run", "--nnodes=3:2", "--rdzv-endpoint=127.0.0.1:2379", &w],
            2,
            "--nnodes",
        ),
        (vec!["run", "--standalone"], 2, "PROGRAM"),
        (
            vec!["run", "--standalone", "/no/such/program"],
            2,
            "/no/such/program",
        ),
        (
            vec!["run", "--standalone", "/no/such/script.py"],
            2,
            "script.py",
        ),
        (
            vec!["run", "--standalone", "--no-python", "--module", "x"],
            2,
            "--module",
        ),
        (vec!["run", "--nnodes=2", &w], 2, "--rdzv-endpoint"),
        (
            vec!["run", "--rdzv-backend=zookeeper", "--rdzv-endpoint=h:1", &w],
            2,
            "--rdzv-backend",
        ),
        (
            vec!["run", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1,g:2", &w],
            2,
            "c10d: expected one HOST:PORT",
        ),
        (
            vec!["run", "--rdzv-endpoint=h:1", "--rdzv-conf=bogus=1", &w],
            2,
            "bogus",
        ),
        (
            vec!["run", "--nproc-per-node=zero", "--standalone", &w],
            2,
            "--nproc-per-node",
        ),
        (
            vec![
                "run",
                "--rdzv-endpoint=no-such-host.invalid:2379",
                "--rdzv-id=x",
                &w,
                "ok",
            ],
            1,
            "cannot resolve the host name",
        ),
        (
            vec!["run", "--rdzv=etcd://h:1/x", "--rdzv-id=y", &w],
            2,
            "--rdzv-id",
        ),
        (vec!["status", "notaurl"], 2, "URL"),
        (
            vec!["purge", "etcd://127.0.0.1:1/x"],
            1,
            "connection refused",
        ),
        (vec!["frobnicate"], 2, "frobnicate"),
    ];
    for (args, want, mention) in cases {
        let started = Instant::now();
        let (got, out, err) = op(&args);
        assert_eq!(got, want, "{args:?}: stdout {out:?} stderr {err:?}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: expected one line, got {err:?}");
        assert!(
            lines[0].contains(mention),
            "{args:?}: {err:?} does not mention {mention}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn status_shows_members_and_a_crashed_run_goes_with_its_leases() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("status", &format!("min_nodes=2&{FAST}"));
    let mut watch = rdzv(&["status", "--watch", &url]);
    watch.wait_line(10, |l| l.contains("absent"));
    let mut a = s.node(&url, &[], "hold");
    let mut b = s.node(&url, &[], "hold");
    a.start(30);
    b.start(30);
    watch.wait_line(10, |l| l.contains("round 0 sealed: 2 member(s)"));
    let table = op_ok(&["status", &url]);
    assert!(table.contains("state    open"), "{table}");
    assert!(table.contains("RANK  NODE"), "{table}");
    assert_eq!(
        table
            .lines()
            .filter(|l| l.trim_end().ends_with("yes"))
            .count(),
        2,
        "{table}"
    );
    let json = status_json(&url);
    assert_eq!(json["sealed"]["members"].as_array().unwrap().len(), 2);
    assert_eq!(json["sealed"]["round"], 0);
    // purge refuses while members are alive.
    let err = op_fails(&["purge", &url], 1);
    assert!(err.contains("2 live node(s)"), "{err}");
    // Crash both nodes: nobody shuts down, yet the run's keys go with the nodes' leases and
    // the run's lease, which no node refreshes any more.
    a.signal(libc::SIGKILL);
    b.signal(libc::SIGKILL);
    a.died(10);
    b.died(10);
    watch.wait_line(15, |l| l.contains("run deleted from etcd"));
    let run = common::node::run_of(&url);
    common::wait_for_key_count(&etcd.endpoint(), &format!("/rdzv/{run}/"), |n| n == 0);
    assert_eq!(status_json(&url)["exists"], false);
    // What is left of a closed run is its marker, until `retention`: purge takes it now.
    op_ok(&["close", &url]);
    assert_eq!(status_json(&url)["closed"], true);
    let out = op_ok(&["purge", &url]);
    assert!(out.contains("purged"), "{out}");
    assert_eq!(status_json(&url)["exists"], false);
}

#[test]
fn a_long_line_reaches_a_console_that_reads_it_slowly_whole() {
    // A 10 MB line without a newline, teed, to a console that takes seconds to read it: the
    // launcher used to wait 2 s for its workers' output and exit mid-write (the line was in
    // stdout.log, but cut short on the console).
    let s = Scratch::new();
    let logs = s.path("logs");
    let mut cmd = Command::new(RDZV);
    cmd.args(["run", "--standalone", "--tee", "3", "--log-dir"])
        .arg(&logs)
        .args([
            "python3",
            "-c",
            "import sys; sys.stdout.write('x' * 10_000_000)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("PET_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    // 64 KiB every 40 ms: about 6 s for the line.
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let (mut xs, mut buf) = (0usize, vec![0u8; 64 * 1024]);
        loop {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => return xs,
                Ok(n) => xs += buf[..n].iter().filter(|&&b| b == b'x').count(),
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the launcher did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code(status), 0);
    assert_eq!(
        reader.join().unwrap(),
        10_000_000,
        "the console lost part of the line"
    );
}

#[test]
fn tee_and_the_local_ranks_filter_choose_what_the_console_shows() {
    let s = Scratch::new();
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let flags = [
        "--nproc-per-node=2",
        "--tee=3",
        "--local-ranks-filter=1",
        &logs_arg,
    ];
    let mut l = s.standalone(&flags, "ok");
    l.exits_with(0, 30);
    assert!(
        l.said("[default1]:START") && !l.said("START rank=0"),
        "{}",
        l.output()
    );
    let out = std::fs::read_to_string(run_dir(&logs).join("attempt_0/0/stdout.log")).unwrap();
    assert!(
        out.starts_with("START rank=0 "),
        "files keep the filtered ranks: {out}"
    );
}

#[test]
fn python_programs_run_under_python3_and_cpu_counts_cpus() {
    let s = Scratch::new();
    let script = s.path("w.py");
    std::fs::write(
        &script,
        // One write per line: python3 -u writes print's text and its newline apart, and two
        // workers on one console can interleave them.
        "import os, sys\nsys.stdout.write(f\"PY {os.environ['RANK']} {os.environ['WORLD_SIZE']}\\n\")\n",
    )
    .unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let script_arg = script.display().to_string();
    let mut l = rdzv(&["run", "--standalone", "--nproc-per-node=cpu", &script_arg]);
    l.exits_with(0, 30);
    assert_eq!(l.lines_with("PY ").count(), cpus, "{}", l.output());
    assert!(l.said(&format!("PY 0 {cpus}")));

    // --module runs python3 -m NAME.
    std::fs::write(
        s.path("wmod.py"),
        "import os\nprint('MOD', os.environ['LOCAL_RANK'])\n",
    )
    .unwrap();
    let path = s.dir.display().to_string();
    let mut m = rdzv_env(
        &["run", "--standalone", "--module", "wmod"],
        &[("PYTHONPATH", &path)],
    );
    m.exits_with(0, 30);
    assert!(
        m.lines_with("MOD 0").any(|x| x == "MOD 0"),
        "{}",
        m.output()
    );
}

#[test]
fn a_second_signal_cuts_the_grace_period_short() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--shutdown-timeout=600"], "stubborn");
    let pid = pid(&l.start(30));
    l.wait_line(10, |x| x.contains("CHILD "));
    l.signal(libc::SIGTERM);
    l.wait_line(10, |x| x.contains("forwarding it to the workers"));
    let second = Instant::now();
    l.signal(libc::SIGINT);
    l.exits_with(128 + libc::SIGTERM, 30);
    assert!(second.elapsed() < Duration::from_secs(10));
    assert!(
        l.said("still running after SIGINT: SIGKILL"),
        "{}",
        l.output()
    );
    wait_gone(pid, 10);
}

#[test]
fn a_worker_killed_by_a_signal_is_reported_by_the_signal_name() {
    let mut l = rdzv(&[
        "run",
        "--standalone",
        "--no-python",
        "sh",
        "-c",
        "kill -SEGV $$",
    ]);
    l.exits_with(1, 30);
    let report = l.line_with("first failure");
    assert!(
        report.contains("rank 0") && report.contains("signal SIGSEGV"),
        "{report}"
    );
}

/// Every file under `dir`, as paths relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn console_lines_are_the_workers_own_and_teed_lines_carry_torchruns_prefix() {
    let s = Scratch::new();
    // By default the console shows what the workers wrote, unprefixed (so torch's own
    // `[rank1]:` lines are not doubled).
    let mut plain = s.standalone(&["--nproc-per-node=2"], "err");
    plain.exits_with(0, 30);
    for rank in 0..2 {
        assert!(
            plain
                .lines_with(&format!("START rank={rank} "))
                .any(|x| x.starts_with("START ")),
            "{}",
            plain.output()
        );
        assert!(plain.said(&format!("ERR from rank {rank}")));
    }
    assert!(!plain.said("]:START"), "{}", plain.output());

    // --tee: torchrun's `[${role_name}${local_rank}]:`, and duplicate filters (`,,` a comma).
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let flags = [
        "--nproc-per-node=2",
        "--tee=3",
        "--role=trainer",
        "--duplicate-stdout-filters=rank=1,,nothing,START rank=0",
        "--duplicate_stderr_filters=ERR",
        &logs_arg,
    ];
    let mut teed = s.standalone(&flags, "err");
    teed.exits_with(0, 30);
    assert!(teed.said("[trainer0]:START rank=0 "), "{}", teed.output());
    assert!(teed.said("[trainer1]:START rank=1 "), "{}", teed.output());
    assert!(teed.said("[trainer1]:ERR from rank 1"), "{}", teed.output());
    let attempt = run_dir(&logs).join("attempt_0");
    let filtered = std::fs::read_to_string(attempt.join("filtered_stdout.log")).unwrap();
    assert!(
        filtered.starts_with("[trainer0]:START rank=0 ") && filtered.lines().count() == 1,
        "{filtered}"
    );
    let filtered = std::fs::read_to_string(attempt.join("filtered_stderr.log")).unwrap();
    assert_eq!(filtered.lines().count(), 2, "{filtered}");

    // A template, from the flag or from torchrun's variable (the flag wins).
    let w = s.worker();
    let mut templated = rdzv(&[
        "run",
        "--standalone",
        "--nproc-per-node=2",
        "--tee=1",
        "--log-line-prefix-template=${role_name}/${rank}/${local_rank}> ",
        &w,
        "ok",
    ]);
    templated.exits_with(0, 30);
    assert!(
        templated.said("default/1/1> START rank=1 "),
        "{}",
        templated.output()
    );
    let mut by_variable = rdzv_env(
        &["run", "--standalone", "--tee=1", &w, "ok"],
        &[("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "r${rank}| ")],
    );
    by_variable.exits_with(0, 30);
    assert!(
        by_variable.said("r0| START rank=0 "),
        "{}",
        by_variable.output()
    );
}

#[test]
fn log_dir_and_redirects_create_the_files_torchrun_creates() {
    let s = Scratch::new();
    // --log-dir alone: a directory per worker, no stream files (error.json only on failure).
    let logs = s.path("alone");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = s.standalone(&["--nproc-per-node=2", &logs_arg], "err");
    l.exits_with(0, 30);
    let run = run_dir(&logs);
    assert!(run.join("attempt_0/0").is_dir() && run.join("attempt_0/1").is_dir());
    assert_eq!(files_under(&run), Vec::<String>::new());
    assert!(
        l.said("START rank=1 "),
        "the console still shows everything"
    );

    // -r 0:1,1:2: local rank 0's stdout and local rank 1's stderr, nothing else.
    let logs = s.path("split");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = s.standalone(&["--nproc-per-node=2", "-r", "0:1,1:2", &logs_arg], "err");
    l.exits_with(0, 30);
    let run = run_dir(&logs);
    assert_eq!(
        files_under(&run),
        ["attempt_0/0/stdout.log", "attempt_0/1/stderr.log"]
    );
    assert!(!l.said("START rank=0 "), "rank 0's stdout went to its file");
    assert!(l.said("START rank=1 ") && !l.said("ERR from rank 1"));
    let err = std::fs::read_to_string(run.join("attempt_0/1/stderr.log")).unwrap();
    assert_eq!(err, "ERR from rank 1\n");
}

#[test]
fn virtual_local_rank_gives_each_worker_local_rank_0_and_its_own_device() {
    let s = Scratch::new();
    let w = s.worker();
    let mut l = rdzv_env(
        &[
            "run",
            "--standalone",
            "--nproc-per-node=2",
            "--virtual-local-rank",
            &w,
            "ok",
        ],
        &[("CUDA_VISIBLE_DEVICES", "5,7")],
    );
    let mut starts: Vec<_> = (0..2).map(|_| l.start(30)).collect();
    l.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    assert_eq!(
        (num(&starts[0], "local"), starts[0]["cuda"].as_str()),
        (0, "5")
    );
    assert_eq!(
        (num(&starts[1], "local"), starts[1]["cuda"].as_str()),
        (0, "7")
    );
    // Without the flag: local ranks as usual, the launcher's devices untouched.
    let mut plain = rdzv_env(
        &["run", "--standalone", "--nproc-per-node=2", &w, "ok"],
        &[("CUDA_VISIBLE_DEVICES", "5,7")],
    );
    let mut starts: Vec<_> = (0..2).map(|_| plain.start(30)).collect();
    plain.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    assert_eq!(
        (num(&starts[1], "local"), starts[1]["cuda"].as_str()),
        (1, "5,7")
    );
}

#[test]
fn signals_to_handle_adds_sigusr1_which_is_forwarded() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--signals_to_handle=SIGTERM,SIGUSR1"], "hold");
    let f = l.start(30);
    assert_eq!(f["sigs"], "SIGTERM,SIGUSR1");
    l.wait_line(10, |x| x.starts_with("CHILD "));
    l.signal(libc::SIGUSR1);
    l.exits_with(128 + libc::SIGUSR1, 30);
    assert!(l.said("GOT USR1"), "{}", l.output());
    // An unknown name is a usage error, said at once.
    let mut bad = s.standalone(&["--signals-to-handle=SIGTERM,SIGNOPE"], "ok");
    bad.exits_with(2, 10);
    assert!(bad.said("--signals-to-handle"), "{}", bad.output());
}

#[test]
fn accepted_only_flags_start_the_job_and_say_why_they_do_nothing() {
    let s = Scratch::new();
    let script = s.path("w.py");
    std::fs::write(&script, "import os\nprint('PY', os.environ['RANK'])\n").unwrap();
    let script_arg = script.display().to_string();
    let mut l = rdzv(&[
        "run",
        "--standalone",
        "--start-method=fork",
        "--start_method=forkserver",
        "--logs_specs=default",
        "--event-log-handler=console",
        "--no-python",
        "--run-path",
        &script_arg,
    ]);
    l.exits_with(0, 30);
    // --run-path wins over --no-python: the script ran under python3.
    assert!(l.lines_with("PY 0").any(|x| x == "PY 0"), "{}", l.output());
    assert!(
        l.said("--event-log-handler=console"),
        "no note on --event-log-handler: {}",
        l.output()
    );
    let mut bad = s.standalone(&["--start-method=thread"], "ok");
    bad.exits_with(2, 10);
    // An unknown LogsSpecs plugin fails as torchrun fails, naming the flag.
    let mut unknown = s.standalone(&["--logs-specs=custom"], "ok");
    unknown.exits_with(2, 10);
    assert!(
        unknown.said("--logs-specs: no LogsSpecs plugin \"custom\""),
        "{}",
        unknown.output()
    );
}

/// torch's LOGLEVEL, as torchrun's agent reads it: at DEBUG the agent's steps and torchrun's
/// "Rendezvous info" banner for a standalone job; at INFO the banner and settings, no steps;
/// by default neither. RDZV_LOG's bare level does the same, and on etcd also asks the
/// library for its records.
#[test]
fn loglevel_and_rdzv_log_show_the_agents_steps_and_torchruns_banner() {
    let s = Scratch::new();
    let w = s.worker();
    let standalone = |env: &[(&str, &str)]| {
        let mut l = rdzv_env(
            &["run", "--standalone", "--nproc-per-node=2", &w, "ok"],
            env,
        );
        l.exits_with(0, 30);
        l
    };
    let quiet = standalone(&[]);
    assert!(
        !quiet.said("Rendezvous info:") && !quiet.said("debug:"),
        "{}",
        quiet.output()
    );
    for env in [("LOGLEVEL", "DEBUG"), ("RDZV_LOG", "debug")] {
        let debug = standalone(&[env]);
        let banner = debug.line_with("--rdzv-backend=static --rdzv-endpoint=localhost:0");
        assert!(
            banner.contains("--rdzv-id=standalone-"),
            "{env:?}: {banner}"
        );
        assert!(
            debug.said("Rendezvous info:"),
            "{env:?}: {}",
            debug.output()
        );
        assert!(
            debug.said("  nproc_per_node   : 2"),
            "{env:?}: {}",
            debug.output()
        );
        for rank in 0..2 {
            let started = format!("debug: started worker rank {rank} (local rank {rank}): pid ");
            assert!(debug.said(&started), "{env:?}: {}", debug.output());
        }
        assert!(debug.said("debug: round 0: the group ended: every worker succeeded"));
    }
    let info = standalone(&[("LOGLEVEL", "INFO")]);
    assert!(info.said("Rendezvous info:"), "{}", info.output());
    assert!(!info.said("debug:"), "{}", info.output());
    // On etcd: the library's own records come too (the rendezvous's retries and waits).
    let etcd = Etcd::start();
    let url = etcd.url("loglevel", FAST);
    let mut l = rdzv_env(&["run", "--rdzv", &url, &w, "ok"], &[("LOGLEVEL", "DEBUG")]);
    l.exits_with(0, 60);
    assert!(
        l.said("debug rdzv::"),
        "no library debug record: {}",
        l.output()
    );
    assert!(
        !l.said("Rendezvous info:"),
        "a named rendezvous has no banner"
    );
}

/// `--numa-binding` on a made-up machine (`RDZV_SYSFS_ROOT`): two NUMA nodes, one of this
/// test's CPUs each, a GPU on each (and a network card). CUDA_VISIBLE_DEVICES=1,0 makes local
/// rank 0 use the second GPU in PCI order. Each worker must run on its GPU's node's CPU. A
/// machine without a GPU fails the launch, as torchrun does.
#[test]
fn numa_binding_runs_each_worker_on_the_cpus_of_its_gpus_node() {
    let s = Scratch::new();
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) },
        0
    );
    let mine: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    // Two CPUs on CI's machines; with one, both nodes have it.
    let (cpu0, cpu1) = (mine[0], *mine.last().unwrap());
    let root = s.path("sysfs");
    let write = |path: &str, text: &str| {
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
    };
    write("sys/devices/system/node/possible", "0-1\n");
    write(
        "sys/devices/system/node/node0/cpulist",
        &format!("{cpu0}\n"),
    );
    write(
        "sys/devices/system/node/node1/cpulist",
        &format!("{cpu1}\n"),
    );
    for (dev, vendor, class, node) in [
        ("0000:05:00.0", "0x15b3", "0x020000", "0"), // a network card
        ("0000:17:00.0", "0x10de", "0x030200", "0"),
        ("0000:c3:00.0", "0x10de", "0x030200", "1"),
    ] {
        let base = format!("sys/bus/pci/devices/{dev}");
        write(&format!("{base}/vendor"), vendor);
        write(&format!("{base}/class"), class);
        write(&format!("{base}/numa_node"), node);
    }
    let w = s.worker();
    let sysfs = root.to_str().unwrap();
    let args = [
        "run",
        "--standalone",
        "--nproc-per-node=2",
        "--numa-binding=node",
        &w,
        "cpus",
    ];
    let env = [("RDZV_SYSFS_ROOT", sysfs), ("CUDA_VISIBLE_DEVICES", "1,0")];
    let mut l = rdzv_env(&args, &env);
    l.exits_with(0, 30);
    for (local, cpu) in [(0, cpu1), (1, cpu0)] {
        let line = format!("CPUS local={local} allowed={cpu} order=PCI_BUS_ID");
        assert!(
            l.lines_with(&line).any(|x| x == line),
            "no {line:?}: {}",
            l.output()
        );
    }
    assert!(
        l.said(&format!(
            "--numa-binding=node: local rank 0 on CPUs {cpu1}, local rank 1 on CPUs {cpu0}"
        )),
        "{}",
        l.output()
    );

    // No GPU: the launch fails with the reason, before any worker starts.
    let empty = s.path("no-gpu");
    std::fs::create_dir_all(&empty).unwrap();
    let env = [("RDZV_SYSFS_ROOT", empty.to_str().unwrap())];
    let mut none = rdzv_env(&args, &env);
    none.exits_with(1, 10);
    assert!(
        none.said("--numa-binding=node: no GPU on this machine's PCI bus"),
        "{}",
        none.output()
    );
    assert!(!none.said("CPUS local="), "{}", none.output());
}

#[test]
fn print_completion_prints_a_script_for_each_shell() {
    for (shell, says) in [
        ("bash", "rdzv"),
        ("zsh", "#compdef rdzv"),
        ("tcsh", "complete rdzv"),
    ] {
        let (code, out, err) = op(&["run", "--print-completion", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(
            out.contains(says) && out.contains("nproc-per-node"),
            "{shell}: {out}"
        );
    }
    let (code, _, err) = op(&["run", "--print-completion", "fish"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn static_rendezvous_with_node_rank_and_master_address_forms_one_world() {
    let s = Scratch::new();
    let port = common::free_port().to_string();
    let w = s.worker();
    let mut nodes: Vec<Launcher> = (0..2)
        .map(|rank| {
            let node_rank = format!("--node-rank={rank}");
            rdzv(&[
                "run",
                "--nnodes=2",
                &node_rank,
                "--master_addr=127.0.0.1",
                "--master-port",
                &port,
                "--nproc-per-node=2",
                &w,
                "ok",
            ])
        })
        .collect();
    for (node_rank, node) in nodes.iter_mut().enumerate() {
        let mut starts: Vec<_> = (0..2).map(|_| node.start(30)).collect();
        node.exits_with(0, 30);
        starts.sort_by_key(|f| num(f, "rank"));
        for (local, f) in starts.iter().enumerate() {
            assert_eq!(num(f, "rank"), node_rank as u32 * 2 + local as u32, "{f:?}");
            assert_eq!(num(f, "world"), 4);
            assert_eq!(num(f, "group"), node_rank as u32);
            assert_eq!(num(f, "groups"), 2);
            assert_eq!(f["master"], format!("127.0.0.1:{port}"));
        }
    }
    // A static job needs a fixed node count, and a node rank inside it.
    let mut bad = rdzv(&["run", "--nnodes=1:2", "--node-rank=0", &w, "ok"]);
    bad.exits_with(2, 10);
    let mut bad = rdzv(&["run", "--nnodes=2", "--node-rank=2", &w, "ok"]);
    bad.exits_with(2, 10);
}

#[test]
fn the_failure_report_names_the_root_cause_and_copies_its_error_file() {
    let s = Scratch::new();
    let own = s.path("scheduler/error.json");
    let w = s.worker();
    let mut l = rdzv_env(
        &["run", "--standalone", "--nproc-per-node=2", &w, "errfile1"],
        &[("TORCHELASTIC_ERROR_FILE", own.to_str().unwrap())],
    );
    l.exits_with(1, 60);
    for line in [
        "worker.sh FAILED",
        "<NO_OTHER_FAILURES>",
        "Root Cause (first observed failure):",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 7 (pid: ",
        "  traceback : Traceback (most recent call last):",
        "    ValueError: boom",
        "stopped by the launcher after the failure: rank 0",
    ] {
        assert!(l.said(line), "no {line:?} in:\n{}", l.output());
    }
    // torchrun's block is unprefixed, line for line, as tools parse it.
    let out = l.output();
    let block: Vec<&str> = out
        .lines()
        .skip_while(|x| !x.ends_with("/worker.sh FAILED"))
        .skip(1)
        .take(6)
        .collect();
    let thin = "-".repeat(60);
    assert_eq!(
        block,
        [
            &thin,
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            &thin,
            "Root Cause (first observed failure):",
            "[0]:",
        ],
        "{out}"
    );
    // torchrun's host is socket.getfqdn().
    let fqdn = Command::new("python3")
        .args(["-c", "import socket; print(socket.getfqdn())"])
        .output()
        .unwrap();
    let fqdn = String::from_utf8(fqdn.stdout).unwrap();
    let host = l.line_with("  host      : ");
    assert_eq!(host, format!("  host      : {}", fqdn.trim()));
    let time = l.line_with("  time      : ");
    assert!(time.contains('_') && time.contains('-'), "{time}");
    let copied: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
    assert_eq!(copied["message"]["message"], "ValueError: boom", "{copied}");
    assert_eq!(copied["message"]["errorCode"], 7, "{copied}");

    // A worker that wrote no error file: the launcher writes one of its own there.
    let _ = std::fs::remove_file(&own);
    let mut l = rdzv_env(
        &["run", "--standalone", &w, "fail", "3"],
        &[("TORCHELASTIC_ERROR_FILE", own.to_str().unwrap())],
    );
    l.exits_with(1, 60);
    assert!(l.said("  error_file: <N/A>"), "{}", l.output());
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
    assert_eq!(written["message"]["errorCode"], 3, "{written}");
    // torchrun's exitcode line: the signal's name after the pid, a space before it either way.
    assert!(
        l.lines_with("  exitcode  : 3 (pid: ")
            .any(|x| x.ends_with(") ")),
        "{}",
        l.output()
    );
    let mut l = rdzv(&["run", "--standalone", &w, "signal", "SEGV"]);
    l.exits_with(1, 60);
    let line = l.line_with("  exitcode  : -11 (pid: ");
    assert!(line.ends_with(")  (SIGSEGV)"), "{line:?}");
    assert!(
        l.said("  traceback : Signal 11 (SIGSEGV) received by PID"),
        "{}",
        l.output()
    );
}

#[test]
fn a_refused_etcd_is_waited_for_and_a_typo_fails_fast() {
    let mut etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("late", &format!("join_timeout=120&{FAST}"));
    // Nothing listens on the port now: the launcher waits, saying for what.
    etcd.kill();
    let mut l = s.node(&url, &[], "ok");
    let waiting = l.wait_line(30, |x| x.contains("waiting for etcd at"));
    assert!(waiting.contains(&etcd.endpoint()), "{waiting}");
    etcd.restart();
    l.start(60);
    l.exits_with(0, 60);
    assert!(l.said("connected to etcd at"), "{}", l.output());

    // Still refused at join_timeout: the launcher gives up, naming what refused.
    let mut given_up = s.node("etcd://127.0.0.1:1/x?join_timeout=1", &[], "ok");
    given_up.exits_with(1, 30);
    let error = given_up.line_with("rdzv: error:");
    assert!(
        error.contains("connection refused at 127.0.0.1:1"),
        "{error}"
    );
    // Nothing answers there at all: waited for the same way, bounded by join_timeout.
    let mut silent = s.node(
        "etcd://10.255.255.1:2379/x?connect_timeout=1&join_timeout=2",
        &[],
        "ok",
    );
    silent.exits_with(1, 30);
    assert!(
        silent.said("waiting for etcd at 10.255.255.1:2379"),
        "{}",
        silent.output()
    );

    // A host name that does not resolve is a typo: an error at once, not a wait.
    let w = s.worker();
    let mut typo = rdzv(&[
        "run",
        "--nnodes=1:2",
        "--rdzv-endpoint=no-such-host.invalid:2379",
        &w,
        "ok",
    ]);
    typo.exits_with(1, 20);
    assert!(
        typo.said("cannot resolve the host name"),
        "{}",
        typo.output()
    );
    assert!(!typo.said("waiting for etcd"), "{}", typo.output());
    // An endpoint that does not parse is a usage error.
    let mut bad = rdzv(&[
        "run",
        "--nnodes=1:2",
        "--rdzv-endpoint=host:port:x",
        &w,
        "ok",
    ]);
    bad.exits_with(2, 10);
}

#[test]
fn c10d_backend_serves_the_rendezvous_from_the_endpoints_node() {
    let s = Scratch::new();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port());
    let w = s.worker();
    let id = unique_run_id("c10d");
    let id_arg = format!("--rdzv-id={id}");
    let args = [
        "run",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        &endpoint,
        &id_arg,
        "--rdzv-conf=last_call_timeout=1,lease_ttl=2",
        &w,
        "ok",
    ];
    // Started one after the other: the first serves (and joins once its etcd answers), the
    // second finds the port served.
    let mut first = rdzv(&args);
    first.wait_line(30, |x| x.contains("serving the rendezvous on port"));
    first.wait_line(30, |x| x.contains("joining run"));
    let second = rdzv(&args);
    let mut nodes = [first, second];
    let starts = formed(&mut nodes, 2, 60);
    let mut ranks: Vec<u32> = starts.iter().map(|f| num(f, "rank")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1]);
    let [mut first, mut second] = nodes;
    second.exits_with(0, 60);
    first.exits_with(0, 60);
    assert!(
        second.said("served on this machine already"),
        "{}",
        second.output()
    );
    // The embedded etcd went with its launcher: the port is free again.
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    assert!(std::net::TcpListener::bind(("0.0.0.0", port)).is_ok());

    // Without an etcd on PATH: one line saying what to run instead.
    let empty = s.path("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let mut none = rdzv_env(&args, &[("PATH", empty.to_str().unwrap())]);
    none.exits_with(1, 10);
    assert!(
        none.said("no `etcd` is beside this command or on PATH"),
        "{}",
        none.output()
    );
}

/// torchrun 2.15's c10d backend hangs both nodes when one arrives after the first round
/// formed: its old rank 0 does not publish MASTER_ADDR/PORT in the new round's store
/// (`docs/BENCHMARKS.md`). `rdzv run`'s c10d is the ordinary rendezvous on an embedded etcd,
/// so the job grows.
#[test]
fn c10d_backend_admits_a_node_that_arrives_after_the_first_round() {
    let s = Scratch::new();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port());
    let w = s.worker();
    let id_arg = format!("--rdzv-id={}", unique_run_id("c10d-grow"));
    let args = [
        "run",
        "--nnodes=1:2",
        "--rdzv-backend=c10d",
        &endpoint,
        &id_arg,
        "--rdzv-conf=last_call_timeout=1,lease_ttl=2",
        &w,
        "hold",
    ];
    let mut first = rdzv(&args);
    assert_eq!(num(&first.start(60), "world"), 1);
    let second = rdzv(&args);
    let mut nodes = [first, second];
    formed(&mut nodes, 2, 60);
    // The node that joined leaves first, then the one serving the rendezvous.
    for node in nodes.iter_mut().rev() {
        node.terminate();
    }
}

#[test]
fn status_takes_runs_flags_and_says_what_runs() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let id = unique_run_id("status-flags");
    let url = format!("etcd://{}/{id}?{FAST}", etcd.endpoint());
    let mut l = s.node(&url, &[], "hold");
    l.start(60);
    let by_url = op_ok(&["status", &url]);
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id_arg = format!("--rdzv_id={id}");
    let by_flags = op_ok(&[
        "status",
        &endpoint,
        &id_arg,
        "--rdzv-conf=last_call_timeout=1",
    ]);
    assert_eq!(by_url, by_flags);
    assert!(by_url.contains(" running; "), "{by_url}");
    assert!(!by_url.contains("open for joining"), "{by_url}");
    op_fails(&["status"], 2);
    l.terminate();
}

/// `drain`, `close` and `purge` name the run as `rdzv run` does too, by --rdzv-endpoint,
/// --rdzv-id and --rdzv-conf instead of a URL (as `status` does); not by both at once.
#[test]
fn close_purge_and_drain_take_runs_flags_too() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let id = unique_run_id("ops-flags");
    let url = format!("etcd://{}/{id}?{FAST}", etcd.endpoint());
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id_arg = format!("--rdzv_id={id}");
    let run = [
        endpoint.as_str(),
        id_arg.as_str(),
        "--rdzv-conf=lease_ttl=2",
    ];
    let op_on_run = |command: &[&str], last: &[&str]| op_ok(&[command, &run, last].concat());

    let mut drained = s.node(&url, &[], "hold");
    drained.start(60);
    let node_id = node_id(&mut drained);
    let out = op_on_run(&["drain", "--reason", "maintenance"], &[&node_id]);
    assert!(out.contains("drained"), "{out}");
    drained.exits_with(0, 30);
    assert!(
        drained.said("this node was drained"),
        "{}",
        drained.output()
    );

    let mut closed = s.node(&url, &[], "hold");
    closed.start(60);
    let out = op_on_run(&["close"], &[]);
    assert!(out.contains("closed"), "{out}");
    closed.exits_with(0, 30);
    assert!(closed.said("the run was closed"), "{}", closed.output());

    let out = op_on_run(&["purge"], &[]);
    assert!(out.contains(&format!("run {id:?} purged")), "{out}");
    assert_eq!(status_json(&url)["exists"], false);
    op_fails(&["close", &endpoint, &url], 2);
}

#[test]
fn status_watch_shows_a_sigkilled_node_as_lost() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("watch-kill", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let mut watch = rdzv(&["status", "--watch", &url]);
    watch.wait_line(10, |l| l.contains("absent"));
    let mut a = s.node(&url, &[], "hold");
    let mut b = s.node(&url, &[], "hold");
    a.start(30);
    b.start(30);
    watch.wait_line(10, |l| l.contains("round 0 sealed: 2 member(s)"));
    // SIGKILL: nothing is released; the node's lease expires (lease_ttl 2 s).
    b.crash();
    let lost = watch.wait_line(20, |l| l.contains(") lost"));
    assert!(lost.contains("rank "), "{lost}");
    a.terminate();
}

/// torch's `is_host` decides which node serves the c10d rendezvous, whatever the endpoint's
/// address (a Kubernetes Service name resolves to no address of the pod behind it): the node
/// told `is_host=false` waits for the endpoint although its address is local, and the one told
/// `is_host=true` serves it; the job forms.
#[test]
fn c10d_is_host_decides_which_node_serves() {
    let s = Scratch::new();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port());
    let w = s.worker();
    let id_arg = format!("--rdzv-id={}", unique_run_id("c10d-is-host"));
    let args = |is_host: &str| {
        [
            "run".to_string(),
            "--nnodes=2".into(),
            "--rdzv-backend=c10d".into(),
            endpoint.clone(),
            id_arg.clone(),
            format!(
                "--rdzv-conf=last_call_timeout=1,lease_ttl=2,is_host={is_host},read_timeout=60"
            ),
            w.clone(),
            "ok".into(),
        ]
    };
    let client_args = args("false");
    let mut client = rdzv(&client_args.iter().map(String::as_str).collect::<Vec<_>>());
    client.wait_line(30, |x| x.contains("waiting for etcd"));
    let host_args = args("true");
    let host = rdzv(&host_args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut nodes = [client, host];
    formed(&mut nodes, 2, 60);
    let [mut client, mut host] = nodes;
    client.exits_with(0, 60);
    host.exits_with(0, 60);
    assert!(
        !client.said("serving the rendezvous"),
        "{}",
        client.output()
    );
    assert!(host.said("serving the rendezvous"), "{}", host.output());
    assert!(
        host.said("read_timeout=60 is for torch's TCPStore"),
        "{}",
        host.output()
    );
}

/// The embedded etcd of `--rdzv-backend=c10d` dies with its launcher, even a SIGKILLed one
/// (PR_SET_PDEATHSIG): nothing keeps serving the port of a job that is gone.
#[test]
fn c10d_embedded_etcd_dies_with_a_sigkilled_launcher() {
    let s = Scratch::new();
    let port = common::free_port();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{port}");
    let id_arg = format!("--rdzv-id={}", unique_run_id("c10d-kill"));
    let w = s.worker();
    let mut host = rdzv(&[
        "run",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        &endpoint,
        &id_arg,
        &w,
        "ok",
    ]);
    let serving = host.wait_line(30, |x| x.contains("serving the rendezvous on port"));
    let etcd_pid: i32 = serving
        .split("pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no etcd pid in {serving:?}"));
    host.crash();
    wait_gone(etcd_pid, 10);
    assert!(
        std::net::TcpListener::bind(("0.0.0.0", port)).is_ok(),
        "port {port} is still served"
    );
}

/// The first directory of PATH that has `tool`.
fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// `--role`: ROLE_NAME, and role ranks counted over the nodes of the same role only (a prefix
/// sum in node rank order), as torchelastic assigns them; global ranks stay dense.
#[test]
fn roles_get_role_ranks_across_nodes() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let url = etcd.url("roles", &format!("min_nodes=3&max_nodes=3&{FAST}"));
    let node = |role: &str, nproc: &str| {
        rdzv(&[
            "run",
            "--rdzv",
            &url,
            role,
            nproc,
            "--local-addr=127.0.0.1",
            &w,
            "ok",
        ])
    };
    let mut nodes = [
        node("--role=trainer", "--nproc-per-node=2"),
        node("--role=evaluator", "--nproc-per-node=1"),
        node("--role=trainer", "--nproc-per-node=1"),
    ];
    let mut starts = Vec::new();
    for (n, count) in nodes.iter_mut().zip([2, 1, 1]) {
        for _ in 0..count {
            starts.push(n.start(60));
        }
    }
    for n in nodes.iter_mut() {
        n.exits_with(0, 60);
    }
    let mut ranks: Vec<u32> = starts.iter().map(|f| num(f, "rank")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3]);
    let of = |role: &str| -> Vec<&Fields> { starts.iter().filter(|f| f["role"] == role).collect() };
    let (trainers, evaluators) = (of("trainer"), of("evaluator"));
    assert_eq!((trainers.len(), evaluators.len()), (3, 1), "{starts:?}");
    let mut role_ranks: Vec<u32> = trainers.iter().map(|f| num(f, "role_rank")).collect();
    role_ranks.sort();
    assert_eq!(role_ranks, [0, 1, 2], "trainers count among trainers only");
    assert!(trainers.iter().all(|f| num(f, "role_world") == 3));
    assert_eq!(num(evaluators[0], "role_rank"), 0);
    assert_eq!(num(evaluators[0], "role_world"), 1);
    // Role ranks follow node ranks, as global ranks do.
    let mut by_rank = trainers.clone();
    by_rank.sort_by_key(|f| num(f, "rank"));
    let in_order: Vec<u32> = by_rank.iter().map(|f| num(f, "role_rank")).collect();
    assert_eq!(in_order, [0, 1, 2]);
}

/// `--monitor-interval` is how often a running node checks the membership: with 3 s, a node
/// that arrives just after the group started is seen at the next check, 3 s after the first
/// (never sooner; the default 0.1 s would see it within a fraction of a second), and no later
/// than the interval and a margin for a loaded machine.
#[test]
fn the_monitor_interval_paces_the_membership_checks() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("monitor", &format!("min_nodes=1&max_nodes=2&{FAST}"));
    let mut a = s.node(&url, &["--monitor_interval=3"], "hold");
    a.start(60);
    // The first check ran as the group started (just before its START line); the next is due
    // 3 s after it.
    let started = Instant::now();
    let mut b = s.node(&url, &[], "hold");
    b.wait_line(30, |l| l.contains("joining run"));
    a.wait_line(30, |l| l.contains("node(s) waiting to join"));
    let seen = started.elapsed();
    assert!(
        seen >= Duration::from_secs(2) && seen < Duration::from_secs(3 + 3),
        "the arrival was seen {seen:?} after the group started (interval 3 s)"
    );
    for n in [&mut a, &mut b] {
        n.terminate();
    }
}

/// `--no-python` runs PROGRAM as it is, even a `.py` file: here an executable `.py` that is
/// a shell script. Without the flag it runs under PYTHON_EXEC (`echo` here, which prints what
/// it was given).
#[test]
fn no_python_runs_a_py_file_as_it_is() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    let script = s.path("tool.py");
    std::fs::write(&script, "#!/bin/sh\necho \"DIRECT $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = script.to_str().unwrap();
    let echo = [("PYTHON_EXEC", "echo")];
    let mut direct = rdzv_env(&["run", "--standalone", "--no-python", path, "x"], &echo);
    direct.exits_with(0, 30);
    assert!(direct.said("DIRECT x"), "{}", direct.output());
    let mut python = rdzv_env(&["run", "--standalone", path, "x"], &echo);
    python.exits_with(0, 30);
    assert!(
        python.said(&format!("-u {path} x")) && !python.said("DIRECT"),
        "{}",
        python.output()
    );
}

/// `--rdzv-conf` values take effect: `join_timeout=2` ends a node that waits alone for a
/// second one after 2 s (not the default 600), with a timeout error.
#[test]
fn rdzv_conf_values_take_effect() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id = format!("--rdzv-id={}", unique_run_id("conf"));
    let started = Instant::now();
    let mut alone = rdzv(&[
        "run",
        "--nnodes=2",
        &endpoint,
        &id,
        "--rdzv-conf=join_timeout=2,last_call_timeout=1",
        &w,
        "ok",
    ]);
    alone.exits_with(1, 30);
    let took = started.elapsed();
    // 2 s, and a margin for the launcher's start and a loaded machine.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(2 + 5),
        "join_timeout=2 ended the node after {took:?}:\n{}",
        alone.output()
    );
    assert!(alone.said("2 s"), "{}", alone.output());
}

/// `${hostname}` in `--log-line-prefix-template` is the machine's host name, as in torchrun.
#[test]
fn the_prefix_template_knows_the_host_name() {
    let s = Scratch::new();
    let w = s.worker();
    let mut l = rdzv(&[
        "run",
        "--standalone",
        "--tee=3",
        "--log-line-prefix-template=<${hostname}|${rank}>",
        &w,
        "ok",
    ]);
    l.exits_with(0, 30);
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most len bytes into the buffer.
    assert_eq!(
        unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) },
        0
    );
    let host = std::ffi::CStr::from_bytes_until_nul(&name)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        l.said(&format!("<{host}|0>START rank=0 ")),
        "{}",
        l.output()
    );
}

/// `--nproc-per-node=gpu`, `auto` and `xpu` count what a made-up machine has
/// (RDZV_SYSFS_ROOT): two NVIDIA GPUs with their device nodes and an AMD one make three GPU
/// workers (`CUDA_VISIBLE_DEVICES` narrows them), `auto` takes the GPUs, and `xpu` counts the
/// Intel card Level Zero drives, not the integrated GPU; a machine without one is told so.
#[test]
fn nproc_per_node_counts_the_machines_accelerators() {
    let s = Scratch::new();
    let w = s.worker();
    let made_up = |name: &str, devices: &[(&str, &str, Option<&str>)], nvidia_nodes: usize| {
        let root = s.path(name);
        for (dev, vendor, driver) in devices {
            let base = root.join("sys/bus/pci/devices").join(dev);
            std::fs::create_dir_all(&base).unwrap();
            std::fs::write(base.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(base.join("class"), "0x030000\n").unwrap();
            if let Some(driver) = driver {
                let target = root.join("sys/bus/pci/drivers").join(driver);
                std::fs::create_dir_all(&target).unwrap();
                std::os::unix::fs::symlink(&target, base.join("driver")).unwrap();
            }
        }
        std::fs::create_dir_all(root.join("dev")).unwrap();
        for i in 0..nvidia_nodes {
            std::fs::write(root.join(format!("dev/nvidia{i}")), "").unwrap();
        }
        std::fs::write(root.join("dev/nvidiactl"), "").unwrap();
        root.display().to_string()
    };
    let gpus = made_up(
        "gpus",
        &[
            ("0000:00:02.0", "0x8086", Some("i915")), // integrated graphics
            ("0000:17:00.0", "0x10de", None),
            ("0000:65:00.0", "0x10de", None),
            ("0000:c3:00.0", "0x1002", None),
        ],
        2,
    );
    let xpu = made_up(
        "xpu",
        &[
            ("0000:00:02.0", "0x8086", Some("i915")),
            ("0000:3a:00.0", "0x8086", Some("xe")),
        ],
        0,
    );
    // The workers a standalone launcher starts on the machine at `root`, or what it said when
    // it failed.
    let workers = |nproc: &str, root: &str, extra: &[(&str, &str)]| -> Result<usize, String> {
        let env = [&[("RDZV_SYSFS_ROOT", root)], extra].concat();
        let mut l = rdzv_env(&["run", "--standalone", nproc, &w, "ok"], &env);
        match l.exit(30).code() {
            Some(0) => Ok(l.lines_with("START rank=").count()),
            _ => Err(l.output()),
        }
    };
    assert_eq!(workers("--nproc-per-node=gpu", &gpus, &[]), Ok(3));
    assert_eq!(workers("--nproc-per-node=auto", &gpus, &[]), Ok(3));
    let one = [("CUDA_VISIBLE_DEVICES", "1")];
    assert_eq!(workers("--nproc-per-node=gpu", &gpus, &one), Ok(1));
    assert_eq!(workers("--nproc-per-node=xpu", &xpu, &[]), Ok(1));
    let none = workers("--nproc-per-node=xpu", &gpus, &[]).unwrap_err();
    assert!(none.to_lowercase().contains("xpu"), "{none}");
}
