//! What no exit reports, end to end: hung workers caught (Python and C workers, given and
//! learned timeouts), the suspect named across nodes, restarts without progress stopped,
//! health checks before a join and while training, NVRx's client names. Real launchers, real
//! workers (Python through rdzv's binding, C through the C ABI), a real etcd; every wait is
//! bounded and waits for a line or an exit.

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{Launcher, RDZV};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};

/// The Python worker: `MODE` says what it does; it prints `HANGING` before it stops making
/// progress and `DONE` when it ends.
const WORKER: &str = r#"
import os, random, sys, time
import rdzv

mode = sys.argv[1]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
hang_rank = int(os.environ.get("HANG_RANK", "1"))


def hang_here():
    print(f"HANGING rank={rank} attempt={attempt}", flush=True)
    time.sleep(3600)


if mode == "hang-once":
    # hang_rank stops in the middle of a step of the first attempt.
    for step in range(30):
        with rdzv.section("step"):
            time.sleep(0.03)
            if rank == hang_rank and attempt == 0 and step == 10:
                hang_here()
        rdzv.heartbeat()
elif mode == "collective":
    # A stand-in for a collective: every rank waits in "allreduce" for all ranks' files (of
    # this round: restart counts differ between nodes, as under torchrun).
    shared, world = os.environ["SHARED"], int(os.environ["WORLD_SIZE"])
    tag = os.environ["MASTER_PORT"]
    for step in range(int(os.environ.get("STEPS", "30"))):
        with rdzv.section("step"):
            time.sleep(0.03)
            # Once in the job (restart counts differ between nodes: the node that finds a
            # hang spends the restart, the others re-form).
            if rank == hang_rank and step == 10 and not os.path.exists(f"{shared}/hung"):
                open(f"{shared}/hung", "w").close()
                hang_here()
        with rdzv.section("allreduce"):
            open(f"{shared}/{tag}.{rank}.{step}", "w").close()
            while not all(os.path.exists(f"{shared}/{tag}.{r}.{step}") for r in range(world)):
                time.sleep(0.005)
        rdzv.heartbeat()
elif mode == "steady":
    # Steps of uneven length for SECONDS, then hang_rank hangs if HANG_AT_END is set.
    until = time.monotonic() + float(os.environ["SECONDS_TO_RUN"])
    while time.monotonic() < until:
        time.sleep(random.uniform(0.02, 0.15))
        rdzv.heartbeat()
    if os.environ.get("HANG_AT_END") and rank == hang_rank:
        hang_here()
elif mode == "paced":
    # Steps of STEP_S seconds for SECONDS_TO_RUN.
    until = time.monotonic() + float(os.environ["SECONDS_TO_RUN"])
    while time.monotonic() < until:
        time.sleep(float(os.environ["STEP_S"]))
        rdzv.heartbeat()
elif mode == "stuck-at-step":
    # Resumes from the same checkpoint every attempt, reaches step 39 and fails.
    for step in range(20, 40):
        time.sleep(0.01)
        rdzv.heartbeat(step=step)
    print(f"FAILING rank={rank} attempt={attempt}", flush=True)
    sys.exit(1)
elif mode == "nvrx":
    from rdzv.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    for step in range(30):
        client.start_section("step")
        time.sleep(0.03)
        if rank == hang_rank and attempt == 0 and step == 10:
            hang_here()
        client.end_section("step")
        client.send_heartbeat()
    client.shutdown_workload_monitoring()
elif mode == "slow-exit":
    # Steps, then an end without steps longer than the hang timeout, in one of three ways.
    for step in range(20):
        time.sleep(0.02)
        rdzv.heartbeat()
    how, slow = os.environ["EXIT_HOW"], float(os.environ["SLOW_S"])
    print(f"DONE rank={rank} attempt={attempt} monitored={rdzv.is_monitored()}", flush=True)
    if how == "pause":
        rdzv.progress.pause()
        time.sleep(slow)  # a final save
    elif how == "nvrx":
        from rdzv.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        client.send_heartbeat()
        client.shutdown_workload_monitoring()
        time.sleep(slow)
    elif how == "teardown":
        # The interpreter's own end: an exit handler registered after `import rdzv` (they run
        # last-registered first), as torch's are.
        import atexit

        atexit.register(time.sleep, slow)
    sys.exit(0)
elif mode == "first-checkpoint":
    # Steps of 0.1 s, then the job's first checkpoint, longer than the learned floor of 5 s.
    for step in range(12):
        time.sleep(0.1)
        rdzv.heartbeat()
    with rdzv.section("checkpoint"):
        time.sleep(float(os.environ["CKPT_S"]))
    for step in range(5):
        time.sleep(0.1)
        rdzv.heartbeat()
elif mode == "ring":
    # Steps through a stand-in for a collective (every rank waits for all ranks' files);
    # HOW says how hang_rank hangs at step 10, once in the job, MARK whether the collective is
    # a section ("allreduce"; the rest of the step is in none).
    import ctypes, signal

    shared, world = os.environ["SHARED"], int(os.environ["WORLD_SIZE"])
    tag, how, marked = os.environ["MASTER_PORT"], os.environ["HOW"], os.environ["MARK"] == "sections"
    for step in range(int(os.environ.get("STEPS", "30"))):
        time.sleep(0.03)
        if rank == hang_rank and step == 10 and not os.path.exists(f"{shared}/hung"):
            open(f"{shared}/hung", "w").close()
            print(f"HANGING rank={rank} attempt={attempt} how={how}", flush=True)
            if how == "sleep":
                time.sleep(3600)
            elif how == "c":
                ctypes.PyDLL(None).sleep(3600)  # in C, holding the GIL
            else:
                os.kill(os.getpid(), signal.SIGSTOP)
        if marked:
            rdzv.section_begin("allreduce")
        open(f"{shared}/{tag}.{rank}.{step}", "w").close()
        while not all(os.path.exists(f"{shared}/{tag}.{r}.{step}") for r in range(world)):
            time.sleep(0.005)
        if marked:
            rdzv.section_end("allreduce")
        rdzv.heartbeat()
elif mode == "damage":
    # Heartbeats, then the worker does something to its own page and stops making progress
    # (or, for an unlinked page, goes on).
    page, what = os.environ["RDZV_PROGRESS_FILE"], os.environ["DAMAGE"]
    for step in range(10):
        time.sleep(0.02)
        rdzv.heartbeat()
    if what == "truncate":
        os.truncate(page, 0)
    elif what == "unlink":
        os.unlink(page)
        for step in range(40):
            time.sleep(0.05)
            rdzv.heartbeat()
    else:
        with open(page, "r+b") as f:
            if what == "random":
                f.write(os.urandom(os.path.getsize(page)))
            else:  # timestamps far in the future
                f.seek(24)
                f.write(b"\xff" * 8)
                f.seek(48)
                f.write(b"\xff" * 8)
    print(f"DAMAGED rank={rank} what={what}", flush=True)
    if what != "unlink":
        time.sleep(3600)
elif mode == "counts":
    # Every attempt says its restart count and directory; crash_rank fails once in the job.
    crash_rank = int(os.environ["CRASH_RANK"])
    shared = os.environ["SHARED"]
    error_file = os.environ["TORCHELASTIC_ERROR_FILE"]
    print(f"COUNT rank={rank} count={attempt} dir={os.path.basename(os.path.dirname(os.path.dirname(error_file)))}", flush=True)
    if rank == crash_rank and not os.path.exists(f"{shared}/crashed"):
        open(f"{shared}/crashed", "w").close()
        sys.exit(1)
    for step in range(int(os.environ.get("STEPS", "40"))):
        time.sleep(0.05)
elif mode == "peer-lost":
    # Fails at once when the other node's worker of this round is gone (its connection broke,
    # as a peer's death breaks a collective); alone after that, fails once more for real.
    shared, world, tag = os.environ["SHARED"], int(os.environ["WORLD_SIZE"]), os.environ["MASTER_PORT"]
    open(f"{shared}/pid.{tag}.{rank}.{os.getpid()}", "w").close()
    print(f"STARTED rank={rank} world={world}", flush=True)
    gone = os.path.exists(f"{shared}/peer-gone")
    if world == 1 and gone and not os.path.exists(f"{shared}/real"):
        open(f"{shared}/real", "w").close()
        print(f"REAL FAILURE attempt={attempt}", flush=True)
        sys.exit(1)
    for step in range(20 if world == 1 and gone else 1200):
        time.sleep(0.05)
        if world == 1:
            continue
        for name in os.listdir(shared):
            parts = name.split(".")
            if parts[0] == "pid" and parts[1] == tag and parts[2] != str(rank):
                try:
                    os.kill(int(parts[3]), 0)
                except ProcessLookupError:
                    open(f"{shared}/peer-gone", "w").close()
                    print(f"PEER GONE rank={rank}", flush=True)
                    sys.exit(1)
print(f"DONE rank={rank} attempt={attempt} monitored={rdzv.is_monitored()}", flush=True)
"#;

/// The C worker: heartbeats through the C ABI (loaded with dlopen from `RDZV_LIB`), then
/// hangs; exits 3 if the library says it is not monitored.
const C_WORKER: &str = r#"
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
    void *lib = dlopen(getenv("RDZV_LIB"), RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    void (*heartbeat)(void) = (void (*)(void))dlsym(lib, "rdzv_heartbeat");
    bool (*is_monitored)(void) = (bool (*)(void))dlsym(lib, "rdzv_is_monitored");
    for (int i = 0; i < 20; i++) { heartbeat(); usleep(20000); }
    if (!is_monitored()) return 3;
    printf("HANGING rank=%s\n", getenv("RANK"));
    fflush(stdout);
    pause();
    return 0;
}
"#;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A scratch directory with the workers in it, and the environment they need.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "rdzv-hangs-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("shared")).unwrap();
        std::fs::write(dir.join("worker.py"), WORKER).unwrap();
        Scratch { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `rdzv run FLAGS worker.py MODE` with `env`, logs under `logs/`.
    fn run(&self, flags: &[&str], mode: &str, env: &[(&str, &str)]) -> Launcher {
        let logs = self.path("logs");
        let worker = self.path("worker.py");
        let mut cmd = Command::new(RDZV);
        cmd.arg("run")
            .arg("--log-dir")
            .arg(&logs)
            .args(flags)
            .arg(&worker)
            .arg(mode)
            .env("PYTHONPATH", repo().join("bindings/python"))
            .env("RDZV_LIBRARY", library())
            .env("SHARED", self.path("shared"))
            .envs(env.iter().copied());
        clean_env(&mut cmd);
        Launcher::spawn_in_own_tmpdir(cmd)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Without the caller's torchrun and rdzv settings.
fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("PET_") || k.starts_with("RDZV_HANG") || k.starts_with("RDZV_HEALTH") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("TORCHELASTIC_ERROR_FILE");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The C library `cargo build` put beside the `rdzv` under test.
fn library() -> PathBuf {
    let lib = Path::new(RDZV).with_file_name("librdzv.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build -p rdzv-c first",
        lib.display()
    );
    lib
}

fn code(status: ExitStatus) -> i32 {
    status.code().unwrap_or(-1)
}

/// The number after `key` in `line` (`key` ends where the number starts).
fn number_after(line: &str, key: &str) -> f64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in {line:?}"))
        + key.len();
    line[at..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The path after `what ` in the launcher's evidence line for `rank`.
fn evidence(l: &Launcher, rank: u32, what: &str) -> PathBuf {
    let line = l.line_with_or_panic(&format!("rank {rank} evidence:"));
    let at = line
        .find(&format!("{what} "))
        .unwrap_or_else(|| panic!("no {what} in {line:?}"));
    PathBuf::from(
        line[at + what.len() + 1..]
            .split(',')
            .next()
            .unwrap()
            .trim(),
    )
}

trait Lines {
    fn line_with_or_panic(&self, text: &str) -> String;
}

impl Lines for Launcher {
    fn line_with_or_panic(&self, text: &str) -> String {
        match self.lines_with(text).next() {
            Some(line) => line.to_string(),
            None => panic!(
                "no line says {text:?}; the launcher said:\n{}",
                self.output()
            ),
        }
    }
}

#[test]
fn a_python_worker_that_stops_making_progress_is_caught_and_the_job_resumes() {
    let s = Scratch::new();
    let mut l = s.run(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--hang-timeout",
            "2",
            "--max-restarts",
            "1",
        ],
        "hang-once",
        &[],
    );
    let status = l.exit(60);
    assert_eq!(code(status), 0, "{}", l.output());
    let hang = l.line_with_or_panic("hang: rank 1 (local rank 1");
    assert!(
        hang.contains(r#"in section "step" (timeout 2.0 s, --hang-timeout; 10 heartbeat(s))"#),
        "{hang}"
    );
    let silent = number_after(&hang, "made no progress for ");
    assert!(silent >= 2.0, "caught before its timeout: {hang}");
    // Its Python stacks, from faulthandler (registered by `import rdzv`), show where it hung.
    let stacks = std::fs::read_to_string(evidence(&l, 1, "stacks")).unwrap();
    assert!(stacks.contains("in hang_here"), "{stacks}");
    let threads = std::fs::read_to_string(evidence(&l, 1, "threads")).unwrap();
    assert!(threads.lines().count() >= 2, "{threads}");
    // The next attempt runs to its end on both ranks, monitored.
    for rank in 0..2 {
        l.line_with_or_panic(&format!("DONE rank={rank} attempt=1 monitored=True"));
    }
}

#[test]
fn a_c_worker_is_monitored_and_its_hang_fails_the_job_with_a_report_and_an_error_file() {
    let s = Scratch::new();
    let source = s.path("worker.c");
    std::fs::write(&source, C_WORKER).unwrap();
    let program = s.path("c_worker");
    let built = Command::new("cc")
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(built.success());
    let error_file = s.path("launcher_error.json");
    let mut cmd = Command::new(RDZV);
    cmd.args(["run", "--standalone", "--hang-timeout", "1.5"])
        .arg(&program)
        .env("RDZV_LIB", library())
        .env("TORCHELASTIC_ERROR_FILE", &error_file);
    clean_env(&mut cmd);
    cmd.env("TORCHELASTIC_ERROR_FILE", &error_file);
    let mut l = Launcher::spawn_in_own_tmpdir(cmd);
    assert_eq!(code(l.exit(60)), 1, "{}", l.output());
    let hang = l.line_with_or_panic("hang: rank 0 (local rank 0");
    assert!(
        hang.contains("(timeout 1.5 s, --hang-timeout; 20 heartbeat(s))"),
        "{hang}"
    );
    assert!(
        number_after(&hang, "made no progress for ") >= 1.5,
        "{hang}"
    );
    // The report names the hang as the root cause, and the scheduler's error file has it.
    l.line_with_or_panic("first failure: rank 0");
    let copied = std::fs::read_to_string(&error_file).unwrap();
    assert!(copied.contains("hang: rank 0"), "{copied}");
    // A C worker registers no stack signal: the kernel's view of its threads is the evidence.
    let threads = evidence(&l, 0, "threads");
    assert!(threads.exists(), "{}", l.output());
}

#[test]
fn across_two_nodes_the_rank_that_stopped_first_is_the_suspect_and_the_others_wait_on_it() {
    let etcd = Etcd::start();
    let url = etcd.url("hang-suspect", "min_nodes=2&max_nodes=2");
    let s = Scratch::new();
    let flags = [
        "--rdzv",
        &url,
        "--nproc-per-node",
        "2",
        "--hang-timeout",
        "2",
        "--max-restarts",
        "1",
    ];
    let mut nodes: Vec<Launcher> = (0..2)
        .map(|_| s.run(&flags, "collective", &[("STEPS", "90")]))
        .collect();
    // While the next round runs (90 steps of 30 ms), `rdzv status` shows the hang's note.
    nodes[0].wait_line(60, |l| l.contains("round 1 formed"));
    let status = Command::new(RDZV)
        .args(["status", "--json", &url])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let note: serde_json::Value =
        serde_json::from_str(status["notes"]["hang"].as_str().expect("a hang note")).unwrap();
    assert_eq!(note["verdict"]["suspect"]["rank"], 1, "{note}");
    assert_eq!(
        note["verdict"]["victims"].as_array().unwrap().len(),
        3,
        "{note}"
    );
    assert!(
        note["hung"].as_str().unwrap().contains("made no progress"),
        "{note}"
    );
    for l in nodes.iter_mut() {
        assert_eq!(code(l.exit(90)), 0, "{}", l.output());
    }
    // Whichever node detected it, the verdict names rank 1 (in "step") as the suspect and
    // the three others (in "allreduce", waiting for it) as its victims.
    let verdicts: Vec<String> = nodes
        .iter()
        .flat_map(|l| {
            l.lines_with("hang: suspect:")
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !verdicts.is_empty(),
        "{}\n---\n{}",
        nodes[0].output(),
        nodes[1].output()
    );
    for v in &verdicts {
        assert!(
            v.contains(r#"suspect: rank 1 (local rank 1 on "#)
                && v.contains(r#"in section "step""#),
            "{v}"
        );
    }
    let waiting: Vec<String> = nodes
        .iter()
        .flat_map(|l| {
            l.lines_with("hang: waiting on it:")
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    // The detecting node says who waits (an empty list would pass any `all`).
    assert!(!waiting.is_empty(), "no victims line");
    assert!(
        waiting
            .iter()
            .all(|w| w.contains(r#"rank(s) 0,2-3 in section "allreduce""#)),
        "{waiting:?}"
    );
    // Each node found the hang itself (its victims time out a step after the suspect) or
    // heard of it from the other and stopped its workers for a new round.
    for l in &nodes {
        assert!(
            l.said("hang on node") || l.said("hang: suspect:"),
            "{}",
            l.output()
        );
    }
    // Every node's evidence outlives the next attempt, which reuses the workers' directories:
    // each node names its workers' stacks (a loop over no line would pass).
    for l in &nodes {
        assert!(
            l.lines_with("evidence: stacks ").count() >= 1,
            "no evidence line:\n{}",
            l.output()
        );
        for line in l.lines_with("evidence: stacks ") {
            let path = line
                .split("stacks ")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            let stacks = std::fs::read_to_string(path.trim()).unwrap_or_default();
            assert!(stacks.contains("worker.py"), "{path}: {stacks:?}");
        }
    }
    for l in &nodes {
        // (Counted in the whole output: two workers' lines may share one.)
        assert_eq!(
            l.output().matches("DONE rank=").count(),
            2,
            "{}",
            l.output()
        );
    }
}

#[test]
fn auto_learns_a_timeout_from_the_job_and_catches_a_hang_without_false_alarms() {
    let s = Scratch::new();
    let mut l = s.run(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--hang-timeout",
            "auto",
        ],
        "steady",
        &[("SECONDS_TO_RUN", "4"), ("HANG_AT_END", "1")],
    );
    assert_eq!(code(l.exit(60)), 1, "{}", l.output());
    let out = l.output();
    let hanging = out.find("HANGING rank=1").expect("rank 1 ran to its hang");
    let caught = out.find("hang: rank 1").expect("the hang was caught");
    assert!(
        hanging < caught,
        "a hang was declared before any worker hung:\n{out}"
    );
    let hang = l.line_with_or_panic("hang: rank 1");
    // Steps of at most 0.15 s: five times that is below the floor, which applies.
    assert!(hang.contains("(timeout 5.0 s, learned;"), "{hang}");
    assert_eq!(out.matches("error: hang: rank").count(), 1, "{out}");
}

#[test]
fn restarts_that_make_no_progress_stop_the_job_before_its_budget_is_spent() {
    let s = Scratch::new();
    let mut l = s.run(
        &[
            "--standalone",
            "--max-restarts",
            "10",
            "--max-no-progress-restarts",
            "2",
        ],
        "stuck-at-step",
        &[],
    );
    assert_eq!(code(l.exit(60)), 1, "{}", l.output());
    let stop = l.line_with_or_panic("no progress:");
    assert!(
        stop.contains(
            "2 restart(s) in a row made no progress (no worker passed step 39) (--max-no-progress-restarts 2)"
        ),
        "{stop}"
    );
    // The first attempt made progress, the two restarts after it did not: three attempts,
    // not eleven (nor four, a restart more than the flag allows).
    assert_eq!(l.lines_with("FAILING rank=0").count(), 3, "{}", l.output());
}

#[test]
fn a_health_check_that_fails_before_a_join_keeps_the_node_out() {
    let etcd = Etcd::start();
    let url = etcd.url("health-before", "min_nodes=1&max_nodes=2");
    let s = Scratch::new();
    let check = "echo checking GPUs; echo GPU 3: lost from the bus >&2; exit 3";
    let mut l = s.run(&["--rdzv", &url, "--health-check", check], "hang-once", &[]);
    assert_eq!(code(l.exit(30)), 1, "{}", l.output());
    let why = l.line_with_or_panic("this node takes no rank");
    assert!(
        why.contains("failed with exit code 3: checking GPUs | GPU 3: lost from the bus"),
        "{why}"
    );
    assert!(
        !l.said("round 0 formed") && !l.said("joining run"),
        "{}",
        l.output()
    );
}

#[test]
fn a_health_check_that_fails_while_training_drains_the_node_and_the_others_go_on() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "health-during",
        "min_nodes=1&max_nodes=2&last_call_timeout=0.5",
    );
    let s = Scratch::new();
    let flag = s.path("sick");
    let check = format!("test ! -e {}", flag.display());
    let env = [("SECONDS_TO_RUN", "4")];
    let mut healthy = s.run(&["--rdzv", &url], "steady", &env);
    let mut sick = s.run(
        &[
            "--rdzv",
            &url,
            "--health-check",
            &check,
            "--health-check-interval",
            "0.2",
        ],
        "steady",
        &env,
    );
    for l in [&mut healthy, &mut sick] {
        l.wait_line(60, |line| {
            line.contains("formed:") && line.contains("world size 2")
        });
    }
    std::fs::write(&flag, "").unwrap();
    assert_eq!(code(sick.exit(30)), 1, "{}", sick.output());
    let why = sick.line_with_or_panic("draining this node");
    assert!(why.contains("failed with exit code 1"), "{why}");
    // The healthy node re-forms without it and finishes.
    healthy.wait_line(30, |line| {
        line.contains("formed:") && line.contains("world size 1")
    });
    assert_eq!(code(healthy.exit(60)), 0, "{}", healthy.output());
}

#[test]
fn a_worker_written_for_nvrx_works_by_changing_one_import() {
    let s = Scratch::new();
    let mut l = s.run(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--hang-timeout",
            "2",
            "--max-restarts",
            "1",
        ],
        "nvrx",
        &[],
    );
    assert_eq!(code(l.exit(60)), 0, "{}", l.output());
    let hang = l.line_with_or_panic("hang: rank 1 (local rank 1");
    assert!(hang.contains(r#"in section "step""#), "{hang}");
    l.line_with_or_panic("DONE rank=1 attempt=1 monitored=True");
}

#[test]
fn rdzv_status_flags_a_node_much_slower_than_the_others() {
    let etcd = Etcd::start();
    let url = etcd.url("pace", "min_nodes=2&max_nodes=2");
    let s = Scratch::new();
    let flags = ["--rdzv", &url, "--pace-interval", "0.5"];
    let run = |step: &'static str| {
        s.run(
            &flags,
            "paced",
            &[("SECONDS_TO_RUN", "20"), ("STEP_S", step)],
        )
    };
    let mut nodes = [run("0.02"), run("0.1")];
    for l in nodes.iter_mut() {
        l.wait_line(60, |line| line.contains("formed:"));
    }
    let slow_id = node_id(&nodes[1]);
    // Each launcher writes its pace once it has measured a whole interval of steps; poll the
    // status (bounded) until a node is flagged: the slow one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (text, slow) = loop {
        let out = Command::new(RDZV).args(["status", &url]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let slow: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("slow "))
            .map(str::to_string)
            .collect();
        if !slow.is_empty() || std::time::Instant::now() > deadline {
            break (text, slow);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert_eq!(
        slow.len(),
        1,
        "{text}\n---\n{}\n---\n{}",
        nodes[0].output(),
        nodes[1].output()
    );
    assert!(slow[0].contains(&format!("/{slow_id}:")), "{text}");
    let ratio = number_after(&slow[0], "s per step, ");
    assert!(ratio > 3.0, "{text}");
    for l in nodes.iter_mut() {
        l.signal(libc::SIGTERM);
        l.exit(30);
    }
}

/// The node id a launcher joined as (its "joining run ... as node ID" line).
fn node_id(l: &Launcher) -> String {
    let line = l.line_with_or_panic("as node ");
    let at = line.find("as node ").unwrap() + "as node ".len();
    line[at..].split_whitespace().next().unwrap().to_string()
}

/// A job that ends slowly after its last heartbeat: `how` the worker ends.
fn slow_exit_is_no_hang(how: &str) {
    let s = Scratch::new();
    let mut l = s.run(
        &[
            "--standalone",
            "--hang-timeout",
            "1.5",
            "--max-restarts",
            "0",
        ],
        "slow-exit",
        &[("EXIT_HOW", how), ("SLOW_S", "3")],
    );
    assert_eq!(code(l.exit(60)), 0, "{how}: {}", l.output());
    assert!(!l.said("hang:"), "{how}: {}", l.output());
    l.line_with_or_panic("DONE rank=0 attempt=0 monitored=True");
}

#[test]
fn a_worker_that_pauses_before_a_long_end_is_not_hung() {
    slow_exit_is_no_hang("pause");
}

#[test]
fn an_interpreter_whose_exit_outlasts_the_timeout_is_not_hung() {
    slow_exit_is_no_hang("teardown");
}

#[test]
fn nvrx_shutdown_workload_monitoring_pauses_the_monitor() {
    slow_exit_is_no_hang("nvrx");
}

#[test]
fn a_c_worker_that_exits_slowly_is_not_hung() {
    // exit() runs the handler registered before the first heartbeat after rdzv's own, which
    // pauses monitoring: the slow handler's silence is no hang.
    const SLOW: &str = r#"
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
static void slow_end(void) { sleep(3); }
int main(void) {
    void *lib = dlopen(getenv("RDZV_LIB"), RTLD_NOW);
    if (!lib) return 2;
    void (*heartbeat)(void) = (void (*)(void))dlsym(lib, "rdzv_heartbeat");
    atexit(slow_end);
    for (int i = 0; i < 20; i++) { heartbeat(); usleep(20000); }
    return 0;
}
"#;
    let s = Scratch::new();
    let source = s.path("slow.c");
    std::fs::write(&source, SLOW).unwrap();
    let program = s.path("slow");
    let built = Command::new("cc")
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(built.success());
    let mut cmd = Command::new(RDZV);
    cmd.args([
        "run",
        "--standalone",
        "--hang-timeout",
        "1.5",
        "--max-restarts",
        "0",
    ])
    .arg(&program)
    .env("RDZV_LIB", library());
    clean_env(&mut cmd);
    let mut l = Launcher::spawn_in_own_tmpdir(cmd);
    assert_eq!(code(l.exit(60)), 0, "{}", l.output());
    assert!(!l.said("hang:"), "{}", l.output());
}

#[test]
fn under_auto_the_first_checkpoint_of_a_job_is_not_a_hang() {
    // Steps of 0.1 s learn the 5 s floor; the first checkpoint takes 6.5 s and has never
    // ended before, so nothing was learned of it.
    let cases = [
        &["--hang-timeout", "auto"][..],
        &[
            "--hang-timeout",
            "2",
            "--section-timeout",
            "checkpoint=auto",
        ][..],
    ];
    // The two at once: each waits out its checkpoint.
    std::thread::scope(|scope| {
        for flags in cases {
            scope.spawn(move || first_checkpoint(flags));
        }
    });
}

fn first_checkpoint(flags: &[&str]) {
    {
        let s = Scratch::new();
        let mut all = vec!["--standalone", "--max-restarts", "0"];
        all.extend_from_slice(flags);
        let mut l = s.run(&all, "first-checkpoint", &[("CKPT_S", "6.5")]);
        assert_eq!(code(l.exit(60)), 0, "{flags:?}: {}", l.output());
        assert!(!l.said("hang:"), "{flags:?}: {}", l.output());
        l.line_with_or_panic("DONE rank=0 attempt=0 monitored=True");
    }
}

/// A page the worker damages (`what`): the launcher says so, does not die, and holds the
/// worker to its timeout from its last progress.
fn damaged_page(what: &str) -> Launcher {
    let s = Scratch::new();
    let mut l = s.run(
        &[
            "--standalone",
            "--hang-timeout",
            "1.5",
            "--max-restarts",
            "0",
        ],
        "damage",
        &[("DAMAGE", what)],
    );
    l.exit(60);
    l
}

#[test]
fn a_worker_that_damages_its_page_is_reported_and_held_to_its_timeout() {
    std::thread::scope(|scope| {
        for what in ["truncate", "random", "future", "unlink"] {
            scope.spawn(move || damaged_page_is_handled(what));
        }
    });
}

fn damaged_page_is_handled(what: &str) {
    if what == "unlink" {
        // An unlinked page is still the worker's: it goes on being read, and the job succeeds.
        let mut l = damaged_page("unlink");
        assert_eq!(code(l.exit(5)), 0, "{}", l.output());
        assert!(!l.said("hang:") && !l.said("damaged"), "{}", l.output());
        return;
    }
    {
        let mut l = damaged_page(what);
        let status = l.exit(5);
        // The launcher lived to fail the job (a truncated mapped page was SIGBUS, 135).
        assert_eq!(code(status), 1, "{what}: {}", l.output());
        let warning = l.line_with_or_panic("its progress page is damaged (");
        assert!(warning.contains("warning: rank 0"), "{what}: {warning}");
        let hang = l.line_with_or_panic("hang: rank 0");
        assert!(
            hang.contains("(timeout 1.5 s, its progress page is damaged;"),
            "{what}: {hang}"
        );
        assert!(
            number_after(&hang, "made no progress for ") >= 1.5,
            "{hang}"
        );
    }
}

/// Two nodes of two workers; rank 3 (on the second node) hangs `how`, the collective marked
/// as a section or not. Returns every verdict line, the hang's note and the launchers.
fn ring(how: &str, mark: &str) -> (Vec<String>, serde_json::Value, Vec<Launcher>) {
    let etcd = Etcd::start();
    let url = etcd.url(&format!("ring-{how}-{mark}"), "min_nodes=2&max_nodes=2");
    let s = Scratch::new();
    let flags = [
        "--rdzv",
        &url,
        "--nproc-per-node",
        "2",
        "--hang-timeout",
        "2",
        "--max-restarts",
        "1",
    ];
    let env = [
        ("STEPS", "50"),
        ("HOW", how),
        ("MARK", mark),
        ("HANG_RANK", "3"),
    ];
    let mut nodes: Vec<Launcher> = (0..2).map(|_| s.run(&flags, "ring", &env)).collect();
    nodes[0].wait_line(60, |l| l.contains("round 1 formed"));
    let status = Command::new(RDZV)
        .args(["status", "--json", &url])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let note: serde_json::Value =
        serde_json::from_str(status["notes"]["hang"].as_str().expect("a hang note")).unwrap();
    for l in nodes.iter_mut() {
        assert_eq!(code(l.exit(90)), 0, "{how}/{mark}: {}", l.output());
    }
    let verdicts: Vec<String> = nodes
        .iter()
        .flat_map(|l| {
            l.lines_with("hang: ")
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|l| l.contains("hang: suspect:") || l.contains("hang: waiting on it:"))
        .collect();
    assert!(
        verdicts.iter().any(|v| v.contains("hang: suspect:")),
        "{how}/{mark}: no verdict\n{}\n---\n{}",
        nodes[0].output(),
        nodes[1].output()
    );
    // Every node's evidence is in the note: all four ranks, on both hosts' launchers.
    let evidence = note["evidence"].as_object().expect("evidence by rank");
    assert_eq!(evidence.len(), 4, "{note}");
    (verdicts, note, nodes)
}

/// The verdict is certain and names rank 3, the others its victims.
fn names_rank_3(how: &str, mark: &str) {
    let (verdicts, note, _) = ring(how, mark);
    let suspect = &note["verdict"]["suspect"];
    assert_eq!(suspect["rank"], 3, "{how}/{mark}: {note}");
    assert_eq!(note["verdict"]["uncertain"], false, "{note}");
    let victims: Vec<u64> = note["verdict"]["victims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(victims.len(), 3, "{note}");
    assert!(
        !victims.contains(&3),
        "the suspect among its victims: {note}"
    );
    for v in verdicts.iter().filter(|v| v.contains("suspect:")) {
        assert!(v.contains("suspect: rank 3 (local rank 1 on "), "{v}");
    }
}

#[test]
fn with_sections_a_sleeping_rank_outside_the_collective_is_the_suspect() {
    names_rank_3("sleep", "sections");
}

#[test]
fn with_sections_a_rank_hung_in_c_holding_the_gil_is_the_suspect() {
    names_rank_3("c", "sections");
}

#[test]
fn a_stopped_rank_is_the_suspect_with_sections_or_without() {
    std::thread::scope(|scope| {
        scope.spawn(|| names_rank_3("stop", "sections"));
        scope.spawn(|| names_rank_3("stop", "none"));
    });
}

#[test]
fn with_heartbeats_alone_the_verdict_names_the_hung_rank_or_says_it_is_uncertain() {
    std::thread::scope(|scope| {
        for how in ["sleep", "c"] {
            scope.spawn(move || named_or_uncertain(how));
        }
    });
}

fn named_or_uncertain(how: &str) {
    {
        let (_, note, _) = ring(how, "none");
        let v = &note["verdict"];
        if v["suspect"]["rank"] != 3 {
            // Every rank's last heartbeat was in the same step: only milliseconds part them,
            // and the verdict must say so, with the hung rank among those alike.
            assert_eq!(
                v["uncertain"], true,
                "{how}: a wrong suspect, certain: {note}"
            );
            let alike: Vec<u64> = v["because"]["alike"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap())
                .collect();
            assert!(alike.contains(&3), "{how}: {note}");
        }
    }
}

#[test]
fn every_worker_of_a_round_gets_the_jobs_restart_count_and_directory() {
    let etcd = Etcd::start();
    let url = etcd.url("counts", "min_nodes=2&max_nodes=2");
    let s = Scratch::new();
    let flags = ["--rdzv", &url, "--max-restarts", "2"];
    let env = [("CRASH_RANK", "1")];
    let mut nodes: Vec<Launcher> = (0..2).map(|_| s.run(&flags, "counts", &env)).collect();
    for l in nodes.iter_mut() {
        assert_eq!(code(l.exit(90)), 0, "{}", l.output());
    }
    // Rank 1's crash spent the job's one restart; the node that did not fail re-formed
    // without spending, and its worker is still told the job's count, in the same directory.
    for l in &nodes {
        let last = l
            .lines_with("COUNT rank=")
            .last()
            .unwrap_or_else(|| panic!("{}", l.output()))
            .to_string();
        assert!(
            last.contains("count=1 dir=attempt_1"),
            "{last}\n{}",
            l.output()
        );
    }
}

#[test]
fn a_restart_refunded_for_a_lost_peer_is_not_charged_again() {
    // Node B vanishes (launcher and workers SIGKILLed, no watchdog): A's worker fails at once,
    // before B's lease expires, so A spends its one restart; the next round, without B,
    // gives it back. A real failure then still has that restart. The lease is long enough
    // (6 s) that a loaded machine still sees the failure first: with 2 s, 2 runs of 5 beside
    // stress-ng saw the loss first, spent nothing, and had nothing to refund. The peer watch
    // is off (peer_timeout=0): it would find B dead within a second, before A's worker fails.
    let etcd = Etcd::start();
    let url = etcd.url(
        "refund",
        "min_nodes=1&max_nodes=2&lease_ttl=6&last_call_timeout=0.5&peer_timeout=0",
    );
    let s = Scratch::new();
    let flags = ["--rdzv", &url, "--max-restarts", "1", "--no-watchdog"];
    let mut a = s.run(&flags, "peer-lost", &[]);
    a.wait_line(60, |l| l.contains("round 0 formed"));
    let mut b = s.run(&flags, "peer-lost", &[]);
    // Both workers of the round of two run; then B dies whole.
    for l in [&mut a, &mut b] {
        l.wait_line(60, |l| l.contains("STARTED") && l.contains("world=2"));
    }
    b.kill_node();
    assert_eq!(code(a.exit(90)), 0, "{}", a.output());
    a.line_with_or_panic("PEER GONE");
    a.line_with_or_panic("restart refunded");
    a.line_with_or_panic("REAL FAILURE");
    assert!(
        a.said("restarting the worker group (restart 1 of 1)"),
        "{}",
        a.output()
    );
}
