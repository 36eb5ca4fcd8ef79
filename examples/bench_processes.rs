//! Multi-process benchmark: every node its own OS process with its own connection to etcd, as
//! in a real job. Spawns N `bench_node` processes (or the Python binding's
//! `bindings/python/examples/bench_node.py` with `--python`), waits until all are connected,
//! releases them at once and prints the median time from the last call of `next` to the last
//! return, read from the processes' own CLOCK_MONOTONIC stamps. Run with
//! `scripts/bench.sh --processes` or `cargo run --release --example bench_processes --
//! HOST:PORT [--python] [N ...]`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Proc {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

fn spawn(command: &[String], url: &str) -> Proc {
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .arg(url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    Proc { child, lines }
}

/// One round of `n` processes; returns the time from the last call to the last return.
fn one_round(command: &[String], endpoint: &str, n: usize, run: &str) -> Duration {
    let url = format!("etcd://{endpoint}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=120");
    let mut procs: Vec<Proc> = (0..n).map(|_| spawn(command, &url)).collect();
    for p in &mut procs {
        let line = p.lines.next().expect("node exited before ready").unwrap();
        assert_eq!(line, "ready", "unexpected line from a node: {line}");
    }
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
    Duration::from_nanos((last_return - last_call) as u64)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .expect("usage: bench_processes HOST:PORT [--python] [N ...]");
    let rest: Vec<String> = args.collect();
    let python = rest.iter().any(|a| a == "--python");
    let mut sizes: Vec<usize> = rest
        .iter()
        .filter(|a| *a != "--python")
        .map(|a| a.parse().expect("N must be a number"))
        .collect();
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
    println!("processes ({kind}): time from the last node's call of next to the last return");
    for &n in &sizes {
        let repeats = if n <= 64 { 5 } else { 3 };
        let mut times: Vec<Duration> = (0..repeats)
            .map(|r| one_round(&command, &endpoint, n, &format!("procs-{kind}-{n}-{r}")))
            .collect();
        times.sort();
        println!(
            "N={n:>5}  median {:>9.2} ms  (min {:.2} ms, max {:.2} ms, {repeats} runs)",
            times[repeats / 2].as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3,
            times[repeats - 1].as_secs_f64() * 1e3
        );
    }
}
