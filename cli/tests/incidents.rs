//! The incident records, end to end: real launchers on a real etcd, Python workers that step
//! every 50 ms and call `rdzv.heartbeat()`, a scripted fault. Each test measures the fault's
//! moments from outside (the worker's own stamp of its crash, the launchers' "round formed"
//! lines as they arrive, the workers' stamps of their first step after it) and holds the
//! record `rdzv status --json` shows to them within 100 ms, as `docs/EVENTS.md` promises, and
//! the effective training time to the intervals the workers' stamps give.

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{Launcher, RDZV};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Steps of 50 ms, each stamped after its heartbeat; `CRASH_RANK` crashes at step 20 of the
/// first attempt, stamping it first, `HANG_RANK` hangs there; every attempt ends once `DONE`
/// exists.
const WORKER: &str = r#"
import os, sys, time
import rdzv

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
crash_rank = int(os.environ.get("CRASH_RANK", "-1"))
hang_rank = int(os.environ.get("HANG_RANK", "-1"))
step = 0
while not os.path.exists(os.environ["DONE"]):
    time.sleep(0.05)
    if rank == crash_rank and attempt == 0 and step == 20:
        print(f"CRASH rank={rank} t={time.time_ns() // 1_000_000}", flush=True)
        os._exit(1)
    if rank == hang_rank and attempt == 0 and step == 20:
        print(f"HANGING rank={rank}", flush=True)
        time.sleep(3600)
    rdzv.heartbeat()
    print(f"STEP rank={rank} attempt={attempt} step={step} t={time.time_ns() // 1_000_000}", flush=True)
    step += 1
"#;

/// What `docs/EVENTS.md` promises: a record's durations agree with the outside's to this.
const AGREE_MS: i64 = 100;

fn wall_ms() -> i64 {
    unix_ms(SystemTime::now())
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The number after `key=` in `line`.
fn field(line: &str, key: &str) -> i64 {
    let want = format!("{key}=");
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(want.as_str()))
        .and_then(|v| v.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

struct Job {
    dir: PathBuf,
    url: String,
}

impl Job {
    fn new(etcd: &Etcd, name: &str, query: &str) -> Job {
        let dir = launch::fresh_dir(&format!("rdzv-incidents-{name}"));
        std::fs::write(dir.join("worker.py"), WORKER).unwrap();
        let url = etcd.url(name, query);
        Job { dir, url }
    }

    /// `rdzv run` of one worker, its events in `events-{i}.jsonl` (which gives the workers
    /// progress pages).
    fn node(&self, i: usize, flags: &[&str], env: &[(&str, &str)]) -> Launcher {
        let lib = Path::new(RDZV).with_file_name("librdzv.so");
        assert!(lib.exists(), "{}: cargo build first", lib.display());
        let mut cmd = Command::new(RDZV);
        cmd.args(["run", "--rdzv", &self.url, "--nproc-per-node=1"])
            .arg("--events-file")
            .arg(self.dir.join(format!("events-{i}.jsonl")))
            .args(flags)
            .arg(self.dir.join("worker.py"))
            .env("PYTHONPATH", repo().join("bindings/python"))
            .env("RDZV_LIBRARY", lib)
            .env("DONE", self.dir.join("done"))
            .envs(env.iter().copied());
        for (k, _) in std::env::vars() {
            if k.starts_with("PET_") || k.starts_with("RDZV_HANG") {
                cmd.env_remove(k);
            }
        }
        cmd.env_remove("TORCHELASTIC_ERROR_FILE");
        Launcher::spawn_in_own_tmpdir(cmd)
    }

    fn done(&self) {
        std::fs::write(self.dir.join("done"), b"").unwrap();
    }

    fn status(&self) -> Value {
        let out = Command::new(RDZV)
            .args(["status", "--json", &self.url])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `rdzv status --json` once its incidents show `count` records, within `secs`.
    fn status_with_records(&self, count: usize, secs: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.status();
            let records = s["incidents"]["records"].as_array().map_or(0, Vec::len);
            if records >= count {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no {count} incident record(s) in {s:#}"
            );
            // Polled: the record is written by whichever node reports last, in etcd.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The wall time at which `l`'s next "round N formed" line arrived from its pipe (whenever
/// the test reads it), and its node rank.
fn formed(l: &mut Launcher, secs: u64) -> (i64, i64) {
    let (line, arrived) = l.wait_line_at(secs, |l| l.contains(" formed: node rank"));
    let at = unix_ms(arrived);
    let rank = line
        .split("node rank ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no node rank in {line:?}"));
    (at, rank)
}

/// The stamp of `l`'s worker's first step of `attempt`.
fn first_step(l: &mut Launcher, attempt: i64, secs: u64) -> i64 {
    let want = format!("attempt={attempt} step=0 ");
    field(
        &l.wait_line(secs, |l| l.contains("STEP ") && l.contains(&want)),
        "t",
    )
}

/// When every node's next "round formed" line arrived, and the latest first step of `attempt`
/// among their workers.
fn recovered(nodes: &mut [Launcher], attempt: i64) -> (i64, i64) {
    let reformed = nodes.iter_mut().map(|l| formed(l, 30).0).max().unwrap();
    let stepping = nodes
        .iter_mut()
        .map(|l| first_step(l, attempt, 30))
        .max()
        .unwrap();
    (reformed, stepping)
}

/// A record's time or duration, in milliseconds.
fn ms(rec: &Value, key: &str) -> i64 {
    rec[key]
        .as_i64()
        .unwrap_or_else(|| panic!("no {key} in {rec:#}"))
}

fn near(what: &str, record: i64, outside: i64, record_json: &Value) {
    eprintln!("{what}: the record {record} ms, from outside {outside} ms");
    assert!(
        (record - outside).abs() <= AGREE_MS,
        "{what}: the record says {record} ms, measured from outside {outside} ms (more than {AGREE_MS} ms apart): {record_json:#}"
    );
}

#[test]
fn a_crash_is_recorded_with_the_durations_measured_from_outside() {
    let etcd = Etcd::start();
    let job = Job::new(
        &etcd,
        "crash",
        "min_nodes=2&max_nodes=2&last_call_timeout=1",
    );
    let env = [("CRASH_RANK", "1")];
    let mut nodes: Vec<Launcher> = (0..2)
        .map(|i| job.node(i, &["--max-restarts=1"], &env))
        .collect();
    let mut first = Vec::new();
    let mut crashing = 0;
    for (i, l) in nodes.iter_mut().enumerate() {
        if formed(l, 30).1 == 1 {
            crashing = i;
        }
        first.push(first_step(l, 0, 30));
    }
    // The crash, from the worker's own stamp (one worker a node: its rank is the node's).
    let crash = field(
        &nodes[crashing].wait_line(30, |l| l.contains("CRASH ")),
        "t",
    );
    let (reformed, stepping) = recovered(&mut nodes, 1);
    let status = job.status_with_records(1, 20);
    let rec = &status["incidents"]["records"][0];
    assert_eq!(rec["kind"], "crash", "{rec:#}");
    assert_eq!(rec["rank"], 1, "{rec:#}");
    near("fault", ms(rec, "fault_ms"), crash, rec);
    near(
        "to the new round",
        ms(rec, "reform_ms"),
        reformed - crash,
        rec,
    );
    near(
        "to every rank stepping",
        ms(rec, "first_step_ms"),
        stepping - crash,
        rec,
    );
    assert!(
        ms(rec, "detect_ms") <= ms(rec, "decide_ms")
            && ms(rec, "decide_ms") <= ms(rec, "reform_ms"),
        "{rec:#}"
    );

    // The effective time: every rank stepping from the first step of attempt 0 to the crash,
    // and from the first step of attempt 1 to the status's reading.
    let read_at = wall_ms();
    let eff = &status["incidents"]["effective_training"];
    let (share, wall) = (
        eff["share"].as_f64().unwrap(),
        eff["wall_ms"].as_i64().unwrap(),
    );
    assert_eq!(eff["from"], "steps", "{eff:#}");
    let began: i64 = status["notes"]["incident/began_ms"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no began_ms in {status:#}"));
    let first_all = first.iter().copied().max().unwrap();
    let trained = (crash - first_all) + (began + wall - stepping);
    near("trained", (share * wall as f64) as i64, trained, &status);
    assert!(began + wall <= read_at, "{eff:#}");

    // The table says it on a line, and the event carries the same record.
    let table = Command::new(RDZV)
        .args(["status", &job.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("incidents 1"), "{table}");
    assert!(table.contains(": crash of rank 1 on "), "{table}");
    assert!(table.contains("% of "), "{table}");
    job.done();
    for l in &mut nodes {
        assert_eq!(l.exit(30).code(), Some(0), "{}", l.output());
    }
    let events: Vec<Value> = (0..2)
        .flat_map(|i| {
            std::fs::read_to_string(job.dir.join(format!("events-{i}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .filter(|e| e["name"] == "rdzv.incident")
        .collect();
    assert_eq!(events.len(), 1, "one node writes the record: {events:#?}");
    assert_eq!(events[0]["metadata"]["fault_ms"], rec["fault_ms"]);
}

#[test]
fn a_node_killed_whole_is_recorded_as_lost_with_its_eviction() {
    let etcd = Etcd::start();
    // The default lease (10 s): the peer watch finds the dead node, not its lease.
    let job = Job::new(&etcd, "lost", "min_nodes=1&max_nodes=2&last_call_timeout=1");
    // No watchdog: it would release the killed launcher's node at once, before any peer.
    let mut nodes: Vec<Launcher> = (0..2)
        .map(|i| job.node(i, &["--no-watchdog"], &[]))
        .collect();
    for l in &mut nodes {
        formed(l, 30);
    }
    for l in &mut nodes {
        first_step(l, 0, 30);
    }
    let mut victim = nodes.pop().unwrap();
    let victim_id = node_id(&mut victim);
    let mut survivor = nodes.pop().unwrap();
    let killed = wall_ms();
    victim.kill_node();
    let (reformed, _) = formed(&mut survivor, 30);
    // Its worker restarts alone (restart count 0: a loss spends no restart).
    let stepping = first_step(&mut survivor, 0, 30);
    let status = job.status_with_records(1, 20);
    let rec = &status["incidents"]["records"][0];
    assert_eq!(rec["kind"], "lost", "{rec:#}");
    assert_eq!(rec["node"], victim_id.as_str(), "{rec:#}");
    assert!(rec["evicted_by"].is_string(), "{rec:#}");
    // The fault is its last answer to a probe: at most one probe period (200 ms) before the
    // kill.
    let fault = ms(rec, "fault_ms");
    assert!(
        fault <= killed + AGREE_MS && fault >= killed - 200 - AGREE_MS,
        "killed at {killed}: {rec:#}"
    );
    near(
        "new round, from the kill",
        ms(rec, "reformed_ms") - killed,
        reformed - killed,
        rec,
    );
    near(
        "stepping, from the kill",
        ms(rec, "stepping_ms") - killed,
        stepping - killed,
        rec,
    );
    assert!(
        ms(rec, "decide_ms") <= 2000,
        "evicted within the 2 s of DESIGN: {rec:#}"
    );
    let table = Command::new(RDZV)
        .args(["status", &job.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains(": lost on "), "{table}");
    eprintln!("{table}");
    job.done();
    assert_eq!(survivor.exit(30).code(), Some(0), "{}", survivor.output());
}

#[test]
fn a_hang_is_recorded_from_the_suspects_last_step() {
    let etcd = Etcd::start();
    let job = Job::new(&etcd, "hang", "min_nodes=2&max_nodes=2&last_call_timeout=1");
    let flags = ["--max-restarts=1", "--hang-timeout=2"];
    let mut nodes: Vec<Launcher> = (0..2)
        .map(|i| job.node(i, &flags, &[("HANG_RANK", "1")]))
        .collect();
    let mut hanging = 0;
    for (i, l) in nodes.iter_mut().enumerate() {
        if formed(l, 30).1 == 1 {
            hanging = i;
        }
    }
    let hung = &mut nodes[hanging];
    let last_step = field(&hung.wait_line(30, |l| l.contains("step=19 ")), "t");
    hung.wait_line(30, |l| l.contains("HANGING "));
    // The launcher that finds the hang (the hung worker's) says so as it declares it.
    hung.wait_line(30, |x| x.contains("hang: rank 1 "));
    let declared = wall_ms();
    let (reformed, stepping) = recovered(&mut nodes, 1);
    let status = job.status_with_records(1, 20);
    let rec = &status["incidents"]["records"][0];
    assert_eq!(rec["kind"], "hang", "{rec:#}");
    assert_eq!(
        (&rec["rank"], &rec["suspect"]),
        (&1.into(), &1.into()),
        "{rec:#}"
    );
    near("fault (the last step)", ms(rec, "fault_ms"), last_step, rec);
    near("detected", ms(rec, "detect_ms"), declared - last_step, rec);
    // Nobody waits out a bound of the hang protocol: the finder once waited for its own
    // evidence, which it never shares, until 3 s after the detection (the evidence's bound and
    // the gathering's); without that wait the next round comes 0.1 s after it on a quiet
    // machine, and 1.7 s with three other lanes of these tests beside it.
    assert!(
        ms(rec, "reform_ms") - ms(rec, "detect_ms") < 2900,
        "the next round waited out a bound: {rec:#}"
    );
    near(
        "to the new round",
        ms(rec, "reform_ms"),
        reformed - last_step,
        rec,
    );
    near(
        "to every rank stepping",
        ms(rec, "first_step_ms"),
        stepping - last_step,
        rec,
    );
    job.done();
    for l in &mut nodes {
        assert_eq!(l.exit(30).code(), Some(0), "{}", l.output());
    }
}

/// The node id `l` says it runs as (its "as node ID" line, waited for).
fn node_id(l: &mut Launcher) -> String {
    let line = l.wait_line(30, |l| l.contains("as node "));
    line.split("as node ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no node id in {line:?}"))
}

/// Waits for `first` and `joining` to train together, and holds the job's record `index` to it:
/// a node admitted. Returns `joining`'s node id.
fn admitted(job: &Job, first: &mut Launcher, joining: &mut Launcher, index: usize) -> String {
    let id = node_id(joining);
    let reformed = formed(first, 30).0.max(formed(joining, 30).0);
    // A change of members spends no restart: both workers are at attempt 0.
    let stepping = first_step(first, 0, 30).max(first_step(joining, 0, 30));
    let status = job.status_with_records(index + 1, 20);
    let rec = &status["incidents"]["records"][index];
    assert_eq!(rec["kind"], "admitted", "{rec:#}");
    near("new round", ms(rec, "reformed_ms"), reformed, rec);
    near("every rank stepping", ms(rec, "stepping_ms"), stepping, rec);
    id
}

/// Waits for `first` to train alone after `left` ended with `code`, and holds the job's record
/// `index` to it: `kind` on the node that left, `node_id`.
fn left(
    job: &Job,
    first: &mut Launcher,
    left: &mut Launcher,
    node_id: &str,
    code: i32,
    kind: &str,
    index: usize,
) {
    assert_eq!(left.exit(30).code(), Some(code), "{}", left.output());
    let reformed = formed(first, 30).0;
    let stepping = first_step(first, 0, 30);
    let status = job.status_with_records(index + 1, 20);
    let rec = &status["incidents"]["records"][index];
    assert_eq!(rec["kind"], kind, "{rec:#}");
    assert!(
        rec["node"].as_str().is_some_and(|n| n.ends_with(node_id)),
        "the node that left, {node_id}: {rec:#}"
    );
    near("new round", ms(rec, "reformed_ms"), reformed, rec);
    near("every rank stepping", ms(rec, "stepping_ms"), stepping, rec);
}

/// The membership's incidents: a node admitted, a node that fails its health check (it drains
/// itself), another admitted, and one drained by `rdzv drain`.
#[test]
fn nodes_admitted_drained_and_unhealthy_are_each_recorded() {
    let etcd = Etcd::start();
    let job = Job::new(
        &etcd,
        "members",
        "min_nodes=1&max_nodes=2&last_call_timeout=1",
    );
    let mut first = job.node(0, &[], &[]);
    formed(&mut first, 30);
    first_step(&mut first, 0, 30);

    let sick = job.dir.join("sick");
    let check = format!("test ! -e {}", sick.display());
    let health = ["--health-check", &check, "--health-check-interval", "0.2"];
    let mut unhealthy = job.node(1, &health, &[]);
    let id = admitted(&job, &mut first, &mut unhealthy, 0);
    std::fs::write(&sick, b"").unwrap();
    left(&job, &mut first, &mut unhealthy, &id, 1, "health", 1);

    let mut drained = job.node(2, &[], &[]);
    let id = admitted(&job, &mut first, &mut drained, 2);
    let out = Command::new(RDZV)
        .args(["drain", &job.url, &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    left(&job, &mut first, &mut drained, &id, 0, "drained", 3);
    job.done();
    assert_eq!(first.exit(30).code(), Some(0), "{}", first.output());
}
