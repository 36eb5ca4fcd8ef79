//! `num_waiting`, `is_closed` and `num_lost` answer from one watch per node (a job at rest
//! costs etcd its lease refreshes alone). These hold that the watched answers stay right: a
//! node joining between two polls, a watch that breaks when etcd restarts, the run closed by
//! another node; and that polling costs etcd nothing while the watch is in sync.

use crate::common::{self, Etcd};
use rdzv::{BlockingRendezvous, Params};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

/// Polls `f` until it returns `want`, for at most `secs` (an agent polls the same way).
fn becomes<T: PartialEq + std::fmt::Debug>(secs: u64, want: T, f: impl Fn() -> T) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = f();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {got:?}, not {want:?}, after {secs} s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two members of a round, and the round's number.
fn round_of_two(url: &str) -> (Arc<BlockingRendezvous>, Arc<BlockingRendezvous>) {
    let a = Arc::new(node(url));
    let b = Arc::new(node(url));
    let infos = common::on_threads(2, {
        let (a, b) = (a.clone(), b.clone());
        move |i| [&a, &b][i].next().unwrap().0
    });
    assert_eq!((infos[0].world_size, infos[1].world_size), (2, 2));
    (a, b)
}

#[test]
fn polling_a_job_at_rest_sends_etcd_no_request() {
    let etcd = Etcd::start();
    let url = etcd.url("at-rest", "min_nodes=2&max_nodes=3");
    let (a, _b) = round_of_two(&url);
    // The first polls start the watch and read once; after that, none reads.
    becomes(10, (0, 0, false), || {
        (
            a.num_waiting().unwrap(),
            a.num_lost().unwrap(),
            a.is_closed().unwrap(),
        )
    });
    let ranges = || etcd.metric_sum("grpc_server_handled_total", &["grpc_method=\"Range\""]);
    let txns = || etcd.metric_sum("grpc_server_handled_total", &["grpc_method=\"Txn\""]);
    let before = (ranges(), txns());
    for _ in 0..1000 {
        assert_eq!(a.num_waiting().unwrap(), 0);
        assert_eq!(a.num_lost().unwrap(), 0);
        assert!(!a.is_closed().unwrap());
    }
    assert_eq!((ranges(), txns()), before, "3000 polls reached etcd");
}

#[test]
fn a_node_that_joins_between_two_polls_is_counted_and_a_close_is_seen() {
    let etcd = Etcd::start();
    let url = etcd.url("joins-between", "min_nodes=2&max_nodes=3");
    let (a, b) = round_of_two(&url);
    assert_eq!(a.num_waiting().unwrap(), 0);
    let late = Arc::new(node(&url));
    let joining = {
        let late = late.clone();
        std::thread::spawn(move || late.next())
    };
    for member in [&a, &b] {
        becomes(10, 1, || member.num_waiting().unwrap());
    }
    // Another node closes the run: both members see it, and the late node's next ends.
    late.set_closed().unwrap();
    for member in [&a, &b] {
        becomes(10, true, || member.is_closed().unwrap());
    }
    assert!(joining.join().unwrap().is_err());
}

#[test]
fn the_watched_counts_stay_right_across_an_etcd_restart() {
    let mut etcd = Etcd::start();
    let url = etcd.url("restart", "min_nodes=2&max_nodes=3&lease_ttl=10");
    let (a, b) = round_of_two(&url);
    assert_eq!((a.num_waiting().unwrap(), b.num_waiting().unwrap()), (0, 0));
    // The watch breaks with the server; what happens while it is down and after it is back
    // is still counted.
    etcd.restart();
    let late = Arc::new(node(&url));
    let joining = {
        let late = late.clone();
        std::thread::spawn(move || late.next())
    };
    for member in [&a, &b] {
        becomes(30, 1, || member.num_waiting().unwrap_or(0));
        assert_eq!(member.num_lost().unwrap(), 0);
    }
    late.shutdown().unwrap();
    let _ = joining.join().unwrap();
    for member in [&a, &b] {
        becomes(30, 0, || member.num_waiting().unwrap_or(1));
    }
}

/// The watches of a process share a few gRPC streams on its connection, as etcd's own clients
/// share one: a scheduler watching many runs, or many nodes in one process, is not capped by the
/// streams etcd allows a connection (a stream per watch hung the watches past the limit).
#[test]
fn a_process_watches_more_runs_than_etcd_allows_streams() {
    let etcd = Etcd::start_with(&["--max-concurrent-streams=8"]);
    let runs = 24;
    let urls: Vec<String> = (0..runs)
        .map(|i| etcd.url(&format!("streams-{i}"), "min_nodes=1&max_nodes=1"))
        .collect();
    let nodes: Vec<_> = urls
        .iter()
        .map(|url| {
            let n = node(url);
            n.next().unwrap();
            // The node's own watch of its round (num_waiting, num_lost, is_closed).
            assert_eq!(n.num_waiting().unwrap(), 0);
            n
        })
        .collect();
    let streams = || etcd.metric_sum("grpc_server_started_total", &["grpc_method=\"Watch\""]);
    let before = streams();
    let admins: Vec<_> = urls
        .iter()
        .map(|url| rdzv::BlockingAdmin::new(Params::from_url(url).unwrap()).unwrap())
        .collect();
    for admin in &admins {
        let status = admin.watch_next(Duration::from_secs(10)).unwrap();
        assert!(status.exists && !status.closed, "{status:?}");
    }
    // The 24 watches share the streams the nodes' watches already use (a connection's
    // watches are spread over 4).
    assert!(
        streams() - before <= 4.0,
        "{} watch streams opened",
        streams() - before
    );
    for node in &nodes {
        node.set_closed().unwrap();
    }
    for admin in &admins {
        let closed = loop {
            let status = admin.watch_next(Duration::from_secs(10)).unwrap();
            if status.closed {
                break status;
            }
        };
        assert!(closed.closed);
    }
    for node in &nodes {
        assert!(node.is_closed().unwrap());
    }
}
