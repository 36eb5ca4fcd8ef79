//! Rendezvous scenarios with several nodes as threads of one process, against a real etcd.

use crate::common;

use common::{etcd_client, on_threads, Etcd};
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
    // Each member counts it from its own watch: both see it, each within a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    for member in [&a, &b] {
        while member.num_waiting().unwrap() == 0 {
            assert!(
                Instant::now() < deadline,
                "late node never counted as waiting"
            );
            std::thread::yield_now();
        }
        assert_eq!(member.num_waiting().unwrap(), 1);
    }

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
    // The waiter is blocked in next once it leads round 0 (it is the only joiner).
    common::wait_for_leader(&etcd.endpoint(), &run_prefix(&url));
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
    // The join's deadline also bounds etcd's answer to the watches the join opens (a late
    // answer is a connection error): 1 s was once too short for it on a loaded machine.
    let url = etcd.url("timeout", "min_nodes=2&max_nodes=2&join_timeout=3");
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
        // The call is blocked once this node (the only joiner) leads round 0.
        common::wait_for_leader(&etcd.endpoint(), &run_prefix(&url));
        match action {
            "cancel" => n.cancel(),
            _ => n.shutdown().unwrap(),
        }
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the blocked next did not wake");
        assert_eq!(got, expected);
    }
    assert_eq!(
        n.next().map(|_| ()).unwrap_err().kind(),
        ErrorKind::Shutdown
    );
    n.shutdown().unwrap(); // idempotent
}

/// The launcher races `next` against its signals and cancels on a signal, which may be
/// pending when the race starts: `cancel` then runs before the `next` future is first polled.
/// A cancel lost there hung a SIGTERMed launcher until `join_timeout`; the cancel must end
/// `next`, and the handle must still join a round afterwards.
#[test]
fn a_cancel_made_before_next_is_first_polled_is_not_lost() {
    let etcd = Etcd::start();
    let url = etcd.url("cancel-early", "min_nodes=2&max_nodes=2&join_timeout=120");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let params = || Params::from_url(&url).unwrap();
    let n = rt.block_on(rdzv::Rendezvous::new(params())).unwrap();
    let next = n.next();
    n.cancel();
    let got = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), next).await })
        .expect("a next cancelled before its first poll kept waiting");
    assert_eq!(got.map(|_| ()).unwrap_err().kind(), ErrorKind::Cancelled);
    // A cancel before `next` is called is kept for the next call, which ends at once, joining
    // nothing; the cancel is then used up and the call after waits for its partner.
    n.cancel();
    let got = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), n.next()).await })
        .expect("a next called after a cancel kept waiting");
    assert_eq!(got.map(|_| ()).unwrap_err().kind(), ErrorKind::Cancelled);
    let other = rt.block_on(rdzv::Rendezvous::new(params())).unwrap();
    let (a, b) = rt.block_on(async { tokio::join!(n.next(), other.next()) });
    assert_one_world(&[a.unwrap().0, b.unwrap().0]);
}

/// The race C callers lost: a cancel made just before another thread enters `next` ends that
/// `next` (at once, joining nothing), and the handle joins normally afterwards.
#[test]
fn a_cancel_made_before_another_thread_enters_next_ends_that_next() {
    let etcd = Etcd::start();
    let url = etcd.url("cancel-before", "min_nodes=2&max_nodes=2&join_timeout=60");
    let n = Arc::new(node(&url));
    n.cancel();
    let started = Instant::now();
    let blocked = {
        let n = n.clone();
        std::thread::spawn(move || n.next().map(|_| ()))
    };
    let err = blocked.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let (rt, mut client) = etcd_client(&etcd);
    let rounds = format!("/rdzv/{}/r/", common::node::run_of(&url));
    let all = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    let joined = rt.block_on(client.get(rounds.as_str(), Some(all))).unwrap();
    assert!(
        !joined
            .kvs()
            .iter()
            .any(|kv| kv.key_str().unwrap().contains("/join/")),
        "a cancelled next joined: {:?}",
        joined.kvs()
    );
    // Used up: the handle's next call forms a round with a partner.
    let other = node(&url);
    let peer = std::thread::spawn(move || other.next().map(|(info, _)| info));
    let (info, _) = n.next().unwrap();
    assert_one_world(&[info, peer.join().unwrap().unwrap()]);
}

#[test]
fn etcd_restart_during_join_still_forms_the_round() {
    let mut etcd = Etcd::start();
    let url = etcd.url("restart", "min_nodes=3&max_nodes=3&join_timeout=60");
    let run = common::node::run_of(&url);
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
    // Within connect_timeout (1 s; a refusal comes at once), and 1 s for a loaded machine.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
}

fn run_prefix(url: &str) -> String {
    format!("/rdzv/{}/", common::node::run_of(url))
}

#[test]
fn a_node_left_out_of_a_full_round_exits_gracefully_when_the_run_closes() {
    let etcd = Etcd::start();
    let url = etcd.url("surplus", "min_nodes=2&max_nodes=2");
    let members = on_threads(2, {
        let url = url.clone();
        move |_| {
            let n = node(&url);
            let info = n.next().unwrap().0;
            std::mem::forget(n); // stay alive as members of the full round
            info
        }
    });
    assert_one_world(&members);
    let surplus = Arc::new(node(&url));
    let (tx, rx) = mpsc::channel();
    {
        let surplus = surplus.clone();
        std::thread::spawn(move || tx.send(surplus.next().map(|_| ()).unwrap_err().kind()));
    }
    let closer = node(&url);
    // Wait (by watch) until the surplus node holds a join key in round 1: it is waiting.
    common::wait_for_leader(
        &etcd.endpoint(),
        &format!("{}r/00000000000000000001/", run_prefix(&url)),
    );
    closer.set_closed().unwrap();
    let kind = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("surplus next did not return");
    assert_eq!(kind, ErrorKind::GracefulExit);
}

#[test]
fn foreign_data_under_the_prefix_is_a_state_error() {
    let etcd = Etcd::start();
    let url = etcd.url("foreign", "min_nodes=1&max_nodes=1");
    let (rt, mut client) = etcd_client(&etcd);
    rt.block_on(client.put(format!("{}current", run_prefix(&url)), "not a number", None))
        .unwrap();
    let err = node(&url).next().map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::State, "{err}");
    assert!(err.message().contains("current"), "{err}");
}

#[test]
fn a_foreign_value_too_large_to_read_is_a_state_error() {
    // Larger than the client decodes (4 MiB): something else wrote it, and no retry mends it.
    let etcd = Etcd::start_with(&["--max-request-bytes", "8388608"]);
    let url = etcd.url("foreign-large", "min_nodes=1&max_nodes=1");
    let n = node(&url);
    let (info, store) = n.next().unwrap();
    let (rt, mut client) = etcd_client(&etcd);
    let key = format!("{}r/{:020}/store/big", run_prefix(&url), info.round);
    rt.block_on(client.put(key, vec![b'x'; 5 << 20], None))
        .unwrap();
    let err = store.add("big", 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::State, "{err}");
    assert!(err.message().contains("did not write"), "{err}");
}

#[test]
fn the_last_node_out_of_a_closed_run_deletes_its_rounds() {
    let etcd = Etcd::start();
    let url = etcd.url("cleanup", "min_nodes=2&max_nodes=2");
    let nodes: Vec<Arc<BlockingRendezvous>> = (0..2).map(|_| Arc::new(node(&url))).collect();
    let infos = on_threads(2, {
        let nodes = nodes.clone();
        move |i| nodes[i].next().unwrap().0
    });
    assert_one_world(&infos);
    let (rt, mut client) = etcd_client(&etcd);
    let count = |client: &mut etcd_client::Client, suffix: &str| {
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        rt.block_on(client.get(format!("{}{suffix}", run_prefix(&url)), Some(opts)))
            .unwrap()
            .count()
    };
    assert!(count(&mut client, "r/") > 0);
    nodes[0].set_closed().unwrap();
    nodes[0].shutdown().unwrap();
    assert!(
        count(&mut client, "r/") > 0,
        "a node is still in the run: keep its data"
    );
    nodes[1].shutdown().unwrap();
    assert_eq!(
        count(&mut client, "r/"),
        0,
        "the last node out removes the rounds"
    );
    assert_eq!(
        count(&mut client, "closed"),
        1,
        "the closed marker stays until it expires"
    );
    assert_eq!(count(&mut client, "alive/"), 0);
}

#[test]
fn a_node_whose_lease_expired_reports_itself_lost_and_rejoins() {
    let etcd = Etcd::start();
    let url = etcd.url("lease-lost", "min_nodes=1&max_nodes=1");
    let me = node(&url);
    let first = me.next().unwrap().0;
    assert_eq!(me.num_lost().unwrap(), 0);
    // What etcd does to a node cut off for longer than lease_ttl: its lease and keys vanish.
    // (Not the run's lease: other nodes would keep that one alive.)
    let (rt, mut client) = etcd_client(&etcd);
    rt.block_on(async {
        let alive = etcd_client::GetOptions::new().with_prefix();
        let prefix = format!("/rdzv/{}/alive/", common::node::run_of(&url));
        let resp = client.get(prefix, Some(alive)).await.unwrap();
        let own = resp.kvs()[0].lease();
        client.lease_revoke(own).await.unwrap();
    });
    // num_lost is answered from a watch: wait for the deletion to arrive, as a supervisor would.
    let deadline = Instant::now() + Duration::from_secs(10);
    while me.num_lost().unwrap() != 1 {
        assert!(
            Instant::now() < deadline,
            "the node never saw that it was dropped"
        );
        std::thread::yield_now();
    }
    let second = me.next().unwrap().0;
    assert_eq!(second.round, first.round + 1);
    assert_eq!(me.num_lost().unwrap(), 0, "rejoined under a new lease");
}

/// When every node of a run is cut off for longer than lease_ttl, the run's lease expires
/// too, and with it the run's rounds: the nodes' memberships lapsed anyway, so they join again
/// as new arrivals, in a run that starts over at round 0, as one whose nodes all restarted.
#[test]
fn a_run_whose_every_lease_expired_starts_over() {
    let etcd = Etcd::start();
    let url = etcd.url("all-expired", "min_nodes=1&max_nodes=1");
    let me = node(&url);
    let (first, store) = me.next().unwrap();
    store.set("x", b"1").unwrap();
    let (rt, mut client) = etcd_client(&etcd);
    let run = format!("/rdzv/{}/", common::node::run_of(&url));
    let all = etcd_client::GetOptions::new().with_prefix();
    let before = rt.block_on(client.get(run.as_str(), Some(all))).unwrap();
    assert!(
        before.count() >= 4,
        "current, final, sealed, store x: {before:?}"
    );
    rt.block_on(async {
        for lease in client.leases().await.unwrap().leases().to_vec() {
            client.lease_revoke(lease.id()).await.unwrap();
        }
    });
    let left = rt
        .block_on(client.get(
            run.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ))
        .unwrap();
    assert_eq!(left.count(), 0, "every key of the run went with the leases");
    let err = store.set("y", b"1").unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::State,
        "the old round's store is gone: {err}"
    );
    let (again, store) = me.next().unwrap();
    assert_eq!((first.round, again.round), (0, 0));
    store.set("x", b"2").unwrap();
    assert_eq!(me.num_lost().unwrap(), 0, "rejoined under new leases");
}

/// num_lost stops watching at the first loss but keeps counting later ones (from reads).
#[test]
fn num_lost_counts_every_member_that_leaves() {
    let etcd = Etcd::start();
    let url = etcd.url("lost-count", "min_nodes=3&max_nodes=3");
    let nodes = on_threads(3, move |_| {
        let n = node(&url);
        n.next().unwrap();
        n
    });
    let stays = &nodes[0];
    assert_eq!(stays.num_lost().unwrap(), 0);
    for (gone, leaving) in nodes[1..].iter().enumerate() {
        leaving.shutdown().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while stays.num_lost().unwrap() != gone as u32 + 1 {
            assert!(
                Instant::now() < deadline,
                "num_lost never reached {}",
                gone + 1
            );
            std::thread::yield_now();
        }
    }
}

/// Each of `nodes` calls next at once; returns their rounds.
fn next_on_all(nodes: &[Arc<BlockingRendezvous>]) -> Vec<rdzv::RoundInfo> {
    let nodes = nodes.to_vec();
    on_threads(nodes.len(), move |i| nodes[i].next().unwrap().0)
}

/// A re-rendezvous waits for nobody once every live node of the run has joined: the survivors
/// of a departure seal at once. Here the last call (60 s) is longer than their join_timeout
/// (20 s), so waiting it out, as before, fails the call.
#[test]
fn survivors_seal_without_a_last_call_once_every_live_node_joined() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "everyone",
        "min_nodes=2&max_nodes=3&last_call_timeout=60&join_timeout=20",
    );
    let nodes: Vec<Arc<BlockingRendezvous>> = (0..3).map(|_| Arc::new(node(&url))).collect();
    let first = next_on_all(&nodes);
    assert_one_world(&first);
    nodes[2].shutdown().unwrap(); // leaves: its alive key goes at once
    let again = next_on_all(&nodes[..2]);
    assert_one_world(&again);
    assert_eq!(again[0].round, 1);
    // Survivors keep their order.
    assert_eq!(again[0].rank < again[1].rank, first[0].rank < first[1].rank);
}

/// A live node that has not joined (it may be about to) keeps the last call.
#[test]
fn a_live_node_that_has_not_joined_keeps_the_last_call() {
    let etcd = Etcd::start();
    let url = etcd.url("bystander", "min_nodes=2&max_nodes=3&last_call_timeout=1.5");
    let nodes: Vec<Arc<BlockingRendezvous>> = (0..3).map(|_| Arc::new(node(&url))).collect();
    assert_one_world(&next_on_all(&nodes));
    nodes[2].shutdown().unwrap();
    let _bystander = node(&url); // alive, never joins
    let started = Instant::now();
    let again = next_on_all(&nodes[..2]);
    assert_one_world(&again);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "sealed before the last call with a live node yet to join"
    );
}

/// A round of one lane (`max_nodes` at most 64) carries its member list in `final`; a larger
/// one carries none, and each member receives its rank with its lane's seal, even in a round
/// far smaller than `max_nodes`. Either way every member's rank is its place in the list etcd
/// holds, and `members()` returns that list.
#[test]
fn final_carries_the_member_list_only_in_a_round_of_one_lane() {
    let etcd = Etcd::start();
    for (n, max) in [(64usize, 64usize), (65, 65), (5, 1000)] {
        // A first round below max_nodes seals at the end of its last call.
        let last_call = if n == max { 60 } else { 1 };
        let url = etcd.url(
            &format!("inline{n}"),
            &format!("min_nodes={n}&max_nodes={max}&last_call_timeout={last_call}"),
        );
        let run = common::node::run_of(&url);
        let formed = on_threads(n, {
            let url = url.clone();
            move |_| {
                let node = node(&url);
                let info = node.next().unwrap().0;
                let id = node.node_id().to_string();
                // The node stays: the last one out deletes the run's keys.
                (id, info, node.members().unwrap(), node)
            }
        });
        assert_one_world(&formed.iter().map(|f| f.1.clone()).collect::<Vec<_>>());

        let (rt, mut client) = etcd_client(&etcd);
        let round = format!("/rdzv/{run}/r/{:020}/", formed[0].1.round);
        let mut get = |key: String, options| rt.block_on(client.get(key, options)).unwrap();
        let final_ = get(format!("{round}seal/final"), None);
        let kv = final_.kvs().first().expect("final is written");
        let sealed = rdzv::test_support::FinalRecord::parse(kv.key(), kv.value()).unwrap();
        let chunks = get(
            format!("{round}lane/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        );
        let chunks = chunks.kvs().iter().map(|kv| (kv.key(), kv.value()));
        let list = rdzv::test_support::members_from_chunks(&sealed, chunks).unwrap();
        assert_eq!(list.len(), n);
        match max {
            64 => assert!(sealed.members.is_some() && sealed.chunks == 1),
            _ => assert!(
                sealed.members.is_none() && sealed.chunks > 1,
                "a round of max_nodes={max} has more than one lane"
            ),
        }
        for (id, info, members, _) in &formed {
            assert_eq!(&list[info.rank as usize], id);
            assert_eq!(&members[..], &list[..]);
        }
    }
}
