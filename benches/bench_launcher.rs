//! Launcher benchmark: real `rdzv run` processes, each with one shell worker, on a local etcd.
//! Prints, for each node count N (median of a few runs):
//!
//! - launch: from starting N launchers to every worker running (connect, rendezvous, rank
//!   exchange, process start);
//! - recovery: from SIGKILL of one launcher (its worker dies with it) to every survivor's new
//!   worker running in the smaller world. Its floor is the lease TTL (a dead node is noticed
//!   when its lease expires) plus the last call of the re-formed round, printed beside it.
//!
//! Where a PyTorch environment exists (`RDZV_TORCH_PYTHON`, or the one `scripts/torch-env.sh`
//! caches), torchrun is measured in the same run with the same worker, with its c10d backend
//! and with rdzv's `etcd-v3` backend. A node is killed with its whole process group (agent and
//! worker) for every launcher.
//!
//! Run with `scripts/bench.sh --launcher` or `cargo build --release -p rdzv-cli -p rdzv-bench
//! --bin rdzv --bin bench_launcher && target/release/bench_launcher HOST:PORT [N ...]`.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LEASE_TTL: u64 = 2;
const LAST_CALL: u64 = 1;

struct Launcher {
    child: Child,
}

impl Launcher {
    /// SIGKILL to the node's whole process group: its agent and its worker.
    fn kill(&mut self) {
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Which launcher a run measures.
#[derive(Clone, Copy)]
enum Kind {
    Rdzv,
    /// torchrun with its c10d backend (its store on a port of the first node).
    TorchrunC10d,
    /// torchrun with rdzv's etcd-v3 backend.
    TorchrunEtcdV3,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Rdzv => "rdzv run",
            Kind::TorchrunC10d => "torchrun c10d",
            Kind::TorchrunEtcdV3 => "torchrun etcd-v3",
        }
    }
}

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

const WORKER: &str = "echo STARTED $WORLD_SIZE; exec sleep 600";

/// The command that starts one node of `kind` in a job of N-1 to N nodes.
fn node_command(kind: Kind, target: &Target, n: usize) -> Command {
    let nnodes = format!("--nnodes={}:{n}", n - 1);
    match kind {
        Kind::Rdzv => {
            let mut c = Command::new(rdzv_binary());
            c.args([
                "run",
                "--rdzv",
                &target.url,
                "--monitor-interval=0.1",
                "sh",
                "-c",
                WORKER,
            ]);
            c
        }
        Kind::TorchrunC10d | Kind::TorchrunEtcdV3 => {
            let python = target.python.as_ref().expect("torch python");
            let mut c = Command::new(python);
            let (backend, endpoint) = match kind {
                Kind::TorchrunC10d => ("c10d", format!("127.0.0.1:{}", target.c10d_port)),
                _ => ("etcd-v3", target.endpoint.clone()),
            };
            c.args(["-m", "torch.distributed.run", &nnodes, "--nproc-per-node=1"])
                .arg(format!("--rdzv-backend={backend}"))
                .arg(format!("--rdzv-endpoint={endpoint}"))
                .arg(format!("--rdzv-id={}", target.run))
                .arg(format!(
                    "--rdzv-conf=last_call_timeout={LAST_CALL},lease_ttl={LEASE_TTL}"
                ))
                .args(["--monitor-interval=0.1", "--local-addr=127.0.0.1"])
                .args(["--no-python", "sh", "-c", WORKER]);
            // rdzv's backend from this checkout, on the library built with this benchmark.
            let lib = rdzv_binary().with_file_name("librdzv.so");
            let package = concat!(env!("CARGO_MANIFEST_DIR"), "/bindings/python");
            c.env("RDZV_LIBRARY", lib).env("PYTHONPATH", package);
            c
        }
    }
}

/// Where one run's nodes meet.
struct Target {
    endpoint: String,
    url: String,
    run: String,
    c10d_port: u16,
    python: Option<PathBuf>,
}

/// The `rdzv` binary beside this one (both built in the same profile).
fn rdzv_binary() -> std::path::PathBuf {
    std::env::current_exe().unwrap().with_file_name("rdzv")
}

/// Starts `n` nodes; each worker line "STARTED <world>" arrives on `tx` with its node.
fn launch(kind: Kind, target: &Target, n: usize, tx: &mpsc::Sender<(usize, u32)>) -> Vec<Launcher> {
    (0..n)
        .map(|i| {
            let mut child = node_command(kind, target, n)
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect(
                    "cannot start the launcher (build it: cargo build --release --lib --bin rdzv)",
                );
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    // rdzv run prefixes worker lines with "[rankN]:", torchrun does not.
                    if let Some(world) = line.split("STARTED ").nth(1) {
                        let _ = tx.send((i, world.trim().parse().unwrap_or(0)));
                    }
                }
            });
            Launcher { child }
        })
        .collect()
}

/// Waits (at most `limit`) until every node in `nodes` reported a worker in a world of
/// `world`; false if they did not.
fn all_started(
    rx: &mpsc::Receiver<(usize, u32)>,
    nodes: &[usize],
    world: u32,
    limit: Duration,
) -> bool {
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + limit;
    while !nodes.iter().all(|n| seen.contains(n)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((node, w)) if w == world => {
                seen.insert(node);
            }
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    true
}

fn close(url: &str) {
    let status = Command::new(rdzv_binary())
        .args(["close", url])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

/// How long survivors get to restart their workers after a node is killed.
const RECOVERY_LIMIT: Duration = Duration::from_secs(40);

/// Launch time, and recovery time if the survivors restarted within `RECOVERY_LIMIT`.
fn one_run(kind: Kind, target: &Target, n: usize) -> (Duration, Option<Duration>) {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let mut launchers = launch(kind, target, n, &tx);
    let everyone: Vec<usize> = (0..n).collect();
    let limit = Duration::from_secs(120);
    assert!(
        all_started(&rx, &everyone, n as u32, limit),
        "{}: workers did not start within 120 s",
        kind.name()
    );
    let launched = started.elapsed();

    // Not the first node: torchrun's c10d store lives on the node that started it.
    let victim = n - 1;
    let killed = Instant::now();
    launchers[victim].kill();
    let recovered = all_started(&rx, &everyone[..victim], n as u32 - 1, RECOVERY_LIMIT)
        .then(|| killed.elapsed());
    if let Kind::Rdzv = kind {
        close(&target.url);
    }
    for l in launchers.iter_mut() {
        l.kill();
    }
    (launched, recovered)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .expect("usage: bench_launcher HOST:PORT [N ...]");
    let mut sizes: Vec<usize> = args.map(|a| a.parse().expect("N is a number")).collect();
    if sizes.is_empty() {
        sizes = vec![2, 4, 8];
    }
    let python = torch_python();
    let mut kinds = vec![Kind::Rdzv];
    match &python {
        Some(_) => kinds.extend([Kind::TorchrunC10d, Kind::TorchrunEtcdV3]),
        None => println!("no PyTorch environment: torchrun is not measured"),
    }
    println!(
        "one shell worker per node, median of 3; recovery floor = lease_ttl {LEASE_TTL} s + last call {LAST_CALL} s"
    );
    println!(
        "{:>5}  {:<17} {:>12}  {:>14}  {:>20}",
        "nodes", "launcher", "launch (ms)", "recovery (ms)", "launch vs rdzv run"
    );
    for n in sizes {
        assert!(n >= 2, "N must be at least 2 (one node is killed)");
        let mut rdzv_launch = None;
        for &kind in &kinds {
            let (mut launch, mut recovery) = (Vec::new(), Vec::new());
            for r in 0..3 {
                let run = format!(
                    "bench-launcher-{}-{n}-{r}-{}",
                    std::process::id(),
                    kind as u8
                );
                let target = Target {
                    url: format!(
                        "etcd://{endpoint}/{run}?min_nodes={}&max_nodes={n}&last_call_timeout={LAST_CALL}&lease_ttl={LEASE_TTL}",
                        n - 1
                    ),
                    endpoint: endpoint.clone(),
                    run,
                    c10d_port: free_port(),
                    python: python.clone(),
                };
                let (l, rec) = one_run(kind, &target, n);
                launch.push(l);
                recovery.push(rec);
            }
            let launch = median(launch);
            let recovered: Vec<Duration> = recovery.iter().flatten().copied().collect();
            let recovery = if recovered.len() == recovery.len() {
                format!("{:.0}", median(recovered).as_secs_f64() * 1e3)
            } else {
                format!("none in {} s", RECOVERY_LIMIT.as_secs())
            };
            let base = *rdzv_launch.get_or_insert(launch);
            println!(
                "{n:>5}  {:<17} {:>12.0}  {recovery:>14}  {:>19.1}x",
                kind.name(),
                launch.as_secs_f64() * 1e3,
                launch.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
}
