//! What a job at rest costs etcd: real `rdzv run` launchers whose workers only sleep, on a
//! real etcd, measured from etcd's own metrics (requests it served: unary calls handled, and
//! messages received on its streams, such as a lease refresh or a new watch).

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{Launcher, RDZV};
use std::process::Command;
use std::time::{Duration, Instant};

/// The goal (issue "a job at rest costs etcd nothing"): lease refreshes and nothing else.
const GOAL_PER_NODE_PER_S: f64 = 1.0;

/// Requests etcd served so far.
fn requests(etcd: &Etcd) -> f64 {
    etcd.metric_sum("grpc_server_handled_total", &["grpc_type=\"unary\""])
        + etcd.metric_sum("grpc_server_msg_received_total", &["_stream\""])
}

#[test]
fn a_job_at_rest_costs_etcd_at_most_one_request_per_node_per_second() {
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
    // Let every launcher reach its steady state (its first ticks start the membership watch)
    // before the window opens; then count what the window costs.
    std::thread::sleep(Duration::from_secs(2));
    let (before, started) = (requests(&etcd), Instant::now());
    std::thread::sleep(WINDOW);
    let per_node_per_s =
        (requests(&etcd) - before) / started.elapsed().as_secs_f64() / NODES as f64;
    println!("at rest: {per_node_per_s:.2} etcd requests per node per second ({NODES} nodes)");
    assert!(
        per_node_per_s <= GOAL_PER_NODE_PER_S,
        "{per_node_per_s:.2} requests per node per second at rest"
    );
    for l in nodes.iter_mut() {
        l.signal(libc::SIGTERM);
        l.exit(30);
    }
}
