//! `rdzv run` end to end: real launcher processes on a real etcd, with small shell workers
//! that print their environment (the launcher forwards it as `[rankN]:` lines, which the
//! tests read through pipes). Every wait is bounded and waits on an event: a line on a pipe,
//! a process exit (pidfd), an etcd watch.

mod common;

use common::Etcd;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RDZV: &str = env!("CARGO_BIN_EXE_rdzv");

/// The test worker. `MODE` selects what it does after printing its environment.
const WORKER: &str = r#"#!/bin/sh
echo "START rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE group=$GROUP_RANK groups=$GROUP_WORLD_SIZE lws=$LOCAL_WORLD_SIZE role=$ROLE_NAME role_rank=$ROLE_RANK role_world=$ROLE_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT restart=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS run=$TORCHELASTIC_RUN_ID agent_store=$TORCHELASTIC_USE_AGENT_STORE nccl=$TORCH_NCCL_ASYNC_ERROR_HANDLING omp=${OMP_NUM_THREADS:-unset} errfile=$TORCHELASTIC_ERROR_FILE pid=$$"
case "$1" in
  ok) exit 0 ;;
  hold)
    # Keeps a child of its own, to show that what a worker started is stopped too.
    trap 'echo "GOT TERM"; exit 0' TERM
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
  fail-once)
    [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 1
    exit 0 ;;
  errfile)
    printf '{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "tb", "timestamp": "%s"}}}' "$(date +%s)" > "$TORCHELASTIC_ERROR_FILE"
    exit 7 ;;
  fifo)
    read line < "$2"
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
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `rdzv` process; its stdout and stderr lines arrive on one channel. Killed on drop.
struct Launcher {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line received, for failure messages.
    seen: Vec<String>,
    /// Lines received while waiting for another one, not yet returned by a wait.
    passed: std::collections::VecDeque<String>,
    /// The launcher's TMPDIR (where it keeps logs without --log-dir), removed on drop.
    tmp: PathBuf,
}

impl Launcher {
    fn spawn(args: &[&str]) -> Launcher {
        Launcher::spawn_env(args, &[])
    }

    fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Launcher {
        let tmp = std::env::temp_dir().join(format!(
            "rdzv-launcher-tmp-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&tmp).unwrap();
        let mut cmd = Command::new(RDZV);
        cmd.args(args)
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // The caller's environment must not leak torchrun settings into the test.
        for (k, _) in std::env::vars() {
            if k.starts_with("PET_") && !env.iter().any(|(e, _)| *e == k) {
                cmd.env_remove(k);
            }
        }
        let mut child = common::spawn(cmd).unwrap();
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for stream in [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Launcher {
            child,
            lines,
            seen: Vec::new(),
            passed: std::collections::VecDeque::new(),
            tmp,
        }
    }

    /// The first line matching `pred` that no earlier wait returned, within `secs`. Lines
    /// passed over by earlier waits count too: the launcher's own lines (stderr) and its
    /// workers' (stdout) are read on two threads, so their order here is not the order written.
    fn wait_line(&mut self, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        if let Some(i) = self.passed.iter().position(|l| pred(l)) {
            return self.passed.remove(i).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                    self.passed.push_back(line);
                }
                Err(e) => panic!(
                    "no matching line within {secs} s ({e}); the launcher said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The fields of the next START line of a worker.
    fn start(&mut self, secs: u64) -> HashMap<String, String> {
        fields(&self.wait_line(secs, |l| l.contains("]:START ")))
    }

    /// Waits for the launcher to exit (its output closed), within `secs`.
    fn exit(&mut self, secs: u64) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    self.passed.push_back(line);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "launcher did not exit within {secs} s; it said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
        self.child.wait().unwrap()
    }

    fn said(&self, text: &str) -> bool {
        self.seen.iter().any(|l| l.contains(text))
    }

    fn output(&self) -> String {
        self.seen.join("\n")
    }

    fn signal(&self, sig: i32) {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// `key=value` fields of a worker's START line.
fn fields(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(f: &HashMap<String, String>, key: &str) -> u32 {
    f[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {f:?}"))
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

/// A pid from a worker's `CHILD pid` or `pid=` field.
fn child_pid(line: &str) -> i32 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn code(status: ExitStatus) -> i32 {
    status.code().unwrap_or(-1)
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

fn status_json(url: &str) -> serde_json::Value {
    let (code, out, err) = op(&["status", "--json", url]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// Fast rounds for tests: a short last call and lease.
const FAST: &str = "last_call_timeout=1&lease_ttl=2";

#[test]
fn launchers_with_different_worker_counts_form_one_job() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let run = format!("job-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let endpoint = etcd.endpoint();
    let args = |n: &'static str| {
        vec![
            "run".to_string(),
            "--nnodes=2".into(),
            format!("--nproc-per-node={n}"),
            format!("--rdzv-endpoint={endpoint}"),
            format!("--rdzv-id={run}"),
            "--local-addr=127.0.0.1".into(),
            w.clone(),
            "ok".into(),
        ]
    };
    let a_args = args("2");
    let b_args = args("1");
    let mut a = Launcher::spawn(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut b = Launcher::spawn(&b_args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut starts = vec![a.start(30), a.start(30), b.start(30)];
    assert_eq!(code(a.exit(30)), 0, "{}", a.output());
    assert_eq!(code(b.exit(30)), 0, "{}", b.output());
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
    let node_of = |f: &HashMap<String, String>| (num(f, "group"), num(f, "lws"), f["omp"].clone());
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
    let mut fast = Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "ok"]);
    let fifo_arg = fifo.display().to_string();
    let mut slow = Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "fifo", &fifo_arg]);
    fast.start(30);
    slow.start(30);
    fast.wait_line(30, |l| l.contains("exit barrier"));
    assert!(
        fast.running(),
        "a node whose workers finished waits for the others"
    );
    // Release the slow worker: opening the FIFO for writing unblocks its read.
    std::fs::write(&fifo, "go\n").unwrap();
    assert_eq!(code(slow.exit(30)), 0, "{}", slow.output());
    assert_eq!(code(fast.exit(30)), 0, "{}", fast.output());
    assert!(fast.said("every node finished"), "{}", fast.output());
    // A finished job leaves nothing in etcd.
    assert_eq!(status_json(&url)["exists"], false);
}

#[test]
fn a_node_that_arrives_grows_the_world_without_spending_restarts() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("grow", &format!("min_nodes=1&max_nodes=3&{FAST}"));
    let mut a = Launcher::spawn(&[
        "run",
        "--rdzv",
        &url,
        "--max-restarts=0",
        &s.worker(),
        "hold",
    ]);
    let first = a.start(30);
    assert_eq!(num(&first, "world"), 1);
    let mut b = Launcher::spawn(&[
        "run",
        "--rdzv",
        &url,
        "--max-restarts=0",
        &s.worker(),
        "hold",
    ]);
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
    assert_eq!(code(a.exit(30)), 128 + libc::SIGTERM);
    assert_eq!(code(b.exit(30)), 128 + libc::SIGTERM);
}

#[test]
fn survivors_re_form_within_about_the_lease_ttl_after_a_node_is_killed() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("loss", &format!("min_nodes=2&max_nodes=3&{FAST}"));
    let mut nodes: Vec<Launcher> = (0..3)
        .map(|_| Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "hold"]))
        .collect();
    let mut pids = Vec::new();
    for n in nodes.iter_mut() {
        let f = n.start(30);
        assert_eq!(num(&f, "world"), 3);
        pids.push((num(&f, "rank"), f["pid"].parse::<i32>().unwrap()));
    }
    // Kill the node whose worker is rank 2, launcher and all, as a machine would die.
    let victim = pids.iter().position(|(rank, _)| *rank == 2).unwrap();
    let mut dead = nodes.remove(victim);
    let worker_pid = pids[victim].1;
    let killed = Instant::now();
    dead.signal(libc::SIGKILL);
    dead.exit(10);
    wait_gone(worker_pid, 10); // PR_SET_PDEATHSIG: no worker outlives its launcher
    for n in nodes.iter_mut() {
        let f = n.start(30);
        assert_eq!(num(&f, "world"), 2, "{}", n.output());
        assert_eq!(num(&f, "restart"), 0, "a lost node spends no restart");
    }
    let took = killed.elapsed();
    eprintln!(
        "survivors restarted {:.2} s after SIGKILL (lease_ttl 2 s, last call 1 s)",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(12), "took {took:?}");
    for mut n in nodes {
        n.signal(libc::SIGTERM);
        assert_eq!(code(n.exit(30)), 128 + libc::SIGTERM);
    }
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
        // A join timeout far beyond the exit wait: a lost signal shows as a hang.
        let url = etcd.url(
            &format!("rejoin-signal-{trial}"),
            &format!("min_nodes=2&max_nodes=2&join_timeout=300&{FAST}"),
        );
        let spawn = || Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "hold"]);
        let (mut a, mut b) = (spawn(), spawn());
        a.start(30);
        b.start(30);
        a.signal(libc::SIGTERM);
        assert_eq!(code(a.exit(30)), 128 + libc::SIGTERM);
        // b's worker says this as b stops it to re-form without a: b is about to rejoin.
        b.wait_line(30, |l| l.contains("GOT TERM"));
        b.signal(libc::SIGTERM);
        assert_eq!(
            code(b.exit(30)),
            128 + libc::SIGTERM,
            "trial {trial}: {}",
            b.output()
        );
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
    let mut nodes: Vec<Launcher> = (0..3)
        .map(|_| {
            Launcher::spawn(&[
                "run",
                "--rdzv",
                &url,
                "--max-restarts=0",
                &s.worker(),
                "hold",
            ])
        })
        .collect();
    let mut ranks = Vec::new();
    for n in nodes.iter_mut() {
        let f = n.start(90);
        assert_eq!(num(&f, "world"), 3);
        ranks.push(num(&f, "rank"));
    }
    // The node running rank 1, by the id its launcher printed when it joined.
    let victim = ranks.iter().position(|r| *r == 1).unwrap();
    let joined = nodes[victim].wait_line(5, |l| l.contains("as node "));
    let node_id = joined
        .split("as node ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_string();
    let (c, out, err) = op(&["drain", "--reason", "scale down", &url, &node_id]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("drained"), "{out}");
    let mut drained = nodes.remove(victim);
    assert_eq!(code(drained.exit(30)), 0, "{}", drained.output());
    assert!(
        drained.said("GOT TERM"),
        "its workers were stopped gracefully"
    );
    assert!(drained.said("drained"), "{}", drained.output());
    for n in nodes.iter_mut() {
        let f = n.start(30);
        assert_eq!(num(&f, "world"), 2, "{}", n.output());
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
    let (c, _, err) = op(&["drain", &url, "0000000000000000"]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("0000000000000000"), "{err}");
    for mut n in nodes {
        n.signal(libc::SIGTERM);
        assert_eq!(code(n.exit(30)), 128 + libc::SIGTERM);
    }
}

#[test]
fn a_worker_that_always_fails_spends_the_budget_and_closes_the_run() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("budget", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let mut healthy = Launcher::spawn(&[
        "run",
        "--rdzv",
        &url,
        "--max-restarts=2",
        &s.worker(),
        "hold",
    ]);
    let mut failing = Launcher::spawn(&[
        "run",
        "--rdzv",
        &url,
        "--max-restarts=2",
        &s.worker(),
        "errfile",
    ]);
    let mut restarts = Vec::new();
    for _ in 0..3 {
        restarts.push(num(&failing.start(60), "restart"));
    }
    assert_eq!(restarts, [0, 1, 2]);
    assert_eq!(code(failing.exit(60)), 1, "{}", failing.output());
    let out = failing.output();
    assert!(out.contains("restart budget spent (2 of 2"), "{out}");
    let report = failing
        .seen
        .iter()
        .find(|l| l.contains("first failure"))
        .expect("a report");
    assert!(report.contains("exit code 7"), "{report}");
    let errfile = failing
        .seen
        .iter()
        .find(|l| l.contains("error file"))
        .expect("the error file");
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
    // spent), then saw the run closed and ended its workers gracefully.
    assert_eq!(code(healthy.exit(30)), 0, "{}", healthy.output());
    assert!(healthy.said("GOT TERM"));
    assert!(healthy.said("the run was closed"));
    assert_eq!(status_json(&url)["closed"], true);
}

#[test]
fn a_worker_that_fails_once_is_restarted_and_the_job_succeeds() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("once", FAST);
    let mut l = Launcher::spawn(&[
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--max-restarts=1",
        &s.worker(),
        "fail-once",
    ]);
    assert_eq!(code(l.exit(60)), 0, "{}", l.output());
    assert!(l.said("restarting the worker group (restart 1 of 1)"));
    // The first group may be stopped before its second worker prints anything; the restarted
    // group runs to its end.
    let second = l
        .seen
        .iter()
        .filter(|x| x.contains("]:START ") && x.contains("restart=1"));
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
    let mut l = Launcher::spawn(&[
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        &s.worker(),
        "hold",
    ]);
    // Two workers, each with a child: their pids, in whatever order the lines arrive.
    let pids: Vec<i32> = (0..4)
        .map(|_| {
            let line = l.wait_line(30, |x| x.contains("]:START ") || x.contains("]:CHILD "));
            match line.contains("]:CHILD ") {
                true => child_pid(&line),
                false => fields(&line)["pid"].parse().unwrap(),
            }
        })
        .collect();
    l.signal(libc::SIGTERM);
    assert_eq!(code(l.exit(30)), 128 + libc::SIGTERM, "{}", l.output());
    assert_eq!(
        l.seen.iter().filter(|x| x.contains("GOT TERM")).count(),
        2,
        "{}",
        l.output()
    );
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
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--shutdown-timeout=1",
        &s.worker(),
        "stubborn",
    ]);
    let pid = l.start(30)["pid"].parse::<i32>().unwrap();
    let child = child_pid(&l.wait_line(10, |x| x.contains("]:CHILD ")));
    l.signal(libc::SIGTERM);
    assert_eq!(code(l.exit(30)), 128 + libc::SIGTERM, "{}", l.output());
    assert!(l.said("SIGKILL"), "{}", l.output());
    wait_gone(pid, 10);
    wait_gone(child, 10);
}

#[test]
fn workers_die_with_a_launcher_killed_by_sigkill() {
    let s = Scratch::new();
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--nproc-per-node=2",
        &s.worker(),
        "hold",
    ]);
    let pids = [
        l.start(30)["pid"].parse::<i32>().unwrap(),
        l.start(30)["pid"].parse::<i32>().unwrap(),
    ];
    l.signal(libc::SIGKILL);
    l.exit(10);
    for pid in pids {
        wait_gone(pid, 10);
    }
}

#[test]
fn rdzv_close_ends_a_running_job() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("close", &format!("min_nodes=2&{FAST}"));
    let mut a = Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "hold"]);
    let mut b = Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "hold"]);
    a.start(30);
    b.start(30);
    let (c, out, err) = op(&["close", &url]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("closed"), "{out}");
    for n in [&mut a, &mut b] {
        assert_eq!(code(n.exit(30)), 0, "{}", n.output());
        assert!(n.said("GOT TERM") && n.said("the run was closed"));
    }
    // A job started later under the closed id fails clearly instead of ending quietly.
    let (c, _, err) = op(&["run", "--rdzv", &url, &s.worker(), "ok"]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("is closed"), "{err}");
}

#[test]
fn pet_variables_configure_the_launcher_and_flags_win() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let endpoint = etcd.endpoint();
    let run = format!("pet-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let mut l = Launcher::spawn_env(
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
    assert_eq!(code(l.exit(30)), 0, "{}", l.output());
    assert_eq!(
        num(&f, "lws"),
        2,
        "--nproc-per-node wins over PET_NPROC_PER_NODE"
    );
    assert_eq!(f["run"], run);
    assert_eq!(num(&f, "max"), 4);
    assert_eq!(f["role"], "trainer");
    assert!(l.said("rdzv speaks etcd's v3 API"), "{}", l.output());
    assert_eq!(l.seen.iter().filter(|x| x.contains("]:START ")).count(), 2);
}

#[test]
fn standalone_runs_without_etcd() {
    let s = Scratch::new();
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--nproc-per-node=3",
        &s.worker(),
        "ok",
    ]);
    let mut starts: Vec<_> = (0..3).map(|_| l.start(30)).collect();
    assert_eq!(code(l.exit(30)), 0, "{}", l.output());
    starts.sort_by_key(|f| num(f, "rank"));
    for (i, f) in starts.iter().enumerate() {
        assert_eq!(num(f, "rank"), i as u32);
        assert_eq!(num(f, "local"), i as u32);
        assert_eq!(num(f, "world"), 3);
        assert!(f["master"].starts_with("localhost:"), "{f:?}");
        assert_eq!(f["master"], starts[0]["master"]);
    }
    // Each worker line carries its rank.
    assert!(l.said("[rank2]:START rank=2"));
}

#[test]
fn log_dir_keeps_per_worker_files() {
    let s = Scratch::new();
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--nproc-per-node=2",
        "--redirects=1",
        &logs_arg,
        &s.worker(),
        "ok",
    ]);
    assert_eq!(code(l.exit(30)), 0, "{}", l.output());
    assert!(
        !l.said("]:START "),
        "--redirects=1 keeps stdout off the console"
    );
    let run_dir = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for rank in 0..2 {
        let out =
            std::fs::read_to_string(run_dir.join(format!("attempt_0/{rank}/stdout.log"))).unwrap();
        assert!(out.starts_with(&format!("START rank={rank} ")), "{out}");
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
            vec!["run", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", &w],
            2,
            "--rdzv-backend",
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
                "--rdzv-endpoint=127.0.0.1:1",
                "--rdzv-id=x",
                &w,
                "ok",
            ],
            1,
            "connection refused",
        ),
        (
            // Nothing answers there: bounded by connect_timeout, not a hang.
            vec![
                "run",
                "--rdzv-endpoint=10.255.255.1:2379",
                "--rdzv-conf=connect_timeout=1",
                &w,
                "ok",
            ],
            1,
            "10.255.255.1",
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
    let mut watch = Launcher::spawn(&["status", "--watch", &url]);
    watch.wait_line(10, |l| l.contains("absent"));
    let mut a = Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "hold"]);
    let mut b = Launcher::spawn(&["run", "--rdzv", &url, &s.worker(), "hold"]);
    a.start(30);
    b.start(30);
    watch.wait_line(10, |l| l.contains("round 0 sealed: 2 member(s)"));
    let (c, table, _) = op(&["status", &url]);
    assert_eq!(c, 0);
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
    let (c, _, err) = op(&["purge", &url]);
    assert_eq!(c, 1, "purge refuses while members are alive");
    assert!(err.contains("2 live node(s)"), "{err}");
    // Crash both nodes: nobody shuts down, yet the run's keys go with the nodes' leases and
    // the run's lease, which no node refreshes any more.
    a.signal(libc::SIGKILL);
    b.signal(libc::SIGKILL);
    a.exit(10);
    b.exit(10);
    watch.wait_line(15, |l| l.contains("run deleted from etcd"));
    let run = common::node::run_of(&url);
    common::wait_for_key_count(&etcd.endpoint(), &format!("/rdzv/{run}/"), |n| n == 0);
    assert_eq!(status_json(&url)["exists"], false);
    // What is left of a closed run is its marker, until `retention`: purge takes it now.
    let (c, _, err) = op(&["close", &url]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(status_json(&url)["closed"], true);
    let (c, out, err) = op(&["purge", &url]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("purged"), "{out}");
    assert_eq!(status_json(&url)["exists"], false);
}

#[test]
fn tee_and_the_local_ranks_filter_choose_what_the_console_shows() {
    let s = Scratch::new();
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--nproc-per-node=2",
        "--tee=3",
        "--local-ranks-filter=1",
        &logs_arg,
        &s.worker(),
        "ok",
    ]);
    assert_eq!(code(l.exit(30)), 0, "{}", l.output());
    assert!(
        l.said("[rank1]:START") && !l.said("[rank0]:START"),
        "{}",
        l.output()
    );
    let run_dir = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let out = std::fs::read_to_string(run_dir.join("attempt_0/0/stdout.log")).unwrap();
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
        "import os\nprint('PY', os.environ['RANK'], os.environ['WORLD_SIZE'])\n",
    )
    .unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let script_arg = script.display().to_string();
    let mut l = Launcher::spawn(&["run", "--standalone", "--nproc-per-node=cpu", &script_arg]);
    assert_eq!(code(l.exit(30)), 0, "{}", l.output());
    let lines = l.seen.iter().filter(|x| x.contains("]:PY ")).count();
    assert_eq!(lines, cpus, "{}", l.output());
    assert!(l.said(&format!("]:PY 0 {cpus}")));

    // --module runs python3 -m NAME.
    std::fs::write(
        s.path("wmod.py"),
        "import os\nprint('MOD', os.environ['LOCAL_RANK'])\n",
    )
    .unwrap();
    let path = s.dir.display().to_string();
    let mut m = Launcher::spawn_env(
        &["run", "--standalone", "--module", "wmod"],
        &[("PYTHONPATH", &path)],
    );
    assert_eq!(code(m.exit(30)), 0, "{}", m.output());
    assert!(m.said("[rank0]:MOD 0"), "{}", m.output());
}

#[test]
fn a_second_signal_cuts_the_grace_period_short() {
    let s = Scratch::new();
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--shutdown-timeout=600",
        &s.worker(),
        "stubborn",
    ]);
    let pid = l.start(30)["pid"].parse::<i32>().unwrap();
    l.wait_line(10, |x| x.contains("]:CHILD "));
    l.signal(libc::SIGTERM);
    l.wait_line(10, |x| x.contains("forwarding it to the workers"));
    let second = Instant::now();
    l.signal(libc::SIGINT);
    assert_eq!(code(l.exit(30)), 128 + libc::SIGTERM, "{}", l.output());
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
    let mut l = Launcher::spawn(&[
        "run",
        "--standalone",
        "--no-python",
        "sh",
        "-c",
        "kill -SEGV $$",
    ]);
    assert_eq!(code(l.exit(30)), 1, "{}", l.output());
    let report = l
        .seen
        .iter()
        .find(|x| x.contains("first failure"))
        .expect("a report");
    assert!(
        report.contains("rank 0") && report.contains("signal SIGSEGV"),
        "{report}"
    );
}
