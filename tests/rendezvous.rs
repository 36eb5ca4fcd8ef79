//! Rendezvous scenarios with several nodes as threads of one process, against a real etcd.

mod common;

use common::{on_threads, Etcd};
use rdzv::{BlockingRendezvous, ErrorKind, Params};
use std::collections::BTreeSet;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

/// Asserts ranks are exactly 0..n and everyone agrees on world size, round and master.
fn assert_one_world(infos: &[rdzv::RoundInfo]) {
    let ranks: BTreeSet<u32> = infos.iter().map(|i| i.rank).collect();
    assert_eq!(
        ranks,
        (0..infos.len() as u32).collect(),
        "ranks must be 0..n, unique: {infos:?}"
    );
    for i in infos {
        assert_eq!(i.world_size as usize, infos.len());
        assert_eq!(
            (i.round, &i.master_addr, i.master_port),
            (infos[0].round, &infos[0].master_addr, infos[0].master_port)
        );
    }
}

#[test]
fn min_equals_max_forms_at_once() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "fixed",
        "min_nodes=4&max_nodes=4&last_call_timeout=60&local_addr=10.1.2.3",
    );
    let started = Instant::now();
    let infos = on_threads(4, move |_| node(&url).next().unwrap().0);
    assert_one_world(&infos);
    assert_eq!(infos[0].round, 0);
    assert_eq!(infos[0].master_addr, "10.1.2.3");
    // max reached: the 60 s last call must not have been waited out.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn last_call_admits_nodes_until_it_expires() {
    let etcd = Etcd::start();
    let url = etcd.url("lastcall", "min_nodes=2&max_nodes=8&last_call_timeout=1.5");
    let started = Instant::now();
    let infos = on_threads(3, move |_| node(&url).next().unwrap().0);
    assert_one_world(&infos);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "must wait the last call"
    );
}

#[test]
fn late_node_waits_then_joins_next_round_with_stable_ranks() {
    let etcd = Etcd::start();
    let url = etcd.url("late", "min_nodes=2&max_nodes=3&last_call_timeout=0.5");
    let a = Arc::new(node(&url));
    let b = Arc::new(node(&url));
    let first = {
        let (a, b) = (a.clone(), b.clone());
        let ta = std::thread::spawn(move || a.next().unwrap().0);
        let tb = std::thread::spawn(move || b.next().unwrap().0);
        [ta.join().unwrap(), tb.join().unwrap()]
    };
    assert_one_world(&first);
    assert_eq!(a.num_waiting().unwrap(), 0);

    let late = Arc::new(node(&url));
    let late_thread = {
        let late = late.clone();
        std::thread::spawn(move || late.next())
    };
    // The late node is counted by the members while the round runs; wait for it by watching
    // the count the way an agent would.
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.num_waiting().unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "late node never counted as waiting"
        );
        std::thread::yield_now();
    }
    assert_eq!(b.num_waiting().unwrap(), 1);

    let (ta, tb) = {
        let (a, b) = (a.clone(), b.clone());
        (
            std::thread::spawn(move || a.next().unwrap().0),
            std::thread::spawn(move || b.next().unwrap().0),
        )
    };
    let second = [
        ta.join().unwrap(),
        tb.join().unwrap(),
        late_thread.join().unwrap().unwrap().0,
    ];
    assert_one_world(&second);
    assert_eq!(second[0].round, first[0].round + 1);
    // Survivors keep their order; the newcomer comes last.
    assert_eq!(second[0].rank, first[0].rank);
    assert_eq!(second[1].rank, first[1].rank);
    assert_eq!(second[2].rank, 2);
}

#[test]
fn set_closed_wakes_a_blocked_next() {
    let etcd = Etcd::start();
    let url = etcd.url("close", "min_nodes=2&max_nodes=2");
    let waiter = Arc::new(node(&url));
    let (tx, rx) = mpsc::channel();
    {
        let waiter = waiter.clone();
        std::thread::spawn(move || tx.send(waiter.next().map(|_| ()).unwrap_err().kind()));
    }
    let closer = node(&url);
    assert!(!closer.is_closed().unwrap());
    // Make sure the waiter is blocked: its join key is visible as a joiner of round 0 only
    // once it is in next; closing before that is also fine (next then fails fast).
    closer.set_closed().unwrap();
    assert!(closer.is_closed().unwrap());
    let kind = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("blocked next did not wake");
    assert_eq!(kind, ErrorKind::Closed);
    let err = node(&url).next().map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
}

#[test]
fn join_timeout_is_reported() {
    let etcd = Etcd::start();
    let url = etcd.url("timeout", "min_nodes=2&max_nodes=2&join_timeout=1");
    let started = Instant::now();
    let err = node(&url).next().map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.message().contains("min_nodes=2"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn shutdown_and_cancel_wake_a_blocked_next() {
    let etcd = Etcd::start();
    let url = etcd.url("wake", "min_nodes=2&max_nodes=2");
    let n = Arc::new(node(&url));
    for (action, expected) in [
        ("cancel", ErrorKind::Cancelled),
        ("shutdown", ErrorKind::Shutdown),
    ] {
        let (tx, rx) = mpsc::channel();
        let blocked = n.clone();
        std::thread::spawn(move || tx.send(blocked.next().map(|_| ()).unwrap_err().kind()));
        // Retry the wake-up until the blocked call has started and reacts.
        let got = loop {
            match action {
                "cancel" => n.cancel(),
                _ => n.shutdown().unwrap(),
            }
            if let Ok(kind) = rx.recv_timeout(Duration::from_millis(200)) {
                break kind;
            }
        };
        assert_eq!(got, expected);
    }
    assert_eq!(
        n.next().map(|_| ()).unwrap_err().kind(),
        ErrorKind::Shutdown
    );
    n.shutdown().unwrap(); // idempotent
}

#[test]
fn etcd_restart_during_join_still_forms_the_round() {
    let mut etcd = Etcd::start();
    let url = etcd.url("restart", "min_nodes=3&max_nodes=3&join_timeout=60");
    let run = url
        .split('/')
        .nth(3)
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_string();
    let first = node(&url);
    let t = std::thread::spawn(move || first.next().unwrap().0);
    // The first node has joined (and leads) once the round's leader key exists.
    common::wait_for_leader(&etcd.endpoint(), &format!("/rdzv/{run}/"));
    etcd.restart();
    let others = on_threads(2, move |_| node(&url).next().unwrap().0);
    let mut infos = others;
    infos.push(t.join().unwrap());
    assert_one_world(&infos);
}

#[test]
fn runs_are_isolated_even_with_hostile_run_ids() {
    let etcd = Etcd::start();
    let base = format!("etcd://{}/", etcd.endpoint());
    let ids = ["job/../x", "job%2F..%2Fx", "job"];
    let infos = on_threads(3, move |i| {
        let url = format!(
            "{base}{}?min_nodes=1&max_nodes=1",
            ids[i].replace('%', "%25")
        );
        node(&url).next().unwrap().0
    });
    for i in infos {
        assert_eq!(
            (i.rank, i.world_size),
            (0, 1),
            "each run is a world of its own"
        );
    }
}

#[test]
fn connection_error_names_the_endpoint_and_does_not_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("etcd://127.0.0.1:{port}/x?connect_timeout=1");
    let started = Instant::now();
    let err = BlockingRendezvous::new(Params::from_url(&url).unwrap())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(
        err.message().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}
