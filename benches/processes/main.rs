//! Multi-process benchmark: every node its own OS process with its own connection to etcd, as
//! in a real job. Spawns N `bench_node` processes (or the Python binding's
//! `bindings/python/examples/bench_node.py` with `--python`), waits until all are connected,
//! releases them at once and prints the median time from the last call of `next` to the last
//! return, read from the processes' own CLOCK_MONOTONIC stamps. Run with
//! `scripts/bench.sh --processes` or `cargo run --release -p rdzv-bench --bin bench_processes
//! -- HOST:PORT [--python] [--per-process K] [N ...]`. With `--per-process K`, N/K processes host
//! K nodes each (each process one connection): how a round larger than one process's HTTP/2
//! connection or the machine's process budget is measured.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Proc {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

fn spawn(command: &[String], url: &str, per_process: usize) -> Proc {
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .arg(url)
        .args((per_process > 1).then(|| per_process.to_string()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    Proc { child, lines }
}

/// What one node process costs once connected: resident memory, threads, open sockets.
#[derive(Clone, Copy, Default)]
struct Cost {
    rss_kib: u64,
    threads: u64,
    sockets: u64,
}

fn cost_of(pid: u32) -> Cost {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count() as u64
        })
        .unwrap_or(0);
    Cost {
        rss_kib: field("VmRSS:"),
        threads: field("Threads:"),
        sockets,
    }
}

/// One round of `n` nodes in processes of `per_process` nodes: the time from the last call to
/// the last return, the time from the first spawn to every node connected, and the median
/// process's cost.
fn one_round(
    command: &[String],
    endpoint: &str,
    (n, per_process): (usize, usize),
    run: &str,
) -> (Duration, Duration, Cost) {
    let url = format!("etcd://{endpoint}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=300");
    let spawned = std::time::Instant::now();
    let mut procs: Vec<Proc> = (0..n / per_process)
        .map(|_| spawn(command, &url, per_process))
        .collect();
    for p in &mut procs {
        let line = p.lines.next().expect("node exited before ready").unwrap();
        assert_eq!(line, "ready", "unexpected line from a node: {line}");
    }
    let startup = spawned.elapsed();
    let mut costs: Vec<Cost> = procs.iter().map(|p| cost_of(p.child.id())).collect();
    costs.sort_by_key(|c| c.rss_kib);
    let cost = costs[costs.len() / 2];
    for p in &mut procs {
        let stdin = p.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }
    let (mut last_call, mut last_return) = (0u128, 0u128);
    for p in &mut procs {
        let line = p
            .lines
            .next()
            .expect("node exited without a round")
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        last_call = last_call.max(v["called"].as_u64().unwrap() as u128);
        last_return = last_return.max(v["returned"].as_u64().unwrap() as u128);
    }
    for p in &mut procs {
        assert!(p.child.wait().unwrap().success());
    }
    let took = Duration::from_nanos((last_return - last_call) as u64);
    (took, startup, cost)
}

/// Lifts the soft limit on open files to the hard one: two pipes per node process.
fn raise_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .expect("usage: bench_processes HOST:PORT [--python] [--per-process K] [N ...]");
    let (mut python, mut per_process, mut sizes) = (false, 1usize, Vec::new());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--python" => python = true,
            "--per-process" => {
                let k = args.next().and_then(|k| k.parse().ok());
                per_process = k.filter(|&k| k > 0).expect("--per-process needs a count");
            }
            n => sizes.push(n.parse::<usize>().expect("N must be a number")),
        }
    }
    assert!(
        sizes.iter().all(|n| n % per_process == 0),
        "every N must be a multiple of --per-process"
    );
    assert!(
        !python || per_process == 1,
        "--python runs one node per process"
    );
    if sizes.is_empty() {
        sizes = if python {
            vec![2, 8, 32]
        } else {
            vec![8, 64, 256]
        };
    }
    let command: Vec<String> = if python {
        vec![
            "python3".into(),
            "bindings/python/examples/bench_node.py".into(),
        ]
    } else {
        let exe = std::env::current_exe().unwrap();
        vec![exe.with_file_name("bench_node").display().to_string()]
    };
    let kind = if python { "python" } else { "rust" };
    raise_file_limit();
    let tag = std::process::id();
    println!("processes ({kind}, {per_process} node(s) each): time from the last node's call of next to the last return");
    println!("  and per process once connected: start-up (first spawn to all connected),");
    println!("  resident memory, threads and sockets of the median process");
    for &n in &sizes {
        let repeats = match n {
            0..=64 => 5,
            65..=4096 => 3,
            _ => 1,
        };
        let mut rounds: Vec<(Duration, Duration, Cost)> = (0..repeats)
            .map(|r| {
                one_round(
                    &command,
                    &endpoint,
                    (n, per_process),
                    &format!("procs-{kind}-{n}-{r}-{tag}"),
                )
            })
            .collect();
        rounds.sort_by_key(|r| r.0);
        let (took, startup, cost) = rounds[repeats / 2];
        println!(
            "N={n:>5}  median {:>9.2} ms  (min {:.2} ms, max {:.2} ms, {repeats} runs)  start-up {:.2} s  {} KiB  {} threads  {} sockets",
            took.as_secs_f64() * 1e3,
            rounds[0].0.as_secs_f64() * 1e3,
            rounds[repeats - 1].0.as_secs_f64() * 1e3,
            startup.as_secs_f64(),
            cost.rss_kib,
            cost.threads,
            cost.sockets
        );
    }
}
