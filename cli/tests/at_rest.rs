//! What a job at rest costs etcd: real `rdzv run` launchers whose workers only sleep, on a
//! real etcd, measured from etcd's own metrics (requests it served: unary calls handled, and
//! messages received on its streams, such as a lease refresh or a new watch).

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{Launcher, RDZV};
use std::process::Command;
use std::time::{Duration, Instant};

/// The default `lease_ttl`; each lease is refreshed every third of it.
const LEASE_TTL: Duration = Duration::from_secs(10);
/// The leases each node refreshes: its own and the run's.
const LEASES_PER_NODE: f64 = 2.0;

/// What etcd served so far: unary calls, watch stream messages (a watch created or cancelled),
/// lease refreshes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Served {
    unary: f64,
    watch: f64,
    refreshes: f64,
}

fn served(etcd: &Etcd) -> Served {
    let stream = |method: &str| {
        etcd.metric_sum(
            "grpc_server_msg_received_total",
            &[&format!("grpc_method=\"{method}\""), "_stream\""],
        )
    };
    Served {
        unary: etcd.metric_sum("grpc_server_handled_total", &["grpc_type=\"unary\""]),
        watch: stream("Watch"),
        refreshes: stream("LeaseKeepAlive"),
    }
}

/// Waits until etcd has served no call and no watch message for `quiet` (the launchers have
/// formed their round and set up their watches): the job is at rest. Fails after `deadline`.
fn at_rest(etcd: &Etcd, quiet: Duration, deadline: Duration) {
    let started = Instant::now();
    let (mut last, mut since) = (served(etcd), Instant::now());
    while since.elapsed() < quiet {
        assert!(
            started.elapsed() < deadline,
            "etcd still served calls or watch messages {deadline:?} after the round formed: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        let now = served(etcd);
        if (now.unary, now.watch) != (last.unary, last.watch) {
            since = Instant::now();
        }
        last = now;
    }
}

/// The claim of docs/BENCHMARKS.md and OPERATIONS.md: at rest a node costs etcd its two
/// leases' refreshes, one each per third of `lease_ttl` (0.60 per node per second at the
/// default 10 s), and nothing else. In a window of W seconds a lease is refreshed at most
/// floor(W / (ttl / 3)) + 1 times and at least floor(W / (ttl / 3)) - 1 times.
#[test]
fn a_job_at_rest_costs_etcd_its_lease_refreshes_alone_0_6_per_node_per_second() {
    const NODES: usize = 4;
    const WINDOW: Duration = Duration::from_secs(10);
    let etcd = Etcd::start();
    let url = etcd.url("at-rest", &format!("min_nodes={NODES}&max_nodes={NODES}"));
    let mut nodes: Vec<Launcher> = (0..NODES)
        .map(|_| {
            let mut cmd = Command::new(RDZV);
            // The default --monitor-interval (0.1 s), as torchrun's.
            cmd.args(["run", "--rdzv", &url, "--no-python", "sleep", "600"]);
            for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PET_")) {
                cmd.env_remove(k);
            }
            Launcher::spawn_in_own_tmpdir(cmd)
        })
        .collect();
    for l in nodes.iter_mut() {
        l.wait_line(60, |line| line.contains("formed:"));
    }
    // A watch stream left without watches closes 5 s after its last one (`IDLE` in
    // core/src/backend/watch.rs), which etcd counts as messages: quiet for longer than that.
    at_rest(&etcd, Duration::from_secs(6), Duration::from_secs(60));
    let (before, started) = (served(&etcd), Instant::now());
    std::thread::sleep(WINDOW);
    let after = served(&etcd);
    let seconds = started.elapsed().as_secs_f64();
    let refreshes = after.refreshes - before.refreshes;
    let per_node_per_s = refreshes / seconds / NODES as f64;
    println!("at rest: {per_node_per_s:.2} lease refreshes per node per second ({NODES} nodes)");
    assert_eq!(
        (after.unary - before.unary, after.watch - before.watch),
        (0.0, 0.0),
        "at rest etcd serves lease refreshes alone: calls and watch messages in {seconds:.1} s"
    );
    let periods = (seconds / (LEASE_TTL.as_secs_f64() / 3.0)).floor();
    let leases = LEASES_PER_NODE * NODES as f64;
    let (least, most) = (leases * (periods - 1.0), leases * (periods + 1.0));
    assert!(
        (least..=most).contains(&refreshes),
        "{refreshes} lease refreshes in {seconds:.1} s, expected {least} to {most} \
         ({per_node_per_s:.2} per node per second)"
    );
    for l in nodes.iter_mut() {
        l.signal(libc::SIGTERM);
        l.exit(30);
    }
}
