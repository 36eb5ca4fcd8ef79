//! `--watched`: what a scheduler watching a run costs the run's rounds. One job of 8 nodes
//! forms rounds back to back (every node calls next again, as in a restart), in turns of 20
//! rounds without and with W observers on the run, each an `Admin` watch plus a status poll
//! every second (`rdzv status --watch` and `rdzv status`), on a connection of their own.

use rdzv::admin::Admin;
use rdzv::{Params, Rendezvous};
use rdzv_bench::stats::{ms, percentile};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` rounds of every node: each from the last call of next to the last return.
async fn rounds(nodes: &[Arc<Rendezvous>], n: usize) -> Vec<Duration> {
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let calls: Vec<_> = nodes
            .iter()
            .map(|node| {
                let node = node.clone();
                tokio::spawn(async move {
                    let called = Instant::now();
                    node.next().await.unwrap();
                    (called, Instant::now())
                })
            })
            .collect();
        let mut times = Vec::with_capacity(calls.len());
        for call in calls {
            times.push(call.await.unwrap());
        }
        let last_call = times.iter().map(|t| t.0).max().unwrap();
        took.push(times.iter().map(|t| t.1).max().unwrap() - last_call);
    }
    took
}

/// An observer of the run, until aborted.
async fn observe(admin: Admin) {
    let mut watch = admin.watch();
    let mut poll = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            got = watch.next() => { got.unwrap(); }
            _ = poll.tick() => { admin.status().await.unwrap(); }
        }
    }
}

pub async fn watched(endpoint: &str, observers: &[usize]) {
    println!("rounds of 8 (every node joins again), in turns without and with W observers");
    for &w in observers {
        let run = format!("watched-{w}-{}", std::process::id());
        let url = format!("etcd://{endpoint}/{run}?min_nodes=8&max_nodes=8");
        let params = Params::from_url(&url).unwrap();
        // The observers' own connection (a process's connection is per endpoint list): a
        // scheduler runs elsewhere.
        let elsewhere = Params::from_url(&url.replacen("127.0.0.1", "localhost", 1)).unwrap();
        let mut nodes = Vec::new();
        for _ in 0..8 {
            nodes.push(Arc::new(Rendezvous::new(params.clone()).await.unwrap()));
        }
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for turn in 0..10 {
            if turn % 2 == 0 {
                without.extend(rounds(&nodes, 20).await);
                continue;
            }
            let mut tasks = Vec::new();
            for _ in 0..w {
                let admin = Admin::connect(elsewhere.clone()).await.unwrap();
                tasks.push(tokio::spawn(observe(admin)));
            }
            with.extend(rounds(&nodes, 20).await);
            for task in tasks {
                task.abort();
            }
        }
        for node in &nodes {
            node.shutdown().await.unwrap();
        }
        without.sort();
        with.sort();
        let (a, b) = (percentile(&without, 0.5), percentile(&with, 0.5));
        println!(
            "W={w:>3}  without: median {:>9} p90 {:>9}   with: median {:>9} p90 {:>9}   ratio {:.2}x",
            ms(a, 2),
            ms(percentile(&without, 0.9), 2),
            ms(b, 2),
            ms(percentile(&with, 0.9), 2),
            b.as_secs_f64() / a.as_secs_f64()
        );
    }
}
