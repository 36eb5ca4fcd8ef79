//! Launcher benchmark: real `rdzv run` processes, each with one shell worker, on a local etcd.
//! Prints, for each node count N (median of a few runs):
//!
//! - launch: from starting N launchers to every worker running (connect, rendezvous, rank
//!   exchange, process start);
//! - recovery: from SIGKILL of one launcher (its worker dies with it) to every survivor's new
//!   worker running in the smaller world. Its floor is the lease TTL (a dead node is noticed
//!   when its lease expires) plus the last call of the re-formed round, printed beside it.
//!
//! Run with `scripts/bench.sh --launcher` or `cargo build --release --bin rdzv --example
//! bench_launcher && target/release/examples/bench_launcher HOST:PORT [N ...]`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LEASE_TTL: u64 = 2;
const LAST_CALL: u64 = 1;

struct Launcher {
    child: Child,
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `rdzv` binary next to this example's directory (both built in the same profile).
fn rdzv_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("rdzv")
}

/// Starts `n` launchers; each worker line "STARTED <world>" arrives on `tx` with its node.
fn launch(url: &str, n: usize, tx: &mpsc::Sender<(usize, u32)>) -> Vec<Launcher> {
    (0..n)
        .map(|i| {
            let mut child = Command::new(rdzv_binary())
                .args(["run", "--rdzv", url, "--monitor-interval=0.1", "sh", "-c"])
                .arg("echo STARTED $WORLD_SIZE; exec sleep 600")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("cannot start rdzv (build it: cargo build --release --bin rdzv)");
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(world) = line.split("]:STARTED ").nth(1) {
                        let _ = tx.send((i, world.trim().parse().unwrap_or(0)));
                    }
                }
            });
            Launcher { child }
        })
        .collect()
}

/// Waits until every node in `nodes` reported a worker in a world of `world`.
fn all_started(rx: &mpsc::Receiver<(usize, u32)>, nodes: &[usize], world: u32) {
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !nodes.iter().all(|n| seen.contains(n)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (node, w) = rx
            .recv_timeout(left)
            .expect("workers did not start within 120 s");
        if w == world {
            seen.insert(node);
        }
    }
}

fn close(url: &str) {
    let status = Command::new(rdzv_binary())
        .args(["close", url])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

fn one_run(endpoint: &str, n: usize, run: &str) -> (Duration, Duration) {
    let url = format!(
        "etcd://{endpoint}/{run}?min_nodes={}&max_nodes={n}&last_call_timeout={LAST_CALL}&lease_ttl={LEASE_TTL}",
        n - 1
    );
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let mut launchers = launch(&url, n, &tx);
    let everyone: Vec<usize> = (0..n).collect();
    all_started(&rx, &everyone, n as u32);
    let launched = started.elapsed();

    let victim = n - 1;
    let killed = Instant::now();
    let _ = launchers[victim].child.kill();
    let _ = launchers[victim].child.wait();
    all_started(&rx, &everyone[..victim], n as u32 - 1);
    let recovered = killed.elapsed();
    close(&url);
    for l in launchers.iter_mut() {
        let _ = l.child.wait();
    }
    (launched, recovered)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
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
    println!(
        "rdzv run, one shell worker per node; recovery floor = lease_ttl {LEASE_TTL} s + last call {LAST_CALL} s"
    );
    println!(
        "{:>5}  {:>12}  {:>14}",
        "nodes", "launch (ms)", "recovery (ms)"
    );
    for n in sizes {
        assert!(n >= 2, "N must be at least 2 (one node is killed)");
        let runs = 3;
        let (mut launch, mut recovery) = (Vec::new(), Vec::new());
        for r in 0..runs {
            let (l, rec) = one_run(
                &endpoint,
                n,
                &format!("bench-launcher-{}-{n}-{r}", std::process::id()),
            );
            launch.push(l);
            recovery.push(rec);
        }
        println!(
            "{n:>5}  {:>12.0}  {:>14.0}",
            median(launch).as_secs_f64() * 1e3,
            median(recovery).as_secs_f64() * 1e3
        );
    }
}
