//! What no exit reports, end to end: hung workers caught (Python and C workers, given and
//! learned timeouts), the suspect named across nodes, restarts without progress stopped,
//! health checks before a join and while training, NVRx's client names. Real launchers, real
//! workers (Python through rdzv's binding, C through the C ABI), a real etcd; every wait is
//! bounded and waits for a line or an exit.

#[path = "../../tests/common/mod.rs"]
mod common;
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

/// The library the `rdzv` under test was built with (beside it in the target directory).
fn library() -> PathBuf {
    let lib = Path::new(RDZV).with_file_name("librdzv.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build -p rdzv first",
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
    // Every node's evidence outlives the next attempt, which reuses the workers' directories.
    for l in &nodes {
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
            "3 restart(s) in a row without a worker passing step 39 (--max-no-progress-restarts 2)"
        ),
        "{stop}"
    );
    // The first attempt made progress, the next three did not: four attempts, not eleven.
    assert_eq!(l.lines_with("FAILING rank=0").count(), 4, "{}", l.output());
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
