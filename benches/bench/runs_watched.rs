//! `--runs-watched R`: one scheduler process watching R runs at once, as a platform's scheduler
//! does with the `Admin` API (Rust here; the Go and Python `Admin` call the same code through
//! the C ABI). R runs of one node each form a round; then one `Admin` and one `StatusWatch` per
//! run, all in this process, read each run's status; the runs rest 10 s; then every run is
//! closed and each watch must report it. Prints what the watches cost this process and etcd:
//! connections, gRPC streams, etcd watchers, memory, requests and CPU at rest, and the time
//! until the last watch saw its run close. Panics on any failed watch.

use super::{futures_lite, metric_f64, metrics_text, resident_bytes};
use rdzv::admin::Admin;
use rdzv::{Params, Rendezvous};
use rdzv_bench::stats::ms;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WATCH_STREAMS: &str = "grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}";

/// etcd's requests handled so far: every unary call and every message received on a stream.
async fn requests(endpoint: &str) -> f64 {
    let mut sum = 0.0;
    for member in endpoint.split(',') {
        let body = metrics_text(member).await;
        // Unary calls once each, as handled; streams by the messages they carry.
        sum += body
            .lines()
            .filter(|l| {
                let unary = l.contains("grpc_type=\"unary\"");
                (unary && l.starts_with("grpc_server_handled_total{"))
                    || (!unary && l.starts_with("grpc_server_msg_received_total{"))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum
}

/// Sockets this process holds open.
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|link| link.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

pub async fn runs_watched(endpoint: &str, runs: usize) {
    let tag = std::process::id();
    let params = |i: usize| {
        Params::from_url(&format!(
            "etcd://{endpoint}/watched-{tag}-{i}?min_nodes=1&max_nodes=1"
        ))
        .unwrap()
    };
    // The runs: one node each, in a round.
    let started = Instant::now();
    let mut nodes = Vec::with_capacity(runs);
    for chunk in 0..runs.div_ceil(64) {
        let batch = (chunk * 64..((chunk + 1) * 64).min(runs)).map(|i| {
            let params = params(i);
            async move {
                let node = Rendezvous::new(params).await.unwrap();
                node.next().await.unwrap();
                Arc::new(node)
            }
        });
        nodes.extend(futures_lite(batch).await);
    }
    println!(
        "{runs} runs of one node formed in {}",
        ms(started.elapsed(), 2)
    );

    let (rss, sockets_before) = (resident_bytes(), sockets());
    let streams = metric_f64(endpoint, WATCH_STREAMS).await;
    let watchers = metric_f64(endpoint, "etcd_debugging_mvcc_watcher_total").await;
    let etcd_rss = metric_f64(endpoint, "process_resident_memory_bytes").await;
    // The scheduler: an Admin and a StatusWatch per run, each read once.
    let started = Instant::now();
    let mut watches = Vec::with_capacity(runs);
    for chunk in 0..runs.div_ceil(64) {
        let batch = (chunk * 64..((chunk + 1) * 64).min(runs)).map(|i| {
            let params = params(i);
            async move {
                let admin = Admin::connect(params).await.unwrap();
                let mut watch = admin.watch();
                let first = watch.next().await.unwrap();
                assert!(first.exists && !first.closed, "{first:?}");
                watch
            }
        });
        watches.extend(futures_lite(batch).await);
    }
    let opened = started.elapsed();
    let per_watch = |after: f64, before: f64| (after - before) / runs as f64;
    let rss_per = per_watch(resident_bytes() as f64, rss as f64) / 1024.0;
    let etcd_rss_per = per_watch(
        metric_f64(endpoint, "process_resident_memory_bytes").await,
        etcd_rss,
    ) / 1024.0;
    println!(
        "{runs} watches opened and their first statuses read in {} (one Admin and one StatusWatch per run, one process)",
        ms(opened, 2)
    );
    println!(
        "  sockets of the process: {sockets_before} before, {} after; gRPC watch streams opened {:.0}; etcd watchers added {:.0}",
        sockets(),
        metric_f64(endpoint, WATCH_STREAMS).await - streams,
        metric_f64(endpoint, "etcd_debugging_mvcc_watcher_total").await - watchers
    );
    println!("  memory per watched run: this process {rss_per:.1} KiB, etcd {etcd_rss_per:.1} KiB");

    // At rest: what the watches cost while nothing changes (the nodes' lease refreshes go on).
    let (before, cpu) = (
        requests(endpoint).await,
        metric_f64(endpoint, "process_cpu_seconds_total").await,
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (after, cpu_after) = (
        requests(endpoint).await,
        metric_f64(endpoint, "process_cpu_seconds_total").await,
    );
    println!(
        "  at rest for 10 s: etcd handled {:.1} requests/s for the {runs} runs and their watches (the nodes' lease refreshes included), etcd CPU {:.1}%",
        (after - before) / 10.0,
        (cpu_after - cpu) * 10.0
    );

    // Every run closed: each watch must report it.
    let started = Instant::now();
    let seen: Vec<_> = watches
        .into_iter()
        .map(|mut watch| {
            tokio::spawn(async move {
                loop {
                    let status = tokio::time::timeout(Duration::from_secs(60), watch.next())
                        .await
                        .expect("a watch did not see its run close within 60 s")
                        .expect("a watch failed");
                    if status.closed {
                        return Instant::now();
                    }
                }
            })
        })
        .collect();
    for node in &nodes {
        node.set_closed().await.unwrap();
    }
    let mut last = started;
    for s in seen {
        last = last.max(s.await.unwrap());
    }
    println!(
        "  every run closed (one after another): all {runs} watches saw it, the last {} after the first close; failed watches: 0",
        ms(last - started, 2)
    );
    for node in &nodes {
        let _ = node.shutdown().await;
    }
}
