//! Planned departures against a real etcd: a drained member is counted lost by the others at
//! once, the survivors re-form without it (without waiting for its lease or a last call), and
//! its own `next` ends with a graceful exit; a drained joiner is never sealed in; bad drains
//! fail clearly; an operator needs write access to drain.

use crate::common;

use common::Etcd;
use rdzv::{BlockingAdmin, BlockingRendezvous, ErrorKind, Params};
use std::time::{Duration, Instant};

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

fn operator(url: &str) -> BlockingAdmin {
    BlockingAdmin::new(Params::from_url(url).unwrap()).unwrap()
}

/// `n` nodes that complete round 0 together; returned in rank order.
fn formed(url: &str, n: usize) -> Vec<BlockingRendezvous> {
    let url = url.to_string();
    let mut nodes = common::on_threads(n, move |_| {
        let node = node(&url);
        let (info, _store) = node.next().unwrap();
        (info.rank, node)
    });
    nodes.sort_by_key(|(rank, _)| *rank);
    nodes.into_iter().map(|(_, node)| node).collect()
}

/// Polls `num_lost` as an agent does (answered from memory once its watch is in sync) until it
/// is non-zero; at most 10 s.
fn wait_for_loss(node: &BlockingRendezvous) -> u32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let n = node.num_lost().unwrap();
        if n > 0 {
            return n;
        }
        assert!(Instant::now() < until, "no member counted lost within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_drained_member_is_lost_at_once_and_the_survivors_reform_without_it() {
    let etcd = Etcd::start();
    // A lease far longer than the test's patience and a last call longer than the join
    // timeout: the new round can form in time only because the drain is seen at once and
    // nobody waits for the drained node.
    let url = etcd.url(
        "drain",
        "min_nodes=2&max_nodes=3&last_call_timeout=60&join_timeout=20&lease_ttl=60",
    );
    let nodes = formed(&url, 3);
    let ids: Vec<String> = nodes.iter().map(|n| n.node_id().to_string()).collect();
    // Survivors start tracking before the drain, as an agent polling num_lost would.
    assert_eq!(nodes[0].num_lost().unwrap(), 0);
    assert_eq!(nodes[2].num_lost().unwrap(), 0);

    let op = operator(&url);
    op.drain(&ids[1], "maintenance").unwrap();
    let s = op.status().unwrap();
    let draining: Vec<&str> = s.draining().iter().map(|m| m.node.as_str()).collect();
    assert_eq!(draining, [ids[1].as_str()]);
    assert!(s.lost().is_empty(), "a drained member is alive, not lost");
    assert_eq!(s.to_json()["draining"][0]["rank"], 1);

    assert_eq!(wait_for_loss(&nodes[0]), 1);
    assert_eq!(wait_for_loss(&nodes[2]), 1);
    assert!(nodes[1].is_draining().unwrap());
    assert!(!nodes[0].is_draining().unwrap());
    assert_eq!(
        nodes[1].num_lost().unwrap(),
        1,
        "the drained node counts itself"
    );

    let drained = nodes[1].next().map(|(info, _)| info).unwrap_err();
    assert_eq!(drained.kind(), ErrorKind::GracefulExit);
    assert!(
        drained.message().contains("maintenance"),
        "{}",
        drained.message()
    );

    let survivors = [&nodes[0], &nodes[2]];
    let rounds: Vec<_> = std::thread::scope(|scope| {
        let joins: Vec<_> = survivors
            .iter()
            .map(|n| scope.spawn(move || n.next().map(|(info, _)| info)))
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for info in &rounds {
        let info = info
            .as_ref()
            .expect("the survivors form round 1 before join_timeout");
        assert_eq!((info.round, info.world_size), (1, 2));
    }
    let members = nodes[0].members().unwrap();
    assert_eq!(&members[..], [ids[0].clone(), ids[2].clone()]);
    assert_eq!(nodes[2].members().unwrap(), members);
    assert_eq!(rounds[0].as_ref().unwrap().rank, 0, "rank 0 stays rank 0");

    // The drained node leaves: its mark goes with its lease.
    nodes[1].shutdown().unwrap();
    assert!(op.status().unwrap().waiting.iter().all(|j| !j.draining));
}

#[test]
fn a_drained_joiner_is_never_sealed_in_and_its_next_exits_gracefully() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "drain-joiner",
        "min_nodes=2&max_nodes=4&last_call_timeout=5&join_timeout=30",
    );
    // Three nodes join round 0, which waits out its 5 s last call (max_nodes is 4, and a
    // first round keeps its last call). Drain one meanwhile: whether the drain lands before or
    // after its join, its next ends gracefully and the round seals without it.
    let (tx, rx) = std::sync::mpsc::channel();
    let joiners: Vec<_> = (0..3)
        .map(|_| {
            let (url, tx) = (url.clone(), tx.clone());
            std::thread::spawn(move || {
                let n = node(&url);
                tx.send(n.node_id().to_string()).unwrap();
                n.next().map(|(info, _)| (info, n.members().unwrap()))
            })
        })
        .collect();
    let ids: Vec<String> = (0..3).map(|_| rx.recv().unwrap()).collect();
    let victim = ids[2].clone();
    // Drain it while it is blocked in next, before anything is sealed.
    let op = operator(&url);
    op.drain(&victim, "").unwrap();
    let results: Vec<_> = joiners.into_iter().map(|j| j.join().unwrap()).collect();
    let mut sealed = None;
    let mut exits = 0;
    for r in results {
        match r {
            Ok(info) => sealed = Some(info),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::GracefulExit, "{}", e.message());
                exits += 1;
            }
        }
    }
    let (info, members) = sealed.expect("the other two form a round");
    assert_eq!(exits, 1, "only the drained node leaves");
    assert!(
        !members.contains(&victim),
        "a drained node is never sealed in"
    );
    assert_eq!(info.world_size, 2);
}

#[test]
fn a_node_may_drain_itself() {
    let etcd = Etcd::start();
    let url = etcd.url("drain-self", "min_nodes=2&max_nodes=2&lease_ttl=60");
    let nodes = formed(&url, 2);
    assert_eq!(nodes[0].num_lost().unwrap(), 0);
    nodes[1].drain("preemption notice").unwrap();
    assert!(nodes[1].is_draining().unwrap());
    assert_eq!(wait_for_loss(&nodes[0]), 1);
    let exit = nodes[1].next().map(|(info, _)| info).unwrap_err();
    assert_eq!(exit.kind(), ErrorKind::GracefulExit);
}

#[test]
fn draining_what_is_not_a_live_node_fails_clearly() {
    let etcd = Etcd::start();
    let url = etcd.url("drain-bad", "min_nodes=1");
    let op = operator(&url);
    let err = op.drain("0123456789abcdef", "").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message().contains("0123456789abcdef") && err.message().contains("not a live node"),
        "{}",
        err.message()
    );
    for bad in ["", "a/b"] {
        let err = op.drain(bad, "").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
    // A node that left is no longer drainable either, and nothing was written for it.
    let gone = node(&url);
    let id = gone.node_id().to_string();
    gone.shutdown().unwrap();
    assert_eq!(
        op.drain(&id, "").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let status = op.status().unwrap();
    assert!(!status.exists, "a failed drain leaves no key behind");
}

#[test]
fn the_watch_reports_a_drain_and_a_timeout_loses_no_change() {
    let etcd = Etcd::start();
    let url = etcd.url("drain-watch", "min_nodes=2&max_nodes=2&lease_ttl=60");
    let nodes = formed(&url, 2);
    let op = operator(&url);
    let first = op.watch_next(Duration::from_secs(10)).unwrap();
    assert!(first.sealed.is_some());
    // Nothing changes: the call times out and the watch stays open.
    let quiet = op.watch_next(Duration::from_millis(200)).unwrap_err();
    assert_eq!(quiet.kind(), ErrorKind::Timeout);
    op.drain(nodes[1].node_id(), "scale down").unwrap();
    let changed = op.watch_next(Duration::from_secs(10)).unwrap();
    assert!(changed.revision > first.revision);
    assert_eq!(changed.draining().len(), 1);
}

#[test]
fn a_watch_blocked_in_another_thread_is_cancelled() {
    let etcd = Etcd::start();
    let url = etcd.url("drain-cancel", "min_nodes=1");
    let op = std::sync::Arc::new(operator(&url));
    op.watch_next(Duration::from_secs(10)).unwrap();
    let blocked = {
        let op = op.clone();
        std::thread::spawn(move || op.watch_next(Duration::from_secs(60)))
    };
    // Once: a cancel made before the call is entered is kept for it.
    op.cancel();
    assert_eq!(
        blocked.join().unwrap().unwrap_err().kind(),
        ErrorKind::Cancelled
    );
    // Used up: the next watch runs (and times out, nothing having changed).
    let err = op.watch_next(Duration::from_millis(300)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}

#[test]
fn a_watch_whose_etcd_dies_ends_with_an_error_and_resumes_after_the_restart() {
    let mut etcd = Etcd::start();
    let url = etcd.url("drain-watch-restart", "min_nodes=1&connect_timeout=2");
    let op = operator(&url);
    assert!(!op.watch_next(Duration::from_secs(10)).unwrap().exists);
    etcd.kill();
    // The broken watch is reopened, which fails after connect_timeout (2 s) counted from when
    // it broke, even for a caller that waits in slices shorter than that: an error, not
    // timeouts forever.
    let until = Instant::now() + Duration::from_secs(30);
    let err = loop {
        let err = op.watch_next(Duration::from_millis(500)).unwrap_err();
        if err.kind() != ErrorKind::Timeout {
            break err;
        }
        assert!(
            Instant::now() < until,
            "only timeouts for 30 s with etcd down"
        );
    };
    assert_eq!(err.kind(), ErrorKind::Connection, "{}", err.message());
    etcd.restart();
    let n = node(&url);
    let (info, _store) = n.next().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = op.watch_next(Duration::from_secs(30)).unwrap();
        if s.sealed.as_ref().is_some_and(|r| r.round == info.round) {
            break;
        }
        assert!(Instant::now() < until, "the watch never showed the round");
    }
}

#[test]
fn an_operator_on_an_unreachable_etcd_gets_the_connection_error_at_once() {
    // A port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("etcd://127.0.0.1:{port}/nobody?connect_timeout=30");
    let started = Instant::now();
    let err = BlockingAdmin::new(Params::from_url(&url).unwrap())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{}", err.message());
    assert!(
        err.message().contains(&port.to_string()),
        "{}",
        err.message()
    );
    // Refused is known at once: no waiting out the 30 s connect_timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
