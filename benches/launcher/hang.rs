//! The hang case (`--case hang`): from a worker's hang to every rank stepping again.
//!
//! A job of `--nnodes=N`, one worker per node (`benches/workers/hang_worker.py`): gloo on CPU
//! through torch.distributed, a small all_reduce and a heartbeat per step. The last rank hangs once
//! in the job, after step `STEP`, writing the wall-clock time first; its peers block in the next
//! all_reduce. From that stamp, per run (each a wall-clock time, compared with the workers'):
//!
//! - *detected*: the launcher says so (`rdzv run`'s `hang:` line; `ft_launcher`'s rank monitor
//!   logs "Did not get subsequent heartbeat" where its output reaches the node's);
//! - *killed*: the hung worker's process is gone (polled in /proc, every 10 ms);
//! - *round*: every node's launcher formed the next round (`rdzv run`'s "round N formed",
//!   `ft_launcher`'s "has joined the rendezvous ... in a world of size N");
//! - *started*, *imported*, *init*: the last rank of the next attempt started, had `import
//!   torch` done, had its process group;
//! - *step*: the last rank of the next attempt completed its first all_reduce: the total.
//!
//! Each column is the median over `RUNS` runs of that time (so columns need not add up).
//! Launchers: `rdzv run --hang-timeout 5` on the benchmark's etcd, with the worker calling
//! `rdzv.heartbeat()`; NVIDIA's `ft_launcher` (nvidia-resiliency-ext, `RDZV_NVRX_PYTHON`) with
//! its c10d backend and a heartbeat timeout of 5 s, the worker calling NVRx's
//! `RankMonitorClient.send_heartbeat()`; and torchrun (c10d), which has no hang detection,
//! once: it shows that nothing happens within `LIMIT`.

use super::{launch, rdzv_binary, Event, Kind, Target, LAUNCH_LIMIT};
use rdzv_bench::stats::{median_or_none, millis};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// The hang timeout both monitoring launchers get.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// How long the job gets from the hang to every rank stepping again.
const LIMIT: Duration = Duration::from_secs(60);
/// Runs per launcher and node count.
const RUNS: usize = 5;
/// torchrun never recovers: one run shows it.
const TORCHRUN_RUNS: usize = 1;
/// The step after which the last rank hangs: past NVRx's warm-up (5 iterations), a second of
/// steps of 50 ms into the job.
const STEP: u32 = 20;
/// The interval at which NVRx's rank monitor checks its rank (`workload_check_interval`, 5 s
/// by default): `rdzv run`'s monitor interval in this benchmark, so that the comparison is
/// of what follows a detection, not of how often each looks.
const NVRX_CHECK_INTERVAL: &str = "0.1";

/// The hang case's worker.
pub fn worker() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/workers/hang_worker.py")
}

/// `ft_launcher`'s fault-tolerance flags: a heartbeat timeout of `TIMEOUT` once a rank sent its
/// first heartbeat and none before it (as `rdzv run` watches a worker from its first call).
pub fn ft_launcher_flags() -> Vec<String> {
    vec![
        format!("--ft-rank-heartbeat-timeout={}", TIMEOUT.as_secs()),
        "--ft-initial-rank-heartbeat-timeout=null".into(),
        format!("--ft-workload-check-interval={NVRX_CHECK_INTERVAL}"),
    ]
}

/// The worker's environment for a run in `dir` of `n` nodes under `kind`.
pub fn worker_env(c: &mut Command, kind: Kind, dir: &Path, n: usize) {
    let progress = match kind {
        Kind::Rdzv | Kind::RdzvNoWatchdog | Kind::RdzvC10d => "rdzv",
        Kind::FtLauncher => "nvrx",
        Kind::TorchrunC10d | Kind::TorchrunEtcdV3 => "none",
    };
    // rdzv's Python binding from this checkout, on the library built with this benchmark.
    let package = concat!(env!("CARGO_MANIFEST_DIR"), "/../bindings/python");
    c.env("HANG_WORKER_DIR", dir)
        .env("HANG_WORKER_PROGRESS", progress)
        .env("HANG_WORKER_RANK", (n - 1).to_string())
        .env("HANG_WORKER_STEP", STEP.to_string())
        .env("RDZV_LIBRARY", rdzv_binary().with_file_name("librdzv.so"))
        .env("PYTHONPATH", package);
}

/// A line in which a launcher says it found a hung worker: `rdzv run`'s, or NVRx's rank
/// monitor's.
pub fn detected(line: &str) -> bool {
    line.contains("rdzv: error: hang: ") || line.contains("Did not get subsequent heartbeat")
}

/// The world size in `ft_launcher`'s line saying its node joined a round (its barrier
/// rendezvous: "has joined the rendezvous 'ID' as rank R in a world of size N.").
pub fn ft_launcher_joined(line: &str) -> Option<u32> {
    if !line.contains("ft_rendezvous_barrier") {
        return None;
    }
    let world = line.split(" in a world of size ").nth(1)?;
    world.trim_end().trim_end_matches('.').parse().ok()
}

/// `rdzv run`'s verdict line (`hang: suspect: rank R (...`): the rank, and whether the
/// verdict says it is uncertain.
pub fn suspect(line: &str) -> Option<Event> {
    let rest = line.split("hang: suspect: rank ").nth(1)?;
    let rank = rest.split_whitespace().next()?.parse().ok()?;
    Some(Event::Suspect(rank, line.contains("uncertain")))
}

/// A line that says something failed: the reason shown when a launcher cannot run the case.
pub fn failure(line: &str) -> bool {
    line.contains("Error") || line.contains("error:") || line.contains("ERROR")
}

/// One run: the times of `COLUMNS` after the hang (`None`: not seen within `LIMIT`).
type HangRun = [Option<Duration>; 7];

const COLUMNS: [&str; 7] = [
    "detected", "killed", "round", "started", "imported", "init", "step",
];

/// A wall-clock time from the `repr(time.time())` the worker wrote.
fn wall(secs: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs)
}

/// The hang's stamp: its time and the hung worker's pid.
fn stamp(dir: &Path) -> Option<(SystemTime, i32)> {
    let text = std::fs::read_to_string(dir.join("hang")).ok()?;
    let mut fields = text.split_whitespace();
    let at = wall(fields.next()?.parse().ok()?);
    Some((at, fields.next()?.parse().ok()?))
}

/// Whether a process still runs (a zombie does not: it is dead, not yet reaped).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X"))
}

/// The workers' first steps after `after`, in a world of `n`: for every rank (the earliest
/// such file of each), its start, import done, init done and first step; `None` until every
/// rank has one.
fn first_steps(dir: &Path, after: SystemTime, n: usize) -> Option<Vec<[SystemTime; 4]>> {
    let mut ranks: Vec<Option<[SystemTime; 4]>> = vec![None; n];
    for entry in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("first-") || name.ends_with(".tmp") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let time = |k: &str| v[k].as_f64().map(wall);
        let (Some(rank), Some(world)) = (v["rank"].as_u64(), v["world"].as_u64()) else {
            continue;
        };
        let times = [
            time("start"),
            time("imported"),
            time("initialized"),
            time("stepped"),
        ];
        let Some(times) = times.into_iter().collect::<Option<Vec<_>>>() else {
            continue;
        };
        let times = [times[0], times[1], times[2], times[3]];
        if world as usize != n || rank as usize >= n || times[3] <= after {
            continue;
        }
        let slot = &mut ranks[rank as usize];
        if slot.is_none_or(|s| s[3] > times[3]) {
            *slot = Some(times);
        }
    }
    ranks.into_iter().collect()
}

/// Ends the workers of a run that are still there (a launcher killed with its group leaves
/// its workers, which it started outside that group): those that wrote a pid file in `dir` and
/// still run this benchmark's worker.
fn end_workers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_string_lossy()
            .strip_prefix("pid-")
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("hang_worker.py") {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One run of `n` nodes under `kind`: the times after the hang, or why there was no hang
/// (the workers never reached it within `LAUNCH_LIMIT`: the last failure a launcher printed).
fn one_run(kind: Kind, target: &Target, n: usize) -> Result<HangRun, String> {
    let dir = target.hang.as_ref().expect("a hang-case target");
    std::fs::create_dir_all(dir).unwrap();
    let (tx, rx) = mpsc::channel();
    // Launchers' lines arrive with an Instant: this pair turns one into a wall-clock time.
    let (base, base_wall) = (Instant::now(), SystemTime::now());
    let to_wall = |at: Instant| base_wall + at.saturating_duration_since(base);
    let mut launchers = launch(kind, target, n, &tx);
    let mut lines: Vec<(usize, SystemTime, Event)> = Vec::new();
    let mut last_failure = None;
    let drain = |lines: &mut Vec<_>, last_failure: &mut Option<String>| {
        while let Ok((i, at, ev)) = rx.try_recv() {
            if let Event::Failure(line) = &ev {
                *last_failure = Some(line.clone());
            }
            lines.push((i, to_wall(at), ev));
        }
    };
    // The stamp is a file the worker writes: polled, as nothing announces it.
    let deadline = Instant::now() + LAUNCH_LIMIT;
    let hang = loop {
        drain(&mut lines, &mut last_failure);
        if let Some(h) = stamp(dir) {
            break Some(h);
        }
        let exited = launchers
            .iter_mut()
            .all(|l| l.child.try_wait().ok().flatten().is_some());
        if Instant::now() > deadline || exited {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = match hang {
        None => {
            // What the launchers said before they gave up, or the time limit.
            std::thread::sleep(Duration::from_millis(200));
            drain(&mut lines, &mut last_failure);
            Err(last_failure
                .unwrap_or_else(|| format!("no hang within {} s", LAUNCH_LIMIT.as_secs())))
        }
        Some((hung_at, pid)) => {
            let deadline = Instant::now() + LIMIT;
            let mut killed = None;
            let firsts = loop {
                drain(&mut lines, &mut last_failure);
                if killed.is_none() && !alive(pid) {
                    killed = Some(SystemTime::now());
                }
                let firsts = first_steps(dir, hung_at, n);
                if (firsts.is_some() && killed.is_some()) || Instant::now() > deadline {
                    break firsts;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            drain(&mut lines, &mut last_failure);
            let after = |t: SystemTime| t.duration_since(hung_at).unwrap_or_default();
            let detected = lines
                .iter()
                .filter(|(_, at, ev)| matches!(ev, Event::Hang) && *at >= hung_at)
                .map(|(_, at, _)| *at)
                .min();
            // Every node's first round of the full size after the hang; the last of those.
            let formed: Option<Vec<SystemTime>> = (0..n)
                .map(|i| {
                    lines
                        .iter()
                        .filter(|(j, at, ev)| {
                            *j == i
                                && *at >= hung_at
                                && matches!(ev, Event::Formed(w) if *w as usize == n)
                        })
                        .map(|(_, at, _)| *at)
                        .min()
                })
                .collect();
            let last = |k: usize| {
                let f = firsts.as_ref()?;
                f.iter().map(|t| t[k]).max().map(after)
            };
            Ok([
                detected.map(after),
                killed.map(after),
                formed.and_then(|f| f.into_iter().max()).map(after),
                last(0),
                last(1),
                last(2),
                last(3),
            ])
        }
    };
    if let Some(logs) = std::env::var_os("BENCH_LAUNCHER_LOGS") {
        let times: Vec<String> = match &result {
            Ok(run) => COLUMNS
                .iter()
                .zip(run)
                .map(|(c, t)| format!("{c} {:?}", t.map(|t| t.as_secs_f64())))
                .collect(),
            Err(why) => vec![why.clone()],
        };
        let path = Path::new(&logs).join(format!("{}.hang", target.run));
        let _ = std::fs::write(path, times.join("\n") + "\n");
    }
    end_run(kind, target, &mut launchers, dir);
    result
}

/// Ends a run: the workers told, the run closed, the launchers and what they left killed.
fn end_run(kind: Kind, target: &Target, launchers: &mut [super::Launcher], dir: &Path) {
    let _ = std::fs::write(&target.done, b"");
    if kind.is_rdzv() {
        let _ = Command::new(rdzv_binary())
            .args(["close", &target.url])
            .stdout(Stdio::null())
            .status();
    }
    for l in launchers.iter_mut() {
        l.kill_group();
    }
    // Workers notice the end within a step; the hung one's peers when its connections close.
    std::thread::sleep(Duration::from_millis(300));
    end_workers(dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// How the hung rank hangs in the suspect table, and whether the workers mark the all_reduce
/// as a section (`HANG_WORKER_HOW`, `HANG_WORKER_SECTIONS`: `workers/hang_worker.py`).
const SUSPECT_CASES: [(&str, bool); 6] = [
    ("sleep", true),
    ("c", true),
    ("stop", true),
    ("sleep", false),
    ("c", false),
    ("stop", false),
];
/// Runs per case of the suspect table.
const SUSPECT_RUNS: usize = 10;

/// One run of the suspect table: `rdzv run`'s verdict (the rank it named, and whether it said
/// it is uncertain), or why there was none (the launchers' last failure, or the time limit).
fn suspect_run(target: &Target, n: usize) -> Result<(u32, bool), String> {
    let dir = target.hang.as_ref().expect("a hang-case target");
    std::fs::create_dir_all(dir).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut launchers = launch(Kind::Rdzv, target, n, &tx);
    let deadline = Instant::now() + LAUNCH_LIMIT + LIMIT;
    let mut verdict = Err(format!(
        "no verdict within {} s",
        (LAUNCH_LIMIT + LIMIT).as_secs()
    ));
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((_, _, Event::Suspect(rank, uncertain))) => {
                verdict = Ok((rank, uncertain));
                break;
            }
            Ok((_, _, Event::Failure(line))) => verdict = Err(line),
            Ok(_) => {}
            Err(_) => {
                let exited = launchers
                    .iter_mut()
                    .all(|l| l.child.try_wait().ok().flatten().is_some());
                if exited {
                    break;
                }
            }
        }
    }
    end_run(Kind::Rdzv, target, &mut launchers, dir);
    verdict
}

/// How often `rdzv run`'s verdict names the hung rank, per way of hanging, with the
/// collective marked as a section and without.
pub fn suspect_table(sizes: &[usize], make: &dyn Fn(Kind, usize, usize) -> Target) {
    println!(
        "suspect: the same job under rdzv run, the last rank hanging {SUSPECT_RUNS} times per case: asleep (time.sleep), in C holding the GIL (ctypes.PyDLL sleep), stopped (SIGSTOP); the all_reduce marked as the section \"allreduce\" or not; the verdict's suspect: the hung rank (right), said to be uncertain, or another rank"
    );
    println!(
        "{:>5}  {:<6} {:<9} {:>5}  {:>5}  {:>16}  {:>16}  {:>14}  {:>10}",
        "nodes",
        "hang",
        "sections",
        "runs",
        "right",
        "right, uncertain",
        "wrong, uncertain",
        "wrong, certain",
        "no verdict"
    );
    for &n in sizes {
        for (case, (how, sections)) in SUSPECT_CASES.into_iter().enumerate() {
            std::env::set_var("HANG_WORKER_HOW", how);
            std::env::set_var("HANG_WORKER_SECTIONS", if sections { "1" } else { "0" });
            let hung = (n - 1) as u32;
            let mut counts = [0usize; 5];
            for r in 0..SUSPECT_RUNS {
                // A run id of its own per run (a closed run stays closed).
                let run = 1000 + case * SUSPECT_RUNS + r;
                let slot = match suspect_run(&make(Kind::Rdzv, n, run), n) {
                    Ok((rank, false)) if rank == hung => 0,
                    Ok((rank, true)) if rank == hung => 1,
                    Ok((_, true)) => 2,
                    Ok((_, false)) => 3,
                    Err(why) => {
                        println!("       {how}, sections {sections}, run {r}: {why}");
                        4
                    }
                };
                counts[slot] += 1;
            }
            println!(
                "{n:>5}  {how:<6} {:<9} {SUSPECT_RUNS:>5}  {:>5}  {:>16}  {:>16}  {:>14}  {:>10}",
                if sections { "allreduce" } else { "none" },
                counts[0],
                counts[1],
                counts[2],
                counts[3],
                counts[4]
            );
        }
    }
    std::env::remove_var("HANG_WORKER_HOW");
    std::env::remove_var("HANG_WORKER_SECTIONS");
}

/// The hang case for every launcher in `kinds` and node count in `sizes`; `unavailable`: the
/// launchers that cannot run here, with why.
pub fn table(
    sizes: &[usize],
    kinds: &[Kind],
    unavailable: &[(&str, String)],
    make: &dyn Fn(Kind, usize, usize) -> Target,
) {
    println!(
        "hang: --nnodes=N, one gloo worker per node (CPU), a 16-float all_reduce, a heartbeat \
         and 50 ms per step; rank N-1 hangs once in the job after step {STEP}; hang timeout \
         {} s (rdzv run --hang-timeout, ft_launcher --ft-rank-heartbeat-timeout with \
         workload checks every {NVRX_CHECK_INTERVAL} s), monitor 0.1 s, --max-restarts=3; \
         from the hang (the worker's stamp) to: the launcher saying so (detected), the hung \
         worker gone (killed), every node in the next round (round), and the last rank of the \
         next attempt started, past `import torch` (imported), past init_process_group \
         (init) and past its first all_reduce (step); median of {RUNS} (torchrun: \
         {TORCHRUN_RUNS}); x: step over the timeout",
        TIMEOUT.as_secs()
    );
    println!(
        "{:>5}  {:<17} {:>9}  {:>5}  {:>13}  {:>11}  {:>10}  {:>12}  {:>13}  {:>9}",
        "nodes",
        "launcher",
        "step (ms)",
        "x",
        "detected (ms)",
        "killed (ms)",
        "round (ms)",
        "started (ms)",
        "imported (ms)",
        "init (ms)"
    );
    for &n in sizes {
        assert!(
            n >= 2,
            "N must be at least 2 (one rank hangs, the others wait on it)"
        );
        for &kind in kinds {
            let runs = match kind {
                Kind::TorchrunC10d | Kind::TorchrunEtcdV3 => TORCHRUN_RUNS,
                _ => RUNS,
            };
            let mut got = Vec::new();
            let mut failed = None;
            for r in 0..runs {
                match one_run(kind, &make(kind, n, r), n) {
                    Ok(run) => got.push(run),
                    Err(why) => {
                        failed = Some(why);
                        break;
                    }
                }
            }
            if let Some(why) = failed {
                println!("{n:>5}  {:<17} did not run: {why}", kind.name());
                continue;
            }
            let none = format!("none in {} s", LIMIT.as_secs());
            let column = |k: usize| median_or_none(got.iter().map(|r| r[k]).collect());
            let show = |k: usize| match (k, column(k)) {
                (_, Some(d)) => millis(d, 0),
                // torchrun does not say when it formed a round.
                (2, None) if kind != Kind::FtLauncher && !kind.is_rdzv() => "-".to_string(),
                (_, None) => none.clone(),
            };
            let times = column(6).map_or("-".into(), |d| {
                format!("{:.2}", d.as_secs_f64() / TIMEOUT.as_secs_f64())
            });
            println!(
                "{n:>5}  {:<17} {:>9}  {times:>5}  {:>13}  {:>11}  {:>10}  {:>12}  {:>13}  {:>9}",
                kind.name(),
                show(6),
                show(0),
                show(1),
                show(2),
                show(3),
                show(4),
                show(5)
            );
        }
    }
    for (name, why) in unavailable {
        println!("{:>5}  {name:<17} not measured: {why}", "-");
    }
}
