//! Launcher benchmark: real launcher processes, one worker each, on a local etcd. The worker
//! (`tests/frameworks/peer_worker.py`) depends on its peers as a gloo process group does:
//! every rank holds a TCP connection to rank 0, takes a first step with all of them, and fails
//! when a peer's connection breaks. For each node count N (median of a few runs) it prints:
//!
//! - launch: from starting N launchers to every worker's first step;
//! - recovery, in three cases, on a job of `--nnodes=N-1:N`:
//!   - *launcher killed*: SIGKILL to one launcher process alone (not its group), as the OOM
//!     killer or `kill -9 PID` does;
//!   - *worker killed*: SIGKILL to one node's worker;
//!   - *drained*: `rdzv drain` of one node (a planned departure: `rdzv run`, and torchrun on
//!     rdzv's `etcd-v3` backend; torchrun's c10d has no drain).
//!
//!   For each: the time from the event to every remaining node in the new round ("round":
//!   `rdzv run`'s "round N formed" line; torchrun prints none, so there it is the next
//!   column), to every remaining node's new worker running ("worker": the process started and
//!   printed its first line) and to its first step with all its peers ("step"), and the
//!   restarts the other nodes spent (the killed worker's own node spends one, as it must).
//!
//! - *failed*: on a job of `--nnodes=N` and `--max-restarts=0`, one node's worker (the same
//!   `peer_worker.py`, told by `PEER_WORKER_STAMP`) exits 7 after its first step; the others either
//!   fail on their broken connections as gloo's do (*peers break*) or block as ranks in a
//!   collective with a dead peer (*peers hold*: only their launcher can end them). From that exit
//!   (the worker's wall-clock stamp) to each node's launcher exit: the failing node's, the median
//!   of the others' and the last node's, and how many nodes exited 0, non-zero or not within
//!   `FAIL_LIMIT`. `rdzv run` on the benchmark's etcd and with `--rdzv-backend=c10d`, and torchrun
//!   with both backends.
//!
//! - *signal*: on a job of `--nnodes=N` with two workers per node
//!   (`benches/workers/signal_worker.py`, which notes the wall-clock time a signal reaches it),
//!   SIGINT, and in other runs SIGTERM, to the last node's launcher process alone. That is what
//!   a terminal's Ctrl-C reaches: it signals the foreground process group, and both launchers
//!   start their workers in sessions of their own, so only the launcher gets it and must
//!   forward it. From the kill to each of that node's workers receiving the signal (the median
//!   and the slowest of the two) and to its launcher's exit, with its exit code; `rdzv run` and
//!   torchrun on the same backends as *failed*. N = 1 is a terminal's single-node job.
//!
//! - *hang*: on a job of `--nnodes=N`, one gloo worker per node, one rank hangs once; from the
//!   hang to every rank of the next attempt past its first all_reduce, and where that time
//!   goes (`launcher/hang.rs`). `rdzv run --hang-timeout 5` beside NVIDIA's `ft_launcher` and
//!   torchrun.
//!
//! `--case NAME` (`launcher-killed`, `worker-killed`, `drained`, `failed`, `signal`, `hang`;
//! repeatable) runs only those cases; all by default (N = 1 by default when only `signal` is
//! selected). `BENCH_LAUNCHER_LOGS=DIR` keeps every node's output there.
//!
//! Launchers measured in the same run: `rdzv run` with its watchdog (the default) and without
//! it (`--no-watchdog`: a killed launcher is noticed when its lease expires), and, where a
//! PyTorch environment exists (`RDZV_TORCH_PYTHON`, or the one `scripts/torch-env.sh`
//! caches), torchrun with its c10d backend and with rdzv's `etcd-v3` backend; in the hang case
//! NVIDIA's `ft_launcher` too, where an environment with nvidia-resiliency-ext exists
//! (`RDZV_NVRX_PYTHON`, which `scripts/bench.sh` sets from `scripts/nvrx-env.sh`). Every launcher
//! gets the library's default `lease_ttl` (10 s), `last_call_timeout=1` and
//! `--monitor-interval=0.1`, `--max-restarts=3`.
//!
//! Run with `scripts/bench.sh --launcher [--case NAME] [N ...]` or `cargo build --release -p
//! rdzv-cli -p rdzv-bench --bin rdzv --bin bench_launcher && target/release/bench_launcher
//! HOST:PORT [--case NAME] [N ...]`.

use rdzv_bench::stats::{median, median_or_none, millis};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

mod hang;

const LAST_CALL: u64 = 1;
const RUNS: usize = 3;

struct Launcher {
    child: Child,
}

impl Launcher {
    /// SIGKILL to the launcher process alone.
    fn kill_launcher(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
    /// SIGKILL to the node's whole process group, at the end of a run.
    fn kill_group(&mut self) {
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// Which launcher a run measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rdzv,
    RdzvNoWatchdog,
    /// `rdzv run --rdzv-backend=c10d`: an etcd embedded in the first node's launcher.
    RdzvC10d,
    /// torchrun with its c10d backend (its store on a port of the first node).
    TorchrunC10d,
    /// torchrun with rdzv's etcd-v3 backend.
    TorchrunEtcdV3,
    /// NVIDIA's `ft_launcher` (nvidia-resiliency-ext) with its c10d backend.
    FtLauncher,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Rdzv => "rdzv run",
            Kind::RdzvNoWatchdog => "rdzv run --no-watchdog",
            Kind::RdzvC10d => "rdzv run c10d",
            Kind::TorchrunC10d => "torchrun c10d",
            Kind::TorchrunEtcdV3 => "torchrun etcd-v3",
            Kind::FtLauncher => "ft_launcher c10d",
        }
    }
    /// `rdzv run` on the benchmark's etcd.
    fn is_rdzv(self) -> bool {
        matches!(self, Kind::Rdzv | Kind::RdzvNoWatchdog)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    LauncherKilled,
    WorkerKilled,
    Drained,
    /// One node's worker exits 7; the others' workers block, as in a collective.
    FailedPeersHold,
    /// One node's worker exits 7; the others' workers fail on their broken connections.
    FailedPeersBreak,
    /// SIGINT to one node's launcher process alone, as a terminal's Ctrl-C reaches it.
    SigInt,
    /// SIGTERM to one node's launcher process alone, as `kill PID` or a scheduler sends it.
    SigTerm,
    /// One rank hangs once in the job; the launcher finds it and the job steps again.
    Hang,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::LauncherKilled => "launcher SIGKILL",
            Case::WorkerKilled => "worker SIGKILL",
            Case::Drained => "drain",
            Case::FailedPeersHold => "peers hold",
            Case::FailedPeersBreak => "peers break",
            Case::SigInt => "SIGINT",
            Case::SigTerm => "SIGTERM",
            Case::Hang => "hang",
        }
    }
    /// The cases `--case NAME` selects.
    fn named(name: &str) -> Option<&'static [Case]> {
        Some(match name {
            "launcher-killed" => &[Case::LauncherKilled],
            "worker-killed" => &[Case::WorkerKilled],
            "drained" => &[Case::Drained],
            "failed" => &[Case::FailedPeersHold, Case::FailedPeersBreak],
            "signal" => &[Case::SigInt, Case::SigTerm],
            "hang" => &[Case::Hang],
            _ => return None,
        })
    }
    fn is_failed(self) -> bool {
        matches!(self, Case::FailedPeersHold | Case::FailedPeersBreak)
    }
    fn is_signal(self) -> bool {
        matches!(self, Case::SigInt | Case::SigTerm)
    }
    /// The signal a signal case sends.
    fn signal(self) -> i32 {
        match self {
            Case::SigInt => libc::SIGINT,
            Case::SigTerm => libc::SIGTERM,
            _ => unreachable!("not a signal case"),
        }
    }
}

const ALL_CASES: [Case; 8] = [
    Case::LauncherKilled,
    Case::WorkerKilled,
    Case::Drained,
    Case::FailedPeersHold,
    Case::FailedPeersBreak,
    Case::SigInt,
    Case::SigTerm,
    Case::Hang,
];

/// The python of the PyTorch environment, if there is one.
fn torch_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RDZV_TORCH_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("RDZV_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdzv")))?;
    let venv = cache.join("torch-2.15.0");
    venv.join(".complete")
        .exists()
        .then(|| venv.join("bin/python"))
}

fn worker() -> &'static str {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/frameworks/peer_worker.py"
    )
}

/// The worker of the signal case.
fn signal_worker() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/workers/signal_worker.py")
}

/// The command that starts node `i` of `kind` in a job of `target.min_nodes` to N nodes.
fn node_command(kind: Kind, target: &Target, n: usize, i: usize) -> Command {
    let nnodes = format!("--nnodes={}:{n}", target.min_nodes);
    let restarts = format!("--max-restarts={}", target.max_restarts);
    let nproc = format!("--nproc-per-node={}", target.nproc);
    let mut c = match kind {
        Kind::Rdzv | Kind::RdzvNoWatchdog => {
            let mut c = Command::new(rdzv_binary());
            c.args(["run", "--rdzv", &target.url, "--monitor-interval=0.1"])
                .args([&restarts, &nproc]);
            if kind == Kind::RdzvNoWatchdog {
                c.arg("--no-watchdog");
            }
            if target.hang.is_some() {
                c.arg(format!("--hang-timeout={}", hang::TIMEOUT.as_secs()));
            }
            c.arg(&target.interpreter).arg(target.worker);
            c
        }
        Kind::RdzvC10d => {
            let mut c = Command::new(rdzv_binary());
            c.args(["run", &nnodes, "--rdzv-backend=c10d"])
                .arg(format!("--rdzv-endpoint=127.0.0.1:{}", target.c10d_port))
                .arg(format!("--rdzv-id={}", target.run))
                .arg(format!("--rdzv-conf=last_call_timeout={LAST_CALL}"))
                .args(["--monitor-interval=0.1", &restarts, &nproc])
                .arg(&target.interpreter)
                .arg(target.worker);
            c
        }
        Kind::TorchrunC10d | Kind::TorchrunEtcdV3 => {
            let python = target.python.as_ref().expect("torch python");
            let mut c = Command::new(python);
            let (backend, endpoint) = match kind {
                Kind::TorchrunC10d => ("c10d", format!("127.0.0.1:{}", target.c10d_port)),
                _ => ("etcd-v3", target.endpoint.clone()),
            };
            c.args(["-m", "torch.distributed.run", &nnodes, &nproc])
                .arg(format!("--rdzv-backend={backend}"))
                .arg(format!("--rdzv-endpoint={endpoint}"))
                .arg(format!("--rdzv-id={}", target.run))
                .arg(format!("--rdzv-conf=last_call_timeout={LAST_CALL}"))
                .args(["--monitor-interval=0.1", "--local-addr=127.0.0.1"])
                .args([&restarts, "--no-python"])
                .arg(&target.interpreter)
                .arg(target.worker);
            // rdzv's backend from this checkout, on the library built with this benchmark.
            let lib = rdzv_binary().with_file_name("librdzv.so");
            let package = concat!(env!("CARGO_MANIFEST_DIR"), "/../bindings/python");
            c.env("RDZV_LIBRARY", lib).env("PYTHONPATH", package);
            if kind == Kind::TorchrunC10d {
                // torch 2.15's c10d handler shares its agent store with the workers, and then a
                // node that joins a job which already formed a round waits forever: the old
                // rank 0 skips publishing MASTER_ADDR/PORT in the new round's store
                // (`DynamicRendezvousHandler.next_rendezvous`). torch's own opt-out avoids it.
                c.env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1");
            }
            c
        }
        Kind::FtLauncher => {
            let mut c = Command::new(target.nvrx.as_ref().expect("NVRx python"));
            c.args(["-m", "nvidia_resiliency_ext.fault_tolerance.launcher"])
                .args([&nnodes, &nproc, "--rdzv-backend=c10d"])
                .arg(format!("--rdzv-endpoint=127.0.0.1:{}", target.c10d_port))
                .arg(format!("--rdzv-id={}", target.run))
                .args([
                    "--monitor-interval=0.1",
                    "--local-addr=127.0.0.1",
                    &restarts,
                ])
                .args(hang::ft_launcher_flags())
                .arg("--no-python")
                .arg(&target.interpreter)
                .arg(target.worker);
            // Its rendezvous closes itself when two launchers of a round share a host, unless
            // told that this is a simulation, as here (`ft_rendezvous_barrier.py`).
            c.env("NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE", "1");
            c
        }
    };
    c.env("PEER_WORKER_DONE", &target.done)
        .env("PEER_WORKER_LIFETIME", "300");
    if let Some(f) = &target.failing {
        c.env("PEER_WORKER_PEERS", f.peers);
        if i == f.node {
            c.env("PEER_WORKER_STAMP", &f.stamp);
        }
    }
    if let Some(dir) = &target.signals {
        c.env("SIGNAL_WORKER_DIR", signal_dir(dir, i));
    }
    if let Some(dir) = &target.hang {
        hang::worker_env(&mut c, kind, dir, n);
    }
    c
}

/// Where node `i`'s workers of a signal-case run write when they are ready and when the
/// signal reached them.
fn signal_dir(run_dir: &std::path::Path, i: usize) -> PathBuf {
    run_dir.join(format!("node-{i}"))
}

/// Where one run's nodes meet.
struct Target {
    endpoint: String,
    url: String,
    run: String,
    c10d_port: u16,
    python: Option<PathBuf>,
    /// Created at the end of a run: every worker (orphans too) exits.
    done: PathBuf,
    min_nodes: usize,
    max_restarts: u32,
    /// Workers per node.
    nproc: usize,
    worker: &'static str,
    /// The failed case: which node's worker fails.
    failing: Option<Failing>,
    /// The signal case: the run's directory, where each node's workers write (`signal_dir`).
    signals: Option<PathBuf>,
    /// The hang case: the run's directory, where the workers write (`workers/hang_worker.py`).
    hang: Option<PathBuf>,
    /// What runs the worker script: `python3`, or an environment's python.
    interpreter: PathBuf,
    /// The python of the NVRx environment, for `ft_launcher`.
    nvrx: Option<PathBuf>,
}

/// The node whose worker exits 7 after its first step, and how the other workers take it.
struct Failing {
    node: usize,
    /// Where that worker writes the wall-clock time of its exit.
    stamp: PathBuf,
    /// `hold` or `break` (`PEER_WORKER_PEERS` of `tests/frameworks/peer_worker.py`).
    peers: &'static str,
}

/// The `rdzv` binary beside this one (both built in the same profile).
fn rdzv_binary() -> PathBuf {
    std::env::current_exe().unwrap().with_file_name("rdzv")
}

/// What a node's output says.
enum Event {
    /// A worker runs: world, pid, rank (one worker per node: the node's rank).
    Started(u32, i32, u32),
    /// A worker took its first step: world, restart count.
    Step(u32, u32),
    /// rdzv run's node id.
    NodeId(String),
    /// rdzv run formed a round of this world size.
    Formed(u32),
    /// The launcher found a hung worker (`hang::detected`).
    Hang,
    /// `rdzv run`'s verdict named this rank the suspect; whether it said it is uncertain.
    Suspect(u32, bool),
    /// A line that says something failed (`hang::failure`), as written.
    Failure(String),
}

fn field(line: &str, key: &str) -> Option<i64> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.trim_end_matches(':').parse().ok())
}

fn parse(line: &str) -> Option<Event> {
    if let Some(suspect) = hang::suspect(line) {
        return Some(suspect);
    }
    if hang::detected(line) {
        return Some(Event::Hang);
    }
    if hang::failure(line) {
        return Some(Event::Failure(line.to_string()));
    }
    if let Some(world) = hang::ft_launcher_joined(line) {
        return Some(Event::Formed(world));
    }
    if line.contains("[rdzv] round ") && line.contains(" formed: ") {
        let world = line.split("world size ").nth(1)?.split(',').next()?;
        return Some(Event::Formed(world.trim().parse().ok()?));
    }
    if let Some(rest) = line.split(" as node ").nth(1) {
        return Some(Event::NodeId(rest.split_whitespace().next()?.to_string()));
    }
    let world = field(line, "world")? as u32;
    let restart = field(line, "restart")? as u32;
    if line.contains("STARTED ") {
        let (pid, rank) = (field(line, "pid")? as i32, field(line, "rank")? as u32);
        return Some(Event::Started(world, pid, rank));
    }
    line.contains("STEP ")
        .then_some(Event::Step(world, restart))
}

/// Starts `n` nodes; what their output says arrives on `tx` with the node's index.
fn launch(
    kind: Kind,
    target: &Target,
    n: usize,
    tx: &mpsc::Sender<(usize, Instant, Event)>,
) -> Vec<Launcher> {
    (0..n)
        .map(|i| {
            if matches!(kind, Kind::TorchrunC10d | Kind::RdzvC10d | Kind::FtLauncher) && i == 1 {
                // The c10d store lives on whichever node binds its port first: let that be
                // node 0, so the victim (the last node) is never the store's host.
                wait_for_listener(target.c10d_port, LAUNCH_LIMIT);
            }
            let mut child = node_command(kind, target, n, i)
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect(
                    "cannot start the launcher (build it: cargo build --release --lib --bin rdzv)",
                );
            let out = child.stdout.take().unwrap();
            let err = child.stderr.take().unwrap();
            let log = node_log(&target.run, i);
            for stream in [Box::new(out) as Box<dyn Read + Send>, Box::new(err)] {
                let tx = tx.clone();
                let mut log = log.as_ref().and_then(|f| f.try_clone().ok());
                std::thread::spawn(move || {
                    for line in BufReader::new(stream).lines().map_while(Result::ok) {
                        if let Some(f) = log.as_mut() {
                            let at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
                            let at = at.unwrap_or_default().as_secs_f64();
                            let _ = writeln!(f, "{at:.3} {line}");
                        }
                        if let Some(ev) = parse(&line) {
                            let _ = tx.send((i, Instant::now(), ev));
                        }
                    }
                });
            }
            Launcher { child }
        })
        .collect()
}

/// With `BENCH_LAUNCHER_LOGS=DIR`, node `i`'s output goes to `DIR/RUN-I.log` too, each line
/// after its wall-clock time (to read what a launcher did in a run whose numbers look odd).
fn node_log(run: &str, i: usize) -> Option<std::fs::File> {
    let dir = PathBuf::from(std::env::var_os("BENCH_LAUNCHER_LOGS")?);
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::File::create(dir.join(format!("{run}-{i}.log"))).ok()
}

/// Returns once something accepts connections on `port` of 127.0.0.1, or after `limit`.
fn wait_for_listener(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        // Polling a port on this machine: no event to wait on.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the nodes in `nodes` reported after an event: when each one's new worker started and
/// stepped in a world of `world`, and each one's restart count.
struct Progress {
    formed: Vec<Option<Instant>>,
    started: Vec<Option<Instant>>,
    stepped: Vec<Option<Instant>>,
    restarts: Vec<u32>,
}

/// What the nodes said of themselves, by node index: their worker's pid and rank, and (`rdzv
/// run` only) their node id.
struct Seen {
    pids: Vec<i32>,
    ids: Vec<String>,
    ranks: Vec<u32>,
}

/// Reads events until every node in `nodes` stepped in a world of `world` (at most `limit`);
/// pids and node ids seen on the way are recorded.
fn wait_for(
    rx: &mpsc::Receiver<(usize, Instant, Event)>,
    nodes: &[usize],
    world: u32,
    limit: Duration,
    seen: &mut Seen,
) -> Option<Progress> {
    let n = seen.pids.len();
    let mut p = Progress {
        formed: vec![None; n],
        started: vec![None; n],
        stepped: vec![None; n],
        restarts: vec![0; n],
    };
    let deadline = Instant::now() + limit;
    while !nodes.iter().all(|&i| p.stepped[i].is_some()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, at, ev) = rx.recv_timeout(left).ok()?;
        match ev {
            Event::NodeId(id) => seen.ids[i] = id,
            Event::Formed(w) if w == world => {
                p.formed[i].get_or_insert(at);
            }
            Event::Started(w, pid, rank) if w == world => {
                seen.pids[i] = pid;
                seen.ranks[i] = rank;
                p.started[i].get_or_insert(at);
            }
            Event::Step(w, restart) if w == world => {
                p.stepped[i].get_or_insert(at);
                p.restarts[i] = restart;
            }
            _ => {}
        }
    }
    Some(p)
}

/// How long the remaining nodes get to take their first step after the event.
const RECOVERY_LIMIT: Duration = Duration::from_secs(40);

/// One recovery: to the new round (if the launcher says), to the new workers, to their first
/// step, and the restarts spent by the other nodes.
type Recovery = (Option<Duration>, Duration, Duration, u32);

/// A run's launch time and recovery; `None` if the workers did not take their first step
/// within `LAUNCH_LIMIT`.
type Run = Option<(Duration, Option<Recovery>)>;

const LAUNCH_LIMIT: Duration = Duration::from_secs(90);

fn one_run(kind: Kind, case: Case, target: &Target, n: usize) -> Run {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let mut launchers = launch(kind, target, n, &tx);
    let everyone: Vec<usize> = (0..n).collect();
    let mut seen = Seen {
        pids: vec![0; n],
        ids: vec![String::new(); n],
        ranks: vec![0; n],
    };
    if wait_for(&rx, &everyone, n as u32, LAUNCH_LIMIT, &mut seen).is_none() {
        // Workers a launcher left behind end too.
        let _ = std::fs::write(&target.done, b"");
        return None;
    }
    let launched = started.elapsed();

    // Not the first node: torchrun's c10d store lives on the node that started it.
    let victim = n - 1;
    // torchrun prints no node id: the victim's is the sealed round's member of its rank.
    let victim_id = match (case, kind.is_rdzv()) {
        (Case::Drained, false) => member_of_rank(&target.url, seen.ranks[victim]),
        _ => seen.ids[victim].clone(),
    };
    let event = Instant::now();
    let (others, world): (Vec<usize>, u32) = match case {
        Case::LauncherKilled => {
            launchers[victim].kill_launcher();
            (everyone[..victim].to_vec(), n as u32 - 1)
        }
        Case::WorkerKilled => {
            unsafe { libc::kill(seen.pids[victim], libc::SIGKILL) };
            (everyone.clone(), n as u32)
        }
        Case::Drained => {
            let ok = Command::new(rdzv_binary())
                .args(["drain", &target.url, &victim_id])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "rdzv drain failed");
            (everyone[..victim].to_vec(), n as u32 - 1)
        }
        Case::FailedPeersHold | Case::FailedPeersBreak => unreachable!("one_failed_run"),
        Case::SigInt | Case::SigTerm => unreachable!("one_signal_run"),
        Case::Hang => unreachable!("hang::one_run"),
    };
    let got = wait_for(&rx, &others, world, RECOVERY_LIMIT, &mut seen);
    let recovered = got.map(|p| {
        let last = |v: &[Option<Instant>]| {
            let seen: Option<Vec<Instant>> = others.iter().map(|&i| v[i]).collect();
            seen.and_then(|s| s.into_iter().max()).map(|t| t - event)
        };
        // The killed worker's own node spends a restart by design; count the others'.
        let spent = others
            .iter()
            .filter(|&&i| i != victim)
            .map(|&i| p.restarts[i])
            .max()
            .unwrap_or(0);
        let done = |v: &[Option<Instant>]| last(v).unwrap_or_default();
        (last(&p.formed), done(&p.started), done(&p.stepped), spent)
    });
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
    Some((launched, recovered))
}

/// How long each launcher gets to exit after the failing worker's exit: beyond the
/// rendezvous' `close_timeout` (30 s), the longest a leaving node retries an etcd that is gone.
const FAIL_LIMIT: Duration = Duration::from_secs(45);

/// One node's end in the failed case: how long after the failing worker's exit its launcher
/// exited, and its exit status (`None`: killed by a signal); `None` if it ran past
/// `FAIL_LIMIT`.
type Exit = Option<(Duration, Option<i32>)>;

/// Sends `(i, when)` once the process `pid` (a child of this one) has exited, leaving it for
/// `Child::try_wait` to reap (`WNOWAIT`): its pid cannot be reused before that.
fn watch_exit(pid: u32, i: usize, tx: mpsc::Sender<(usize, SystemTime)>) {
    std::thread::spawn(move || loop {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOWAIT;
        if unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) } == 0 {
            let _ = tx.send((i, SystemTime::now()));
            return;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    });
}

/// A failed-case run: every node's end, or `None` if the failing worker never took its first
/// step within `LAUNCH_LIMIT`.
fn one_failed_run(kind: Kind, target: &Target, n: usize) -> Option<Vec<Exit>> {
    let failing = target.failing.as_ref().expect("a failed-case target");
    // The lines are not needed here: the stamp and the exits tell it all.
    let (lines, _) = mpsc::channel();
    let mut launchers = launch(kind, target, n, &lines);
    let (tx, exits) = mpsc::channel();
    for (i, l) in launchers.iter().enumerate() {
        watch_exit(l.child.id(), i, tx.clone());
    }
    let mut ended: Vec<Option<SystemTime>> = vec![None; n];
    // The stamp is a file the worker writes: polled, as nothing announces it.
    let deadline = Instant::now() + LAUNCH_LIMIT;
    let failed_at = loop {
        if let Ok(t) = std::fs::read_to_string(&failing.stamp) {
            let secs: f64 = t.trim().parse().expect("a time stamp");
            break Some(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs));
        }
        while let Ok((i, at)) = exits.try_recv() {
            ended[i] = Some(at);
        }
        if Instant::now() > deadline || ended.iter().all(Option::is_some) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result: Option<Vec<Exit>> = failed_at.map(|failed_at| {
        let deadline = Instant::now() + FAIL_LIMIT;
        while ended.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok((i, at)) = exits.recv_timeout(left) else {
                break;
            };
            ended[i] = Some(at);
        }
        (0..n)
            .map(|i| {
                let at = ended[i]?;
                let status = launchers[i].child.try_wait().ok().flatten()?;
                let after = at.duration_since(failed_at).unwrap_or_default();
                Some((after, status.code()))
            })
            .collect()
    });
    if let (Some(exits), Some(dir)) = (&result, std::env::var_os("BENCH_LAUNCHER_LOGS")) {
        let lines: Vec<String> = exits
            .iter()
            .enumerate()
            .map(|(i, e)| format!("node {i}: {e:?}"))
            .collect();
        let path = PathBuf::from(dir).join(format!("{}.exits", target.run));
        let _ = std::fs::write(path, lines.join("\n") + "\n");
    }
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
    result
}

/// One failed-case run in numbers: the failing node's time to exit, the median of the others'
/// and the last node's (`None`: not within `FAIL_LIMIT`).
fn failed_times(exits: &[Exit], failing: usize) -> [Option<Duration>; 3] {
    let time = |e: &Exit| e.map(|(d, _)| d);
    let others: Vec<Option<Duration>> = (0..exits.len())
        .filter(|&i| i != failing)
        .map(|i| time(&exits[i]))
        .collect();
    let last = exits.iter().map(time).collect::<Option<Vec<_>>>();
    [
        time(&exits[failing]),
        median_or_none(others),
        last.and_then(|v| v.into_iter().max()),
    ]
}

/// The failed case for one launcher and node count: medians over `RUNS` runs.
fn failed_case(kind: Kind, case: Case, n: usize, make: &dyn Fn(usize) -> Target) {
    let mut runs = Vec::new();
    for r in 0..RUNS {
        let target = make(r);
        let failing = target.failing.as_ref().unwrap().node;
        match one_failed_run(kind, &target, n) {
            Some(exits) => runs.push((failed_times(&exits, failing), exits)),
            None => break,
        }
    }
    if runs.len() < RUNS {
        println!(
            "{n:>5}  {:<19} {:<12} the failing worker did not take a first step within {} s",
            kind.name(),
            case.name(),
            LAUNCH_LIMIT.as_secs()
        );
        return;
    }
    let column = |k: usize| {
        let v = median_or_none(runs.iter().map(|(t, _)| t[k]).collect());
        v.map_or(format!("none in {} s", FAIL_LIMIT.as_secs()), |d| {
            millis(d, 0)
        })
    };
    let mut codes = std::collections::BTreeMap::new();
    for e in runs.iter().flat_map(|(_, exits)| exits) {
        let code = match e {
            None => "none".to_string(),
            Some((_, Some(c))) => c.to_string(),
            Some((_, None)) => "signal".to_string(),
        };
        *codes.entry(code).or_insert(0) += 1;
    }
    let count = |f: &dyn Fn(&Exit) -> bool| {
        let all = runs.iter().flat_map(|(_, exits)| exits);
        all.filter(|e| f(e)).count()
    };
    let zero = count(&|e| matches!(e, Some((_, Some(0)))));
    let none = count(&|e| e.is_none());
    let nonzero = count(&|e| e.is_some()) - zero;
    let codes: Vec<String> = codes.iter().map(|(c, k)| format!("{c}:{k}")).collect();
    println!(
        "{n:>5}  {:<19} {:<12} {:>12}  {:>13}  {:>10}  {:>17}  {}",
        kind.name(),
        case.name(),
        column(0),
        column(1),
        column(2),
        format!("{zero}/{nonzero}/{none}"),
        codes.join(" ")
    );
}

/// How long the signalled node's workers and launcher get after the signal: beyond the
/// launchers' grace before SIGKILL (torchrun's `--shutdown-timeout`, 30 s by default).
const SIGNAL_LIMIT: Duration = Duration::from_secs(45);

/// Runs per launcher and signal: a run is short, and one launch is most of it.
const SIGNAL_RUNS: usize = 5;

/// One signal-case run: from the kill to each worker of the signalled node receiving the signal
/// (`None`: not within `SIGNAL_LIMIT`), and to its launcher's exit with its exit code or signal.
struct SignalRun {
    workers: Vec<Option<Duration>>,
    exit: Option<(Duration, String)>,
}

/// The `.tmp`-free files of `dir` whose names start with `prefix`, by name.
fn files_with(dir: &std::path::Path, prefix: &str) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(name, _)| name.starts_with(prefix) && !name.ends_with(".tmp"))
        .collect()
}

/// A signal-case run: `None` if the workers were not all ready within `LAUNCH_LIMIT`.
fn one_signal_run(kind: Kind, case: Case, target: &Target, n: usize) -> Option<SignalRun> {
    let run_dir = target.signals.as_ref().expect("a signal-case target");
    for i in 0..n {
        std::fs::create_dir_all(signal_dir(run_dir, i)).unwrap();
    }
    // The lines are not needed here: the workers' files and the exits tell it all.
    let (lines, _) = mpsc::channel();
    let mut launchers = launch(kind, target, n, &lines);
    let (tx, exits) = mpsc::channel();
    for (i, l) in launchers.iter().enumerate() {
        watch_exit(l.child.id(), i, tx.clone());
    }
    let victim = n - 1;
    let dir = signal_dir(run_dir, victim);
    // The workers announce their handlers by a file: polled, as nothing else tells.
    let deadline = Instant::now() + LAUNCH_LIMIT;
    let ready = loop {
        let ready =
            (0..n).all(|i| files_with(&signal_dir(run_dir, i), "ready-").len() >= target.nproc);
        if ready || Instant::now() > deadline || exits.try_recv().is_ok() {
            break ready;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = ready.then(|| {
        let sent = SystemTime::now();
        unsafe { libc::kill(launchers[victim].child.id() as i32, case.signal()) };
        let deadline = Instant::now() + SIGNAL_LIMIT;
        let mut exited = None;
        let got = loop {
            let got = files_with(&dir, "got-");
            if (exited.is_some() && got.len() >= target.nproc) || Instant::now() > deadline {
                break got;
            }
            // The exit is an event; the workers' files are polled between its waits.
            match exits.recv_timeout(Duration::from_millis(10)) {
                Ok((i, at)) if i == victim => exited = Some(at),
                _ => {}
            }
        };
        let mut workers: Vec<Option<Duration>> = got
            .iter()
            .map(|(_, path)| {
                let text = std::fs::read_to_string(path).expect("a worker's stamp");
                let secs: f64 = text.split_whitespace().next().unwrap().parse().unwrap();
                let at = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs);
                Some(at.duration_since(sent).unwrap_or_default())
            })
            .collect();
        workers.resize(target.nproc, None);
        let exit = exited.and_then(|at| {
            let status = launchers[victim].child.try_wait().ok().flatten()?;
            let code = match (status.code(), status.signal()) {
                (Some(c), _) => c.to_string(),
                (None, Some(s)) => format!("sig{s}"),
                _ => "?".to_string(),
            };
            Some((at.duration_since(sent).unwrap_or_default(), code))
        });
        SignalRun { workers, exit }
    });
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
    result
}

/// The signal case for one launcher, signal and node count: medians over `SIGNAL_RUNS` runs.
fn signal_case(kind: Kind, case: Case, n: usize, make: &dyn Fn(usize) -> Target) {
    let mut runs = Vec::new();
    for r in 0..SIGNAL_RUNS {
        match one_signal_run(kind, case, &make(r), n) {
            Some(run) => runs.push(run),
            None => break,
        }
    }
    if runs.len() < SIGNAL_RUNS {
        println!(
            "{n:>5}  {:<19} {:<8} the workers were not all ready within {} s",
            kind.name(),
            case.name(),
            LAUNCH_LIMIT.as_secs()
        );
        return;
    }
    let none = format!("none in {} s", SIGNAL_LIMIT.as_secs());
    let show = |d: Option<Duration>| d.map_or(none.clone(), |d| millis(d, 0));
    // A signal reaches a worker in about a millisecond: tenths, for those columns.
    let tenths = |d: Option<Duration>| d.map_or(none.clone(), |d| millis(d, 1));
    // Per run: the median of the node's workers (of two, their mean) and the slowest.
    let middle = |r: &SignalRun| {
        let mut v = r.workers.clone();
        v.sort_by_key(|d| d.unwrap_or(Duration::MAX));
        let k = v.len();
        if k % 2 == 1 {
            v[k / 2]
        } else {
            Some((v[k / 2 - 1]? + v[k / 2]?) / 2)
        }
    };
    let slowest = |r: &SignalRun| {
        r.workers
            .iter()
            .copied()
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .max()
    };
    let workers = median_or_none(runs.iter().map(middle).collect());
    let slowest = median_or_none(runs.iter().map(slowest).collect());
    let exit = median_or_none(runs.iter().map(|r| r.exit.as_ref().map(|e| e.0)).collect());
    let mut codes = std::collections::BTreeMap::new();
    for r in &runs {
        let code = r.exit.as_ref().map_or("none".to_string(), |e| e.1.clone());
        *codes.entry(code).or_insert(0) += 1;
    }
    let codes: Vec<String> = codes.iter().map(|(c, k)| format!("{c}:{k}")).collect();
    // Every receipt of every run, to show the spread behind the medians.
    let mut all: Vec<Option<Duration>> = runs.iter().flat_map(|r| r.workers.clone()).collect();
    all.sort_by_key(|d| d.unwrap_or(Duration::MAX));
    let range = format!("{}-{}", tenths(all[0]), tenths(all[all.len() - 1]));
    println!(
        "{n:>5}  {:<19} {:<8} {:>15}  {:>14}  {:>15}  {:>9}  {}",
        kind.name(),
        case.name(),
        tenths(workers),
        tenths(slowest),
        range,
        show(exit),
        codes.join(" ")
    );
}

/// The node id of the sealed round's member of rank `rank` (`rdzv status --json`).
fn member_of_rank(url: &str, rank: u32) -> String {
    let out = Command::new(rdzv_binary())
        .args(["status", url, "--json"])
        .output()
        .expect("rdzv status");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    status["sealed"]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["rank"] == rank))
        .and_then(|m| m["node"].as_str())
        .unwrap_or_else(|| panic!("no member of rank {rank} in {status}"))
        .to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn main() {
    const USAGE: &str = "usage: bench_launcher HOST:PORT [--case NAME] [N ...]";
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().expect(USAGE);
    let (mut sizes, mut cases) = (Vec::new(), Vec::new());
    while let Some(a) = args.next() {
        if a == "--case" {
            let name = args.next().expect(USAGE);
            let named = Case::named(&name).unwrap_or_else(|| {
                panic!(
                    "--case: launcher-killed, worker-killed, drained, failed, signal or hang, not \
                     {name}"
                )
            });
            cases.extend_from_slice(named);
        } else {
            sizes.push(a.parse::<usize>().expect(USAGE));
        }
    }
    if cases.is_empty() {
        cases = ALL_CASES.to_vec();
    }
    if sizes.is_empty() {
        // The signal case alone is about one node, as a terminal runs it.
        sizes = if cases.iter().all(|c| c.is_signal()) {
            vec![1]
        } else {
            vec![2, 8]
        };
    }
    assert!(
        std::path::Path::new(worker()).exists(),
        "the worker {} is missing",
        worker()
    );
    let python = torch_python();
    let torchruns: &[Kind] = match &python {
        Some(_) => &[Kind::TorchrunC10d, Kind::TorchrunEtcdV3],
        None => {
            println!("no PyTorch environment: torchrun is not measured");
            &[]
        }
    };
    let scratch = std::env::temp_dir().join(format!("bench-launcher-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    // NVIDIA's ft_launcher: the python of an environment with nvidia-resiliency-ext.
    let nvrx = std::env::var_os("RDZV_NVRX_PYTHON").map(PathBuf::from);
    let target = |kind: Kind, case: Case, n: usize, r: usize, min_nodes: usize| {
        let run = format!(
            "bench-launcher-{}-{n}-{r}-{}-{}",
            std::process::id(),
            kind as u8,
            case as u8
        );
        let failing = case.is_failed().then(|| Failing {
            node: n - 1,
            stamp: scratch.join(format!("{run}.failed")),
            peers: if case == Case::FailedPeersHold {
                "hold"
            } else {
                "break"
            },
        });
        let signals = case.is_signal().then(|| scratch.join(&run));
        let hang = (case == Case::Hang).then(|| scratch.join(&run));
        // The hang case's worker needs PyTorch (and NVRx's client under ft_launcher).
        let interpreter = match (kind, &hang) {
            (Kind::FtLauncher, _) => nvrx.clone().expect("NVRx python"),
            (_, Some(_)) => python.clone().expect("torch python"),
            _ => PathBuf::from("python3"),
        };
        Target {
            url: format!(
                "etcd://{endpoint}/{run}?min_nodes={min_nodes}&max_nodes={n}&last_call_timeout={LAST_CALL}"
            ),
            endpoint: endpoint.clone(),
            done: scratch.join(format!("{run}.done")),
            run,
            c10d_port: free_port(),
            python: python.clone(),
            min_nodes,
            max_restarts: if failing.is_some() { 0 } else { 3 },
            nproc: if signals.is_some() { 2 } else { 1 },
            worker: match (&signals, &hang) {
                (Some(_), _) => signal_worker(),
                (_, Some(_)) => hang::worker(),
                _ => worker(),
            },
            failing,
            signals,
            hang,
            interpreter,
            nvrx: nvrx.clone(),
        }
    };
    let recoveries: Vec<Case> = cases
        .iter()
        .copied()
        .filter(|c| !c.is_failed() && !c.is_signal() && *c != Case::Hang)
        .collect();
    if !recoveries.is_empty() {
        recovery_table(&sizes, &recoveries, torchruns, &target);
    }
    let failed: Vec<Case> = cases.iter().copied().filter(|c| c.is_failed()).collect();
    if !failed.is_empty() {
        println!(
            "failed: --nnodes=N, --max-restarts=0, last call {LAST_CALL} s, monitor 0.1 s; the \
             last node's worker exits 7 after its first step, the others' block (peers hold) or \
             fail on their broken connections (peers break); from that exit to each launcher's \
             exit, median of {RUNS}: the failing node, the median of the others, the last \
             node; nodes that exited 0/non-zero/not within {} s, and their exit codes over the \
             runs",
            FAIL_LIMIT.as_secs()
        );
        println!(
            "{:>5}  {:<19} {:<12} {:>12}  {:>13}  {:>10}  {:>17}  codes",
            "nodes",
            "launcher",
            "case",
            "failing (ms)",
            "others (ms)",
            "last (ms)",
            "0/non-zero/none"
        );
        let mut kinds = vec![Kind::Rdzv, Kind::RdzvC10d];
        kinds.extend_from_slice(torchruns);
        for &n in &sizes {
            assert!(n >= 2, "N must be at least 2 (one node fails)");
            for &kind in &kinds {
                for &case in &failed {
                    failed_case(kind, case, n, &|r| target(kind, case, n, r, n));
                }
            }
        }
    }
    let signalled: Vec<Case> = cases.iter().copied().filter(|c| c.is_signal()).collect();
    if !signalled.is_empty() {
        println!(
            "signal: --nnodes=N, 2 workers per node, monitor 0.1 s; the signal to the last \
             node's launcher process alone (as a terminal's Ctrl-C reaches it: the workers are \
             in sessions of their own); from the kill to that node's workers receiving it (the \
             median of the two, the slowest, every receipt's range) and to its launcher's \
             exit, median of {SIGNAL_RUNS}; the launcher's exit codes over the runs"
        );
        println!(
            "{:>5}  {:<19} {:<8} {:>15}  {:>14}  {:>15}  {:>9}  codes",
            "nodes",
            "launcher",
            "signal",
            "workers (ms)",
            "slowest (ms)",
            "range (ms)",
            "exit (ms)"
        );
        let mut kinds = vec![Kind::Rdzv, Kind::RdzvC10d];
        kinds.extend_from_slice(torchruns);
        for &n in &sizes {
            assert!(n >= 1, "N must be at least 1");
            for &kind in &kinds {
                for &case in &signalled {
                    signal_case(kind, case, n, &|r| target(kind, case, n, r, n));
                }
            }
        }
    }
    if cases.contains(&Case::Hang) {
        let mut kinds = vec![Kind::Rdzv];
        let mut unavailable = Vec::new();
        match &nvrx {
            Some(_) => kinds.push(Kind::FtLauncher),
            None => unavailable.push((
                Kind::FtLauncher.name(),
                std::env::var("RDZV_NVRX_UNAVAILABLE").unwrap_or_else(|_| {
                    "no NVRx environment (RDZV_NVRX_PYTHON: scripts/nvrx-env.sh)".into()
                }),
            )),
        }
        kinds.extend(torchruns.iter().filter(|k| **k == Kind::TorchrunC10d));
        if python.is_some() {
            // BENCH_HANG_SUSPECT_ONLY: the verdict's table alone (it takes its own 60 runs).
            if std::env::var_os("BENCH_HANG_SUSPECT_ONLY").is_none() {
                hang::table(&sizes, &kinds, &unavailable, &|kind, n, r| {
                    target(kind, Case::Hang, n, r, n)
                });
            }
            hang::suspect_table(&sizes, &|kind, n, r| target(kind, Case::Hang, n, r, n));
        } else {
            println!("hang: not measured, its workers need PyTorch");
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The launch and recovery cases, for every launcher.
fn recovery_table(
    sizes: &[usize],
    cases: &[Case],
    torchruns: &[Kind],
    target: &dyn Fn(Kind, Case, usize, usize, usize) -> Target,
) {
    let mut kinds = vec![Kind::Rdzv, Kind::RdzvNoWatchdog];
    kinds.extend_from_slice(torchruns);
    println!(
        "one peer-connected python worker per node, --nnodes=N-1:N, lease_ttl 10 s (default), \
         last call {LAST_CALL} s, monitor 0.1 s; median of {RUNS}; recovery: from the event to \
         every remaining node in the new round (round), its new worker running (worker) and \
         stepping with all its peers (step), and the restarts the other nodes spent"
    );
    println!(
        "{:>5}  {:<23} {:>11}  {:<17} {:>10}  {:>11}  {:>9}  {:>8}",
        "nodes",
        "launcher",
        "launch (ms)",
        "case",
        "round (ms)",
        "worker (ms)",
        "step (ms)",
        "restarts"
    );
    for &n in sizes {
        assert!(n >= 2, "N must be at least 2 (one node is lost)");
        for &kind in &kinds {
            for &case in cases {
                if case == Case::Drained && kind == Kind::TorchrunC10d {
                    continue; // torchrun has no drain of its own; rdzv's works on etcd-v3
                }
                let (mut launch, mut recovery) = (Vec::new(), Vec::new());
                for r in 0..RUNS {
                    let target = target(kind, case, n, r, n - 1);
                    let Some((l, rec)) = one_run(kind, case, &target, n) else {
                        break;
                    };
                    launch.push(l);
                    recovery.push(rec);
                }
                if launch.len() < RUNS {
                    println!(
                        "{n:>5}  {:<23} workers did not all take a first step within {} s",
                        kind.name(),
                        LAUNCH_LIMIT.as_secs()
                    );
                    continue;
                }
                let got: Vec<Recovery> = recovery.iter().flatten().copied().collect();
                let (round, started, step, restarts) = if got.len() == recovery.len() {
                    let formed: Option<Vec<Duration>> = got.iter().map(|r| r.0).collect();
                    let round = formed.map_or("-".into(), |f| millis(median(f), 0));
                    let started = median(got.iter().map(|r| r.1).collect());
                    let step = median(got.iter().map(|r| r.2).collect());
                    let spent = got.iter().map(|r| r.3).max().unwrap_or(0);
                    (
                        round,
                        millis(started, 0),
                        millis(step, 0),
                        spent.to_string(),
                    )
                } else {
                    let none = format!("none in {} s", RECOVERY_LIMIT.as_secs());
                    (none, "-".into(), "-".into(), "-".into())
                };
                println!(
                    "{n:>5}  {:<23} {:>11}  {:<17} {round:>10}  {started:>11}  {step:>9}  {restarts:>8}",
                    kind.name(),
                    millis(median(launch), 0),
                    case.name()
                );
            }
        }
    }
}
