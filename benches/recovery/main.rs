//! Recovery benchmark: from a fault to every surviving rank stepping again, launchers side by
//! side in one run. A job of N nodes x 2 workers on a local etcd (`--nnodes=N-1:N`; N:N for
//! `ft_launcher`, below), DDP on CPU through gloo, a step of about 50 ms
//! (`benches/workers/recovery_worker.py`). Faults:
//!
//! - *crash*: the job's last rank exits 1 at its 100th step (`FAULT_STEP`), or its first step
//!   after that at which the job is at rest (`arm`: with spares, once every node's is ready);
//! - *hang*: the last rank stops stepping at the same step (its peers block in the next
//!   all_reduce); the monitoring launchers' hang timeout is 5 s;
//! - *node killed*: every process of the last rank's node (the launcher and every process it
//!   started: its watchdog, its workers) SIGKILLed at once, as a machine that loses its power:
//!   all stopped first, so that none sees another die; the c10d store's node (0) is spared;
//! - *node frozen*: the same processes SIGSTOPped for `FREEZE`, longer than any detection here;
//!   the survivors must have re-formed without it before it resumes.
//!
//! The fault's wall-clock time is the worker's stamp (crash, hang) or the benchmark's own
//! (node). The end: each rank of the next world (2N after a crash or a hang, 2(N-1) after a
//! node's loss) has taken a first step in a process group formed after the fault; the time is
//! the last of those first steps (each a worker's stamp). For `rdzv run`, the split comes from
//! the job's incident record (`rdzv status --json`, docs/EVENTS.md "Incidents"): detect (fault
//! to detection), decide (to the decision), re-form (to the new round), restart (to every
//! worker running: a new process started, or a kept one handed the round), first step (to
//! every rank stepping: a new process's imports, the process group and DDP again, one step).
//!
//! Launchers: `rdzv run` as it is by default, `rdzv run --in-process-restart` (and with
//! `--in-process-spare`: a failed worker's place goes to a process that has imported torch
//! already), torchrun with
//! its c10d backend (torch 2.15) and, where an environment with nvidia-resiliency-ext exists
//! (`RDZV_NVRX_PYTHON`), NVRx 0.7.0's `ft_launcher` with its heartbeat timeout of 5 s. Every
//! launcher gets `--monitor-interval=0.1`, `--max-restarts=3`, a last call of 1 s and the
//! library's defaults otherwise (`lease_ttl` 10 s). `ft_launcher`'s barrier forms a round of
//! whichever nodes are there at once, so its jobs are N:N, and the node faults are not run
//! for it (an N:N job has no node to re-form without). With the same environment, NVRx 0.7.0's
//! `inprocess.Wrapper` around the same training function, without a launcher (each node's two
//! ranks started by a shell): it restarts the function in the surviving processes and leaves
//! a process that is gone out (a crash's next world is 2N-1), with its monitoring at 0.1 s and
//! its soft timeout at the hang timeout; on CPU with `LOCAL_RANK` unset (with it, its GPU
//! health checks are always on).
//!
//! Run with `scripts/bench.sh --recovery [--fault NAME] [--launcher NAME] [N ...]` (faults
//! `crash`, `hang`, `node-killed`, `node-frozen`; launchers `rdzv`, `rdzv-in-process`,
//! `rdzv-in-process-spare`, `torchrun`, `ft_launcher`, `nvrx-wrapper`; N = 2 by default).
//! `BENCH_RECOVERY_RUNS` runs per row (3); a row stops at its first run that does not recover. `BENCH_RECOVERY_KEEP=1` keeps every run's
//! directory (the workers' files, each node's output); a run that did not recover keeps it
//! anyway.

use rdzv_bench::stats::median_or_none;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// How long a job gets to take its first steps (N = 8 imports torch in 16 processes on the
/// machine's cores).
const LAUNCH_LIMIT: Duration = Duration::from_secs(180);
/// How long the job gets from the fault to every rank stepping again.
const LIMIT: Duration = Duration::from_secs(60);
/// How long a frozen node stays frozen.
const FREEZE: Duration = Duration::from_secs(20);
/// The steps the job takes, once armed (`arm`), before a node's fault.
const STEADY: Duration = Duration::from_secs(1);
const HANG_TIMEOUT: u64 = 5;
/// The first step at which a worker's fault can come (steps of 50 ms: 5 s of training); it
/// comes at the first step once the job is at rest as well (`arm`). At step 20 a 2-node job's
/// spare had not imported torch yet and took 2 s more; at 8 nodes on 2 cores, nor at step 100.
const FAULT_STEP: u32 = 100;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Rdzv,
    RdzvInProcess,
    RdzvInProcessSpare,
    TorchrunC10d,
    FtLauncher,
    NvrxWrapper,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Rdzv => "`rdzv run`",
            Kind::RdzvInProcess => "`rdzv run --in-process-restart`",
            Kind::RdzvInProcessSpare => "`rdzv run --in-process-restart --in-process-spare`",
            Kind::TorchrunC10d => "torchrun c10d",
            Kind::FtLauncher => "`ft_launcher`",
            Kind::NvrxWrapper => "NVRx `inprocess.Wrapper`",
        }
    }
    fn named(name: &str) -> Option<Kind> {
        Some(match name {
            "rdzv" => Kind::Rdzv,
            "rdzv-in-process" => Kind::RdzvInProcess,
            "rdzv-in-process-spare" => Kind::RdzvInProcessSpare,
            "torchrun" => Kind::TorchrunC10d,
            "ft_launcher" => Kind::FtLauncher,
            "nvrx-wrapper" => Kind::NvrxWrapper,
            _ => return None,
        })
    }
    fn is_rdzv(self) -> bool {
        matches!(
            self,
            Kind::Rdzv | Kind::RdzvInProcess | Kind::RdzvInProcessSpare
        )
    }
    fn in_process(self) -> bool {
        matches!(self, Kind::RdzvInProcess | Kind::RdzvInProcessSpare)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Crash,
    Hang,
    NodeKilled,
    NodeFrozen,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Crash => "crash",
            Fault::Hang => "hang",
            Fault::NodeKilled => "node killed",
            Fault::NodeFrozen => "node frozen",
        }
    }
    fn named(name: &str) -> Option<Fault> {
        Some(match name {
            "crash" => Fault::Crash,
            "hang" => Fault::Hang,
            "node-killed" => Fault::NodeKilled,
            "node-frozen" => Fault::NodeFrozen,
            _ => return None,
        })
    }
    fn of_a_node(self) -> bool {
        matches!(self, Fault::NodeKilled | Fault::NodeFrozen)
    }
}

/// What the benchmark needs from the machine.
struct Setup {
    endpoint: String,
    torch: PathBuf,
    nvrx: Option<PathBuf>,
}

/// One job: its directory (the workers' files, each node's output), its launchers.
struct Job {
    dir: PathBuf,
    run: String,
    url: String,
    launchers: Vec<Child>,
    frozen: Vec<i32>,
    /// NVRx's Wrapper: the port of the process groups' store (its own is at the c10d port).
    pg_port: u16,
}

fn rdzv_binary() -> PathBuf {
    std::env::current_exe().unwrap().with_file_name("rdzv")
}

fn worker() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/workers/recovery_worker.py")
}

fn wall() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn node_command(
    kind: Kind,
    fault: Fault,
    setup: &Setup,
    job: &Job,
    n: usize,
    i: usize,
    c10d: u16,
) -> Command {
    let python = match kind {
        Kind::FtLauncher | Kind::NvrxWrapper => setup.nvrx.clone().expect("NVRx python"),
        _ => setup.torch.clone(),
    };
    // ft_launcher's barrier forms a round of whichever nodes are there at once (no last call
    // while its snapshot is unstable): its jobs are N:N, or the first node trains alone.
    let nnodes = match kind {
        Kind::FtLauncher => format!("--nnodes={n}:{n}"),
        _ => format!("--nnodes={}:{n}", n - 1),
    };
    let common = [
        "--nproc-per-node=2",
        "--max-restarts=3",
        "--monitor-interval=0.1",
    ];
    let mut c = match kind {
        Kind::Rdzv | Kind::RdzvInProcess | Kind::RdzvInProcessSpare => {
            let mut c = Command::new(rdzv_binary());
            c.args(["run", "--rdzv", &job.url])
                .args(common)
                .arg(format!("--hang-timeout={HANG_TIMEOUT}"));
            if kind.in_process() {
                c.arg("--in-process-restart");
            }
            if kind == Kind::RdzvInProcessSpare {
                c.arg("--in-process-spare");
            }
            c.arg(&python);
            c
        }
        Kind::TorchrunC10d | Kind::FtLauncher => {
            let mut c = Command::new(&python);
            let module = match kind {
                Kind::TorchrunC10d => "torch.distributed.run",
                _ => "nvidia_resiliency_ext.fault_tolerance.launcher",
            };
            c.args(["-m", module, &nnodes, "--rdzv-backend=c10d"])
                .arg(format!("--rdzv-endpoint=127.0.0.1:{c10d}"))
                .arg(format!("--rdzv-id={}", job.run))
                .arg("--rdzv-conf=last_call_timeout=1")
                .args(common)
                .arg("--local-addr=127.0.0.1");
            if kind == Kind::FtLauncher {
                c.arg(format!("--ft-rank-heartbeat-timeout={HANG_TIMEOUT}"))
                    .arg("--ft-initial-rank-heartbeat-timeout=null")
                    .arg("--ft-workload-check-interval=0.1");
                // Two launchers of a round on one host: a simulation, as here.
                c.env("NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE", "1");
            } else {
                // torch 2.15's shared agent store keeps a late node out (BENCHMARKS history).
                c.env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1");
            }
            c.arg("--no-python").arg(&python);
            c
        }
        Kind::NvrxWrapper => {
            // No launcher: the Wrapper restarts the function in each process, and a process
            // that is gone is left out (its rank is not started again). A node's two ranks
            // are started by a shell of its own, the node's process tree.
            let mut c = Command::new("sh");
            c.args([
                "-c",
                "RANK=$((2 * RECOVERY_NODE)) \"$0\" \"$1\" & RANK=$((2 * RECOVERY_NODE + 1)) \"$0\" \"$1\" & wait",
            ])
            .arg(&python)
            .env("WORLD_SIZE", (2 * n).to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", c10d.to_string())
            .env("RECOVERY_PG_PORT", job.pg_port.to_string())
            .env("RECOVERY_HANG_TIMEOUT", HANG_TIMEOUT.to_string());
            c
        }
    };
    let progress = match kind {
        Kind::Rdzv | Kind::RdzvInProcess | Kind::RdzvInProcessSpare => "rdzv",
        Kind::FtLauncher => "nvrx",
        Kind::NvrxWrapper => "nvrx-wrapper",
        Kind::TorchrunC10d => "none",
    };
    let fault_name = match fault {
        Fault::Crash => "crash",
        Fault::Hang => "hang",
        _ => "none",
    };
    c.arg(worker())
        .env("RECOVERY_DIR", &job.dir)
        .env("RECOVERY_NODE", i.to_string())
        .env("RECOVERY_FAULT", fault_name)
        .env("RECOVERY_FAULT_RANK", (2 * n - 1).to_string())
        .env("RECOVERY_FAULT_STEP", FAULT_STEP.to_string())
        .env("RECOVERY_PROGRESS", progress)
        .env(
            "RECOVERY_IN_PROCESS",
            if kind.in_process() { "1" } else { "0" },
        )
        .env("RDZV_LIBRARY", rdzv_binary().with_file_name("librdzv.so"))
        .env(
            "PYTHONPATH",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../bindings/python"),
        );
    c
}

/// A first step a worker wrote: (node, rank, world, wall-clock time).
fn first_steps(dir: &Path) -> Vec<(usize, u64, u64, f64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let node = name
                .strip_prefix("first-")?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            let v: Value = serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()?;
            Some((
                node,
                v["rank"].as_u64()?,
                v["world"].as_u64()?,
                v["t"].as_f64()?,
            ))
        })
        .collect()
}

/// What follows `prefix` in the names of the files in `dir` that start with it.
fn names_after(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| Some(e.file_name().to_str()?.strip_prefix(prefix)?.to_string()))
        .collect()
}

/// The pids node `node`'s workers wrote.
fn worker_pids(dir: &Path, node: usize) -> Vec<i32> {
    names_after(dir, &format!("pid-{node}-"))
        .iter()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The moment every rank of a world of `world` took a first step after `after` (the last of
/// those steps), if they all did.
fn stepping(dir: &Path, world: u64, after: f64) -> Option<f64> {
    let mut by_rank: BTreeMap<u64, f64> = BTreeMap::new();
    for (_, rank, w, t) in first_steps(dir) {
        if w == world && t > after {
            let at = by_rank.entry(rank).or_insert(t);
            *at = at.min(t);
        }
    }
    (by_rank.len() as u64 == world).then(|| by_rank.values().cloned().fold(0.0, f64::max))
}

/// Polls every 10 ms until `ready` gives a value or `limit` passes.
fn poll<T>(limit: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = ready() {
            return Some(v);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every process descended from `root` (the launcher's workers, its watchdog: whatever runs in
/// a session of its own), read from /proc.
fn descendants(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces, so read after its ')'.
            let ppid = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, pp)| pp == parent)
                .map(|&(p, _)| p),
        );
        i += 1;
    }
    found
}

/// Sends `sig` to every process of node `node` at once: the launcher's tree, and the workers
/// it started (by their pid files, should one have left the tree); returns the pids.
fn signal_node(job: &Job, node: usize, sig: i32) -> Vec<i32> {
    let mut pids = descendants(job.launchers[node].id() as i32);
    for p in worker_pids(&job.dir, node) {
        if !pids.contains(&p) {
            pids.push(p);
        }
    }
    // All stopped first, then signalled: a SIGKILL sent to one process after another would
    // let the watchdog see its launcher die and release the node before its own arrived.
    for &p in &pids {
        // SAFETY: plain syscalls on processes this benchmark started.
        unsafe { libc::kill(p, libc::SIGSTOP) };
    }
    if sig != libc::SIGSTOP {
        for &p in &pids {
            unsafe { libc::kill(p, sig) };
        }
    }
    pids
}

/// The split of `rdzv run`'s incident record for the fault at `fault` (wall seconds):
/// detect, decide, re-form, restart, first step, in ms.
fn split(url: &str, fault: f64) -> Option<[Option<f64>; 5]> {
    let record = poll(Duration::from_secs(15), || {
        let out = Command::new(rdzv_binary())
            .args(["status", "--json", url])
            .output()
            .ok()?;
        let status: Value = serde_json::from_slice(&out.stdout).ok()?;
        let records = status["incidents"]["records"].as_array()?.clone();
        records.into_iter().find(|r| {
            let from = r["fault_ms"].as_f64().or(r["detected_ms"].as_f64());
            r["stepping_ms"].is_u64() && from.is_some_and(|f| f / 1e3 > fault - 1.0)
        })
    })?;
    let at = |k: &str| record[k].as_f64();
    let from = at("fault_ms").or(at("detected_ms"))?;
    let moments = [
        "detected_ms",
        "decided_ms",
        "reformed_ms",
        "running_ms",
        "stepping_ms",
    ];
    let mut last = from;
    Some(moments.map(|k| {
        let t = at(k)?;
        let d = t - last;
        last = t;
        Some(d)
    }))
}

/// One run: the time from the fault to every surviving rank stepping (None: not within the
/// limit), and the incident record's split for `rdzv run`.
fn one_run(
    kind: Kind,
    fault: Fault,
    setup: &Setup,
    n: usize,
    seq: usize,
) -> (Option<f64>, Option<[Option<f64>; 5]>) {
    let run = format!("recovery-{}-{seq}", std::process::id());
    let dir = std::env::temp_dir().join(&run);
    std::fs::create_dir_all(&dir).unwrap();
    let c10d = free_port();
    let mut job = Job {
        url: format!(
            "etcd://{}/{run}?min_nodes={}&max_nodes={n}&last_call_timeout=1",
            setup.endpoint,
            n - 1
        ),
        dir,
        run,
        launchers: vec![],
        frozen: vec![],
        pg_port: loop {
            // Not the c10d port, bound and closed just before.
            let p = free_port();
            if p != c10d {
                break p;
            }
        },
    };
    for i in 0..n {
        if i == 1 && !kind.is_rdzv() {
            // The c10d store lives on the node that binds its port first: node 0, never the
            // victim (the last rank's node is chosen below, and node 0 is skipped).
            poll(LAUNCH_LIMIT, || {
                std::net::TcpStream::connect(("127.0.0.1", c10d)).ok()
            });
        }
        let log = std::fs::File::create(job.dir.join(format!("node-{i}.log"))).unwrap();
        let child = node_command(kind, fault, setup, &job, n, i, c10d)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting a launcher");
        job.launchers.push(child);
    }
    let world = 2 * n as u64;
    let outcome = match poll(LAUNCH_LIMIT, || stepping(&job.dir, world, 0.0)) {
        None => {
            eprintln!(
                "{} {} N={n}: the job did not start; see {}",
                kind.name(),
                fault.name(),
                job.dir.display()
            );
            (None, None)
        }
        Some(_) => measure(kind, fault, &mut job, n),
    };
    end(&mut job);
    if outcome.0.is_some() && std::env::var_os("BENCH_RECOVERY_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&job.dir);
    }
    outcome
}

fn measure(
    kind: Kind,
    fault: Fault,
    job: &mut Job,
    n: usize,
) -> (Option<f64>, Option<[Option<f64>; 5]>) {
    let world = 2 * n as u64;
    if !arm(kind, job, n) {
        return (None, None);
    }
    let (at, next_world) = if fault.of_a_node() {
        std::thread::sleep(STEADY); // steps of a running job, then the fault
        let last_rank = first_steps(&job.dir)
            .into_iter()
            .find(|&(_, rank, w, _)| rank == world - 1 && w == world)
            .map(|(node, ..)| node)
            .filter(|&node| node != 0 || kind.is_rdzv())
            .unwrap_or(n - 1);
        let sig = if fault == Fault::NodeKilled {
            libc::SIGKILL
        } else {
            libc::SIGSTOP
        };
        let at = wall();
        let pids = signal_node(job, last_rank, sig);
        if fault == Fault::NodeFrozen {
            job.frozen = pids;
        }
        (at, world - 2)
    } else {
        let stamp = job.dir.join("fault");
        let read = || -> Option<f64> {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&stamp).ok()?).ok()?;
            v["t"].as_f64()
        };
        match poll(Duration::from_secs(30), read) {
            // NVRx's Wrapper leaves a crashed rank's process out: one rank fewer.
            Some(at) if kind == Kind::NvrxWrapper && fault == Fault::Crash => (at, world - 1),
            Some(at) => (at, world),
            None => return (None, None),
        }
    };
    let limit = if fault == Fault::NodeFrozen {
        FREEZE
    } else {
        LIMIT
    };
    let left = limit.saturating_sub(Duration::from_secs_f64((wall() - at).max(0.0)));
    let total = poll(left, || stepping(&job.dir, next_world, at)).map(|t| (t - at) * 1e3);
    let split = (total.is_some() && kind.is_rdzv())
        .then(|| split(&job.url, at))
        .flatten();
    (total, split)
}

/// Arms the fault once the job is at rest: every rank stepping (the caller waited for it) and,
/// with `--in-process-spare`, every node's spare ready (it wrote `spare-ready-NODE-PID`), as in
/// a job that has run a while. A spare starts once its round steps; at 8 nodes on 2 cores it
/// had not finished importing torch by step 100, and every rank waited for it. False (said) if
/// the spares are not ready within `LAUNCH_LIMIT`.
fn arm(kind: Kind, job: &Job, n: usize) -> bool {
    if kind == Kind::RdzvInProcessSpare {
        let ready = || (spares_ready(&job.dir) >= n).then_some(());
        if poll(LAUNCH_LIMIT, ready).is_none() {
            eprintln!(
                "{} N={n}: {} of {n} spares ready after {LAUNCH_LIMIT:?}; see {}",
                kind.name(),
                spares_ready(&job.dir),
                job.dir.display()
            );
            return false;
        }
    }
    std::fs::write(job.dir.join("armed"), "").is_ok()
}

/// How many nodes have a spare ready (a `spare-ready-NODE-PID` file).
fn spares_ready(dir: &Path) -> usize {
    let nodes: std::collections::BTreeSet<String> = names_after(dir, "spare-ready-")
        .into_iter()
        .filter_map(|rest| Some(rest.split('-').next()?.to_string()))
        .collect();
    nodes.len()
}

/// Ends the job: its workers told to return, then every process of it killed.
fn end(job: &mut Job) {
    let _ = std::fs::write(job.dir.join("done"), "");
    for &p in &job.frozen {
        unsafe { libc::kill(p, libc::SIGCONT) };
    }
    let until = Instant::now() + Duration::from_secs(10);
    for l in &mut job.launchers {
        while Instant::now() < until && matches!(l.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for i in 0..job.launchers.len() {
        signal_node(job, i, libc::SIGKILL);
        let _ = job.launchers[i].wait();
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |d| format!("{:.0}", d))
}

fn main() {
    const USAGE: &str = "usage: bench_recovery HOST:PORT [--fault NAME] [--launcher NAME] [N ...]";
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().expect(USAGE);
    let (mut faults, mut kinds, mut sizes) = (vec![], vec![], vec![]);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fault" => faults.push(
                args.next()
                    .and_then(|f| Fault::named(&f))
                    .expect("--fault: crash, hang, node-killed or node-frozen"),
            ),
            "--launcher" => kinds.push(args.next().and_then(|k| Kind::named(&k)).expect(
                "--launcher: rdzv, rdzv-in-process, rdzv-in-process-spare, torchrun, ft_launcher or nvrx-wrapper",
            )),
            n => sizes.push(n.parse::<usize>().ok().filter(|&n| n >= 2).expect(USAGE)),
        }
    }
    if faults.is_empty() {
        faults = vec![
            Fault::Crash,
            Fault::Hang,
            Fault::NodeKilled,
            Fault::NodeFrozen,
        ];
    }
    let nvrx = std::env::var_os("RDZV_NVRX_PYTHON").map(PathBuf::from);
    if kinds.is_empty() {
        kinds = vec![
            Kind::Rdzv,
            Kind::RdzvInProcess,
            Kind::RdzvInProcessSpare,
            Kind::TorchrunC10d,
        ];
        match &nvrx {
            Some(_) => kinds.extend([Kind::FtLauncher, Kind::NvrxWrapper]),
            None => eprintln!("no ft_launcher: RDZV_NVRX_PYTHON is not set (scripts/nvrx-env.sh)"),
        }
    }
    if sizes.is_empty() {
        sizes = vec![2];
    }
    let setup = Setup {
        endpoint,
        torch: PathBuf::from(std::env::var_os("RDZV_TORCH_PYTHON").expect("RDZV_TORCH_PYTHON")),
        nvrx,
    };
    let runs: usize = std::env::var("BENCH_RECOVERY_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    println!("| N | fault | launcher | every rank stepping | recovered | detect | decide | re-form | restart | first step |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut seq = 0;
    for &n in &sizes {
        for &fault in &faults {
            for &kind in &kinds {
                if kind == Kind::FtLauncher && fault.of_a_node() {
                    // An N:N job (above) has no node to re-form without.
                    println!(
                        "| {n} | {} | {} | not run: its job is N:N | | | | | | |",
                        fault.name(),
                        kind.name()
                    );
                    continue;
                }
                let mut totals = vec![];
                let mut splits = vec![];
                for _ in 0..runs {
                    seq += 1;
                    let (total, split) = one_run(kind, fault, &setup, n, seq);
                    eprintln!("{} {} N={n}: {}", kind.name(), fault.name(), ms(total));
                    totals.push(total.map(|t| Duration::from_secs_f64(t / 1e3)));
                    splits.extend(split);
                    if total.is_none() {
                        break; // one run shows a launcher that does not recover
                    }
                }
                let runs = totals.len();
                let recovered = totals.iter().filter(|t| t.is_some()).count();
                let total = match median_or_none(totals) {
                    Some(t) => format!("**{:.0} ms**", t.as_secs_f64() * 1e3),
                    None if fault == Fault::NodeFrozen => {
                        format!("not before it resumed ({} s)", FREEZE.as_secs())
                    }
                    None => format!("none in {} s", LIMIT.as_secs()),
                };
                let part = |i: usize| {
                    let v: Vec<Option<Duration>> = splits
                        .iter()
                        .map(|s: &[Option<f64>; 5]| {
                            s[i].map(|d| Duration::from_secs_f64(d.max(0.0) / 1e3))
                        })
                        .collect();
                    match v.is_empty() {
                        true => "".to_string(),
                        false => ms(median_or_none(v).map(|d| d.as_secs_f64() * 1e3)),
                    }
                };
                println!(
                    "| {n} | {} | {} | {total} | {recovered}/{runs} | {} | {} | {} | {} | {} |",
                    fault.name(),
                    kind.name(),
                    part(0),
                    part(1),
                    part(2),
                    part(3),
                    part(4)
                );
            }
        }
    }
}
