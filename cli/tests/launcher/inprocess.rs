//! `--in-process-restart`: a node admitted to the job ends the round, and the first node's
//! worker leaves its training function and runs it again in the same process with the new
//! round's environment (`rdzv.inprocess.run`); without the wrapper in the worker, the group is
//! stopped and started again once the bound passes.

use crate::common::Etcd;
use crate::launch::Launcher;
use crate::launch::RDZV;
use crate::support::{fields, num, pid, rdzv_env, run_dir, Fields, Scratch, WorkerLines, FAST};
use std::path::{Path, PathBuf};

/// A worker whose training function prints its START line (as the shell worker's, with its
/// pid and how many times it ran again), then steps until the world has `want` workers; the
/// local rank given second never leaves when asked.
const TRAIN: &str = r#"
import os, sys, time
import rdzv.inprocess as ip

want = int(sys.argv[1])
# This local rank never looks at the launcher's leave: it cannot leave the function.
deaf = sys.argv[2] if len(sys.argv) > 2 else None
if os.environ.get("RDZV_INPROCESS_SPARE") == "1":
    print(f"SPARE pid={os.getpid()}", flush=True)

def train():
    e = os.environ
    print(f"START rank={e['RANK']} local={e['LOCAL_RANK']} world={e['WORLD_SIZE']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} master={e['MASTER_ADDR']}:{e['MASTER_PORT']} pid={os.getpid()}", flush=True)
    while int(e["WORLD_SIZE"]) < want:
        if e["LOCAL_RANK"] != deaf:
            ip.check()
        time.sleep(0.01)
    time.sleep(0.5)

ip.run(train)
"#;

/// What each test here starts from: an etcd, a scratch directory holding the Python program,
/// the run's URL, and the workers' environment (`python_env`).
struct Setup {
    _etcd: Etcd,
    s: Scratch,
    program: String,
    url: String,
    env: Vec<(&'static str, String)>,
}

impl Setup {
    /// Run `run` with the rendezvous `params` (and `FAST`), `text` written as `file`.
    fn new(run: &str, params: &str, file: &str, text: &str) -> Setup {
        let etcd = Etcd::start();
        let s = Scratch::new();
        std::fs::write(s.path(file), text).unwrap();
        let program = s.path(file).display().to_string();
        let url = etcd.url(run, &format!("{params}&{FAST}"));
        Setup {
            _etcd: etcd,
            s,
            program,
            url,
            env: python_env(),
        }
    }

    fn env(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python_env() -> Vec<(&'static str, String)> {
    let library = Path::new(RDZV).with_file_name("librdzv.so");
    vec![
        (
            "PYTHONPATH",
            repo().join("bindings/python").display().to_string(),
        ),
        ("RDZV_LIBRARY", library.display().to_string()),
    ]
}

#[test]
fn a_node_admitted_ends_the_round_and_the_first_nodes_worker_runs_again_in_its_process() {
    let t = Setup::new("in-process", "min_nodes=1&max_nodes=2", "train.py", TRAIN);
    let (url, train) = (t.url.clone(), t.program.clone());
    let env = t.env();
    let node = |flags: &[&str]| {
        let args = [
            &["run", "--rdzv", &url, "--in-process-restart"],
            flags,
            &[&train, "2"],
        ]
        .concat();
        rdzv_env(&args, &env)
    };
    let mut a = node(&[]);
    let first = a.start(30);
    assert_eq!(num(&first, "world"), 1, "{}", a.output());
    let mut b = node(&[]);
    let again = a.start(30);
    let joined = b.start(30);
    assert_eq!(num(&again, "world"), 2, "{}", a.output());
    assert_eq!(num(&joined, "world"), 2);
    assert_eq!(
        pid(&again),
        pid(&first),
        "the worker ran the new round in its process: {}",
        a.output()
    );
    assert_eq!(num(&again, "again"), 1, "called once more: {}", a.output());
    assert_eq!(
        num(&again, "restart"),
        0,
        "a membership change spends no restart"
    );
    assert_ne!(
        again["master"],
        first["master"].as_str(),
        "the new round's bootstrap address"
    );
    assert!(
        a.said("they stay in their processes for the next round"),
        "{}",
        a.output()
    );
    a.exits_with(0, 30);
    b.exits_with(0, 30);
}

#[test]
fn a_worker_that_does_not_leave_in_time_is_started_again() {
    // The shell worker knows nothing of the control file: after --in-process-timeout the
    // group is stopped and started, as without the flag.
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url(
        "in-process-late",
        &format!("min_nodes=1&max_nodes=2&{FAST}"),
    );
    let flags = ["--in-process-restart", "--in-process-timeout", "0.5"];
    let mut a = s.node(&url, &flags, "hold");
    let first = a.start(30);
    let mut b = s.node(&url, &flags, "hold");
    let again = a.start(30);
    b.start(30);
    assert_eq!(num(&again, "world"), 2);
    assert_ne!(pid(&again), pid(&first), "a new process: {}", a.output());
    assert!(
        a.said("did not leave the training function within 0.5 s"),
        "{}",
        a.output()
    );
    a.terminate();
    b.terminate();
}

#[test]
fn a_worker_that_does_not_leave_in_time_is_stopped_alone_and_the_others_stay() {
    stopped_alone(false);
}

/// The same with a spare: the place of the worker stopped after a membership change (no
/// restart spent, the same attempt's directory) goes to the spare, and the next spare's
/// directory is not the one the spare now works in.
#[test]
fn a_worker_stopped_after_a_membership_change_is_replaced_by_the_spare() {
    stopped_alone(true);
}

fn stopped_alone(spare: bool) {
    let t = Setup::new(
        "in-process-deaf",
        "min_nodes=1&max_nodes=2",
        "train.py",
        TRAIN,
    );
    let (url, train) = (t.url.clone(), t.program.clone());
    let env = t.env();
    let node = || {
        let args = [
            &[
                "run",
                "--rdzv",
                &url,
                "--nproc-per-node=2",
                "--in-process-restart",
                "--in-process-timeout=0.5",
            ][..],
            if spare {
                &["--in-process-spare"][..]
            } else {
                &[]
            },
            &[&train, "4", "1"],
        ]
        .concat();
        rdzv_env(&args, &env)
    };
    let mut a = node();
    let first: Vec<Fields> = (0..2).map(|_| a.start(30)).collect();
    let spare_pid = spare.then(|| pid(&fields(&a.wait_line(30, |l| l.starts_with("SPARE ")))));
    let mut b = node();
    let again: Vec<Fields> = (0..2).map(|_| a.start(30)).collect();
    let of = |starts: &[Fields], local: u32| {
        starts
            .iter()
            .find(|f| num(f, "local") == local)
            .unwrap_or_else(|| panic!("no START of local rank {local}: {starts:?}"))
            .clone()
    };
    for f in &again {
        assert_eq!(num(f, "world"), 4, "{}", a.output());
    }
    assert_eq!(
        pid(&of(&again, 0)),
        pid(&of(&first, 0)),
        "the worker that left stayed in its process: {}",
        a.output()
    );
    assert_ne!(
        pid(&of(&again, 1)),
        pid(&of(&first, 1)),
        "the one that did not leave is a new process: {}",
        a.output()
    );
    if let Some(spare_pid) = spare_pid {
        assert_eq!(
            pid(&of(&again, 1)),
            spare_pid,
            "the spare took its place: {}",
            a.output()
        );
    }
    assert!(
        a.said("rank(s) 1 did not leave the training function within 0.5 s: stopping them alone"),
        "{}",
        a.output()
    );
    a.exits_with(0, 30);
    b.exits_with(0, 30);
}

/// Local rank 1 fails in the first attempt, once local rank 0 is in its training function (the
/// file named first says so); local rank 0 steps until the restart count moves.
const FAIL_ONE: &str = r#"
import os, sys, time
import rdzv.inprocess as ip

started = os.path.join(sys.argv[1], "rank0-started")

def train():
    e = os.environ
    print(f"START rank={e['RANK']} local={e['LOCAL_RANK']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} pid={os.getpid()}", flush=True)
    if e["TORCHELASTIC_RESTART_COUNT"] == "0":
        if e["LOCAL_RANK"] == "1":
            deadline = time.monotonic() + 30
            while not os.path.exists(started) and time.monotonic() < deadline:
                time.sleep(0.01)
            sys.exit(3)
        open(started, "w").close()
        while True:
            ip.check()
            time.sleep(0.01)

ip.run(train)
"#;

#[test]
fn a_failed_worker_alone_is_started_again_and_the_others_stay_in_their_processes() {
    let t = Setup::new(
        "in-process-fail",
        "min_nodes=1&max_nodes=1",
        "fail_one.py",
        FAIL_ONE,
    );
    let (s, url, program) = (&t.s, t.url.clone(), t.program.clone());
    let scratch = s.path("").display().to_string();
    let env = t.env();
    let args = [
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--in-process-restart",
        &program,
        &scratch,
    ];
    let mut a = rdzv_env(&args, &env);
    let first: Vec<_> = (0..2).map(|_| a.start(30)).collect();
    let second: Vec<_> = (0..2).map(|_| a.start(30)).collect();
    a.exits_with(0, 30);
    let of = |starts: &[Fields], local: u32| {
        starts
            .iter()
            .find(|f| num(f, "local") == local)
            .unwrap_or_else(|| panic!("no START of local rank {local}: {starts:?}"))
            .clone()
    };
    for f in &second {
        assert_eq!(num(f, "restart"), 1, "{}", a.output());
    }
    assert_eq!(
        pid(&of(&second, 0)),
        pid(&of(&first, 0)),
        "the worker that did not fail stayed in its process: {}",
        a.output()
    );
    assert_eq!(num(&of(&second, 0), "again"), 1);
    assert_ne!(
        pid(&of(&second, 1)),
        pid(&of(&first, 1)),
        "the failed worker is a new process: {}",
        a.output()
    );
    assert!(
        a.said("only the failed worker starts again"),
        "{}",
        a.output()
    );
}

/// FAIL_ONE with a spare (the same directory for both files): a spare says so at its top level, without a place, and leaves a
/// file in the directory given first; the second attempt ends once two spares have started.
const SPARE_TAKES: &str = r#"
import os, sys, time
import rdzv.inprocess as ip

if os.environ.get("RDZV_INPROCESS_SPARE") == "1":
    print(f"SPARE pid={os.getpid()} rank={os.environ.get('RANK', 'none')}", flush=True)
    open(os.path.join(sys.argv[1], f"spare-{os.getpid()}"), "w").close()

started = os.path.join(sys.argv[1], "rank0-started")

def train():
    e = os.environ
    print(f"START rank={e['RANK']} local={e['LOCAL_RANK']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} pid={os.getpid()}", flush=True)
    if e["TORCHELASTIC_RESTART_COUNT"] == "0":
        if e["LOCAL_RANK"] == "1":
            deadline = time.monotonic() + 30
            while not os.path.exists(started) and time.monotonic() < deadline:
                time.sleep(0.01)
            sys.exit(3)
        open(started, "w").close()
        while True:
            ip.check()
            time.sleep(0.01)
    while sum(f.startswith("spare-") for f in os.listdir(sys.argv[1])) < 2:
        time.sleep(0.01)

ip.run(train)
"#;

#[test]
fn a_failed_workers_place_goes_to_the_spare_and_a_new_spare_is_started() {
    let t = Setup::new(
        "in-process-spare",
        "min_nodes=1&max_nodes=1",
        "spare.py",
        SPARE_TAKES,
    );
    let (s, url, program) = (&t.s, t.url.clone(), t.program.clone());
    let dir = s.path("").display().to_string();
    let env = t.env();
    let args = [
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--in-process-restart",
        "--in-process-spare",
        &program,
        &dir,
    ];
    let mut a = rdzv_env(&args, &env);
    let spare = |a: &mut Launcher| fields(&a.wait_line(30, |l| l.starts_with("SPARE ")));
    let first_spare = spare(&mut a);
    assert_eq!(
        first_spare["rank"],
        "none",
        "a spare has no place: {}",
        a.output()
    );
    let first: Vec<_> = (0..2).map(|_| a.start(30)).collect();
    let second: Vec<_> = (0..2).map(|_| a.start(30)).collect();
    let next_spare = spare(&mut a);
    a.exits_with(0, 30);
    let of = |starts: &[Fields], local: u32| {
        starts
            .iter()
            .find(|f| num(f, "local") == local)
            .unwrap_or_else(|| panic!("no START of local rank {local}: {starts:?}"))
            .clone()
    };
    for f in &second {
        assert_eq!(num(f, "restart"), 1, "{}", a.output());
    }
    assert_eq!(
        pid(&of(&second, 0)),
        pid(&of(&first, 0)),
        "the worker that did not fail stayed in its process: {}",
        a.output()
    );
    assert_eq!(
        pid(&of(&second, 1)),
        pid(&first_spare),
        "the spare took the failed worker's place: {}",
        a.output()
    );
    assert_ne!(
        pid(&next_spare),
        pid(&first_spare),
        "a new spare was started: {}",
        a.output()
    );
    assert!(
        a.said("the spare takes the place of 1 that had failed"),
        "{}",
        a.output()
    );
}

/// A worker that beats every 50 ms while the world is smaller than `want`; in a world of
/// `want`, it first takes 3 s without a beat (as a process group's init waits for a peer that
/// imports torch, or a first checkpoint), then beats for half a second and returns.
const BEATING: &str = r#"
import os, sys, time
import rdzv
import rdzv.inprocess as ip

want = int(sys.argv[1])

def train():
    e = os.environ
    print(f"START rank={e['RANK']} world={e['WORLD_SIZE']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} master={e['MASTER_ADDR']}:{e['MASTER_PORT']} pid={os.getpid()}", flush=True)
    while int(e["WORLD_SIZE"]) < want:
        ip.check()
        rdzv.heartbeat()
        time.sleep(0.05)
    time.sleep(3)
    for _ in range(10):
        rdzv.heartbeat()
        time.sleep(0.05)

ip.run(train)
"#;

#[test]
fn a_kept_worker_is_not_held_to_the_hang_timeout_before_it_beats_in_the_new_round() {
    // Its page shows the last round's beats: counted from them, the 3 s before its first beat
    // in the new round passed the 2 s timeout, and the healthy worker was called hung.
    let t = Setup::new(
        "in-process-hang",
        "min_nodes=1&max_nodes=2",
        "train.py",
        BEATING,
    );
    let (url, train) = (t.url.clone(), t.program.clone());
    let env = t.env();
    let node = || {
        let args = [
            "run",
            "--rdzv",
            &url,
            "--in-process-restart",
            "--hang-timeout=2",
            &train,
            "2",
        ];
        rdzv_env(&args, &env)
    };
    let mut a = node();
    let first = a.start(30);
    assert_eq!(num(&first, "world"), 1, "{}", a.output());
    let mut b = node();
    let again = a.start(30);
    b.start(30);
    assert_eq!(num(&again, "world"), 2, "{}", a.output());
    assert_eq!(
        pid(&again),
        pid(&first),
        "kept in its process: {}",
        a.output()
    );
    a.exits_with(0, 30);
    b.exits_with(0, 30);
    assert!(!a.said("made no progress"), "no hang: {}", a.output());
}

/// Two nodes' launchers and what their workers said, once both exited 0.
struct HangRun {
    /// Each node's STARTs of the first attempt, then of the second.
    first: [Vec<Fields>; 2],
    second: [Vec<Fields>; 2],
    nodes: [Launcher; 2],
    /// Both launchers' output.
    out: String,
}

/// Two nodes of two workers running `t`'s program in process, with `--hang-timeout=2` and one
/// restart, each node's program given its argument in `roles` (none if empty).
fn two_nodes_in_a_hang(t: &Setup, roles: [&str; 2]) -> HangRun {
    let env = t.env();
    let node = |role: &str| {
        let mut args = vec![
            "run",
            "--rdzv",
            &t.url,
            "--nnodes=2",
            "--nproc-per-node=2",
            "--max-restarts=1",
            "--hang-timeout=2",
            "--in-process-restart",
            &t.program,
        ];
        args.extend((!role.is_empty()).then_some(role));
        rdzv_env(&args, &env)
    };
    let (mut a, mut b) = (node(roles[0]), node(roles[1]));
    let starts = |n: &mut Launcher| -> Vec<Fields> { (0..2).map(|_| n.start(30)).collect() };
    let (a1, b1) = (starts(&mut a), starts(&mut b));
    let (a2, b2) = (starts(&mut a), starts(&mut b));
    a.exits_with(0, 60);
    b.exits_with(0, 60);
    let out = format!("{}\n---\n{}", a.output(), b.output());
    HangRun {
        first: [a1, b1],
        second: [a2, b2],
        nodes: [a, b],
        out,
    }
}

/// A worker that beats every 50 ms and returns after 10 beats in its second attempt; in the
/// first, rank 1 stops beating after 5 (hung: alive, no progress).
const HANG_ONE: &str = r#"
import os, time
import rdzv
import rdzv.inprocess as ip

def train():
    e = os.environ
    print(f"START rank={e['RANK']} local={e['LOCAL_RANK']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} pid={os.getpid()}", flush=True)
    first = e["TORCHELASTIC_RESTART_COUNT"] == "0"
    beats = 0
    while not first or beats < 5 or e["RANK"] != "1":
        ip.check()
        rdzv.heartbeat()
        beats += 1
        if not first and beats == 10:
            return
        time.sleep(0.05)
    while True:
        time.sleep(1)

ip.run(train)
"#;

#[test]
fn a_hung_worker_alone_is_started_again_and_every_other_worker_stays_in_its_process() {
    let t = Setup::new(
        "in-process-hang-one",
        "min_nodes=2&max_nodes=2",
        "hang_one.py",
        HANG_ONE,
    );
    let HangRun {
        first: [a1, b1],
        second: [a2, b2],
        nodes: [a, b],
        out,
    } = two_nodes_in_a_hang(&t, ["", ""]);
    let by_rank =
        |starts: &[Fields], rank: u32| starts.iter().find(|f| num(f, "rank") == rank).cloned();
    let first: Vec<_> = a1.iter().chain(&b1).cloned().collect();
    let second: Vec<_> = a2.iter().chain(&b2).cloned().collect();
    for rank in 0..4 {
        let (before, after) = (by_rank(&first, rank), by_rank(&second, rank));
        let (before, after) = (
            before.unwrap_or_else(|| panic!("no first START of rank {rank}: {out}")),
            after.unwrap_or_else(|| panic!("no second START of rank {rank}: {out}")),
        );
        assert_eq!(num(&after, "restart"), 1, "{out}");
        match rank {
            1 => assert_ne!(
                pid(&after),
                pid(&before),
                "the hung worker is a new process: {out}"
            ),
            _ => {
                assert_eq!(
                    pid(&after),
                    pid(&before),
                    "rank {rank} stayed in its process: {out}"
                );
                assert_eq!(num(&after, "again"), 1, "{out}");
            }
        }
    }
    let (finder, peer) = match a1.iter().any(|f| num(f, "rank") == 1) {
        true => (&a, &b),
        false => (&b, &a),
    };
    assert!(finder.said("hang:"), "the hang was found: {out}");
    assert!(finder.said("only the failed worker starts again"), "{out}");
    assert!(
        peer.said("the workers left in"),
        "the other node kept its workers: {out}"
    );
}

/// HANG_ONE across two nodes, so that the finding node is not the hung worker's: local rank 1
/// of the node given `silent` stops beating after 5 beats but still looks at the launcher
/// (its node times it out first and kills it); local rank 1 of the node given `hang` stops a
/// second later and never looks again (hung).
const HANG_ELSEWHERE: &str = r#"
import os, sys, time
import rdzv
import rdzv.inprocess as ip

role = sys.argv[1]

def train():
    e = os.environ
    print(f"START rank={e['RANK']} local={e['LOCAL_RANK']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} pid={os.getpid()}", flush=True)
    odd = e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["LOCAL_RANK"] == "1"
    beats = 0
    while True:
        ip.check()
        if not odd or beats < (5 if role == "silent" else 25):
            rdzv.heartbeat()
        elif role == "hang":
            while True:
                time.sleep(1)
        beats += 1
        if not odd and e["TORCHELASTIC_RESTART_COUNT"] == "1" and beats == 10:
            return
        time.sleep(0.05)

ip.run(train)
"#;

#[test]
fn a_hung_worker_found_from_another_node_is_stopped_once_its_nodes_other_workers_left() {
    let t = Setup::new(
        "in-process-hang-elsewhere",
        "min_nodes=2&max_nodes=2",
        "hang_elsewhere.py",
        HANG_ELSEWHERE,
    );
    let HangRun {
        first: [s1, h1],
        second: [s2, h2],
        nodes: [silent, hang],
        out,
    } = two_nodes_in_a_hang(&t, ["silent", "hang"]);
    let by_local = |starts: &[Fields], local: u32| {
        starts
            .iter()
            .find(|f| num(f, "local") == local)
            .cloned()
            .unwrap_or_else(|| panic!("no START of local rank {local}: {out}"))
    };
    for (before, after) in [(&s1, &s2), (&h1, &h2)] {
        let (kept, replaced) = (by_local(after, 0), by_local(after, 1));
        assert_eq!(pid(&kept), pid(&by_local(before, 0)), "kept: {out}");
        assert_eq!(num(&kept, "again"), 1, "{out}");
        assert_ne!(pid(&replaced), pid(&by_local(before, 1)), "replaced: {out}");
    }
    assert!(
        silent.said("hang:"),
        "the silent worker's node found it: {out}"
    );
    assert!(
        hang.said("it is the hung one, stopping it alone"),
        "the hung worker was stopped once its node's other worker had left: {out}"
    );
    assert!(
        !hang.said("did not leave the training function within"),
        "{out}"
    );
}

/// Two workers that stop one after the other in their first attempt, a few milliseconds
/// apart (a file in the directory given): local rank 0 stops beating first but still looks at
/// the launcher (it only waits, as a victim blocked in a collective would); local rank 1,
/// beating every 10 ms until then, beats once more and hangs.
const HANG_BESIDE: &str = r#"
import os, sys, time
import rdzv
import rdzv.inprocess as ip

def train():
    e = os.environ
    print(f"START rank={e['RANK']} local={e['LOCAL_RANK']} restart={e['TORCHELASTIC_RESTART_COUNT']} again={ip.restarts()} pid={os.getpid()}", flush=True)
    if e["TORCHELASTIC_RESTART_COUNT"] == "0":
        quiet = os.path.join(sys.argv[1], "quiet-0")
        if e["LOCAL_RANK"] == "0":
            for _ in range(5):
                ip.check()
                rdzv.heartbeat()
                time.sleep(0.05)
            open(quiet, "w").close()
            while True:
                ip.check()
                time.sleep(0.01)
        deadline = time.monotonic() + 30
        while not os.path.exists(quiet) and time.monotonic() < deadline:
            ip.check()
            rdzv.heartbeat()
            time.sleep(0.01)
        rdzv.heartbeat()
        while True:
            time.sleep(1)
    for _ in range(10):
        ip.check()
        rdzv.heartbeat()
        time.sleep(0.05)

ip.run(train)
"#;

/// The timeout falls first on a worker that only waits on the hung one beside it: it leaves
/// and stays in its process, and the hung one, which does not leave, is stopped and carries
/// the hang in its error file.
#[test]
fn the_hung_worker_is_stopped_and_not_the_one_the_timeout_fell_on_first() {
    let t = Setup::new(
        "in-process-hang-beside",
        "min_nodes=1&max_nodes=1",
        "hang_beside.py",
        HANG_BESIDE,
    );
    let (s, url, program) = (&t.s, t.url.clone(), t.program.clone());
    let (signals, logs) = (s.path("signals"), s.path("logs"));
    std::fs::create_dir_all(&signals).unwrap();
    let env = t.env();
    let log_dir = format!("--log-dir={}", logs.display());
    let signals = signals.display().to_string();
    let args = [
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--hang-timeout=2",
        "--in-process-restart",
        &log_dir,
        &program,
        &signals,
    ];
    let mut a = rdzv_env(&args, &env);
    let first: Vec<Fields> = (0..2).map(|_| a.start(30)).collect();
    let second: Vec<Fields> = (0..2).map(|_| a.start(30)).collect();
    a.exits_with(0, 60);
    let out = a.output();
    let of = |starts: &[Fields], local: u32| {
        starts
            .iter()
            .find(|f| num(f, "local") == local)
            .cloned()
            .unwrap_or_else(|| panic!("no START of local rank {local}: {out}"))
    };
    assert!(
        a.said("hang: rank 0 (local rank 0"),
        "the timeout fell first on local rank 0: {out}"
    );
    assert_eq!(
        pid(&of(&second, 0)),
        pid(&of(&first, 0)),
        "the waiting worker stayed in its process: {out}"
    );
    assert_eq!(num(&of(&second, 0), "again"), 1, "{out}");
    assert_ne!(
        pid(&of(&second, 1)),
        pid(&of(&first, 1)),
        "the hung worker is a new process: {out}"
    );
    assert!(a.said("it is the hung one, stopping it alone"), "{out}");
    assert!(a.said("restart 1 of 1"), "the hang spent a restart: {out}");
    let error_file = run_dir(&logs).join("attempt_0/1/error.json");
    let error = std::fs::read_to_string(&error_file).unwrap_or_default();
    assert!(
        error.contains("did not leave its training function after the hang was found"),
        "{}: {error}",
        error_file.display()
    );
    assert!(!run_dir(&logs).join("attempt_0/0/error.json").exists());
}
