//! Scale: many nodes in one process against one local etcd. Prints the time and etcd's write
//! count (speed is reported, not asserted: machines are shared); asserts correctness.

use crate::common;

use common::Etcd;
use rdzv::{Params, Rendezvous};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Creates `n` handles, releases them into `next` together, checks one world, and returns the
/// time from the release to the last return and the number of etcd writes for the round.
fn one_round(etcd: &Etcd, n: usize) -> (Duration, i64) {
    let url = etcd.url(
        "scale",
        &format!("min_nodes={n}&max_nodes={n}&join_timeout=120"),
    );
    let params = Params::from_url(&url).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            nodes.push(Arc::new(Rendezvous::new(params.clone()).await.unwrap()));
        }
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .unwrap();
        let before = client
            .get("/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        // All tasks wait on one barrier, so every call of next starts within a scheduler tick.
        let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
        let tasks: Vec<_> = nodes
            .iter()
            .map(|node| {
                let (node, barrier) = (node.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    node.next().await.map(|(info, _)| info)
                })
            })
            .collect();
        barrier.wait().await;
        let released = Instant::now();
        let mut infos = Vec::with_capacity(n);
        for t in tasks {
            infos.push(t.await.unwrap().unwrap());
        }
        let elapsed = released.elapsed();
        let after = client
            .get("/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let ranks: BTreeSet<u32> = infos.iter().map(|i| i.rank).collect();
        assert_eq!(ranks.len(), n, "ranks must be unique");
        assert_eq!(ranks, (0..n as u32).collect());
        assert!(infos
            .iter()
            .all(|i| i.world_size as usize == n && i.round == infos[0].round));
        for node in &nodes {
            node.shutdown().await.unwrap();
        }
        (elapsed, after - before)
    })
}

#[test]
fn a_burst_of_256_and_a_round_of_1024_nodes() {
    let etcd = Etcd::start();
    for n in [256, 1024] {
        let (time, writes) = one_round(&etcd, n);
        println!(
            "scale: N={n} formed in {:.0} ms with {writes} etcd writes",
            time.as_secs_f64() * 1e3
        );
        assert_eq!(
            writes,
            n as i64 + 1,
            "a round of N costs N joins and one seal"
        );
    }
}

/// Waits (at most 30 s) until etcd holds exactly `want` watchers.
fn wait_for_watchers(etcd: &Etcd, want: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while etcd.metric("etcd_debugging_mvcc_watcher_total") != want {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::yield_now();
    }
}

/// A job whose nodes finish one after another, each watching for lost members (supervisors
/// poll num_lost), costs etcd about one watch event per node, not N²/2: a node's watch ends at
/// the first member it sees lost.
#[test]
fn nodes_leaving_one_by_one_cost_one_watch_event_each() {
    let n = 32;
    let etcd = Etcd::start();
    let url = etcd.url("leaving", &format!("min_nodes={n}&max_nodes={n}"));
    let idle = etcd.metric("etcd_debugging_mvcc_watcher_total");
    let nodes = common::on_threads(n, move |_| {
        let node = rdzv::BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        node.next().unwrap();
        node
    });
    wait_for_watchers(&etcd, idle, "the round's watches were never cancelled");
    for node in &nodes {
        assert_eq!(node.num_lost().unwrap(), 0);
    }
    // Each node's tracker watches the round's `join/` (losses) and `drain/` (departures), the
    // next round's `join/` (nodes waiting) and `closed`; its peer watch, its own `suspect/`
    // key (to answer a peer that cannot reach it).
    wait_for_watchers(
        &etcd,
        idle + 5 * n as i64,
        "num_lost never started its watches",
    );
    let before = etcd.metric("etcd_debugging_mvcc_events_total");
    for node in &nodes {
        node.shutdown().unwrap();
    }
    let events = etcd.metric("etcd_debugging_mvcc_events_total") - before;
    println!("{n} nodes leaving one by one: {events} watch events");
    // A watch kept to the end would see every later departure: n(n-1)/2 = 496 events.
    assert!(
        events <= 2 * n as i64,
        "{events} watch events for {n} departures"
    );
}
