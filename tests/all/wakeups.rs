//! A follower (a joiner that does not lead) waits on its round's leader key and its lane of the
//! round (`docs/DESIGN.md`, "Waking a follower"). What else must end its wait reaches it there
//! or through its lease: a close and a drain write a wake-up into the lanes of the round open
//! at that moment, and a lease that etcd expired while the node was frozen wakes it from its
//! lease keeper. Each test uses a round after the first (a wake-up written into the wrong round
//! wakes nobody) and a `join_timeout` far longer than the test waits, so only the wake-up can
//! end the wait in time. The close and drain tests run with one lane (`max_nodes=3`) and with
//! 16 (`max_nodes=1000`), where a wake-up in the wrong lane wakes nobody either.

use crate::common;

use common::node::{joiners_of_round, run_of, Node};
use common::{wait_for_leader, watch_until, Etcd};
use rdzv::{BlockingAdmin, BlockingRendezvous, ErrorKind, Params, RoundInfo};
use std::sync::{mpsc, Arc};
use std::time::Duration;

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

fn round_prefix(url: &str, round: u64) -> String {
    format!("/rdzv/{}/r/{round:020}/", run_of(url))
}

fn wait_for_joiners(etcd: &Etcd, url: &str, round: u64, n: usize) {
    watch_until(&etcd.endpoint(), &joiners_of_round(url, round), |kvs| {
        (kvs.len() == n).then_some(())
    });
}

type Outcome = rdzv::Result<RoundInfo>;

/// The handles, the id of round 1's leader, and each waiter's id and outcome channel.
type WaitingInRoundOne = (
    Vec<Arc<BlockingRendezvous>>,
    String,
    Vec<(String, mpsc::Receiver<Outcome>)>,
);

/// `n` handles that complete round 0 together.
fn formed(url: &str, n: usize) -> Vec<Arc<BlockingRendezvous>> {
    let url = url.to_string();
    common::on_threads(n, move |_| {
        let node = node(&url);
        node.next().unwrap();
        Arc::new(node)
    })
}

/// Calls `next` on a thread of its own; its outcome arrives on the returned channel.
fn next_on_thread(node: &Arc<BlockingRendezvous>) -> mpsc::Receiver<Outcome> {
    let (tx, rx) = mpsc::channel();
    let node = node.clone();
    std::thread::spawn(move || tx.send(node.next().map(|(info, _)| info)));
    rx
}

fn signal(node: &Node, signal: i32) {
    // SAFETY: kill only sends a signal to the child we spawned.
    assert_eq!(unsafe { libc::kill(node.child.id() as i32, signal) }, 0);
}

/// Three nodes form round 0; two of them then call `next` again and wait in round 1 for the
/// third.
fn two_waiting_in_round_one(etcd: &Etcd, url: &str) -> WaitingInRoundOne {
    let formed = formed(url, 3);
    let waiting: Vec<_> = formed[..2]
        .iter()
        .map(|n| (n.node_id().to_string(), next_on_thread(n)))
        .collect();
    wait_for_joiners(etcd, url, 1, 2);
    let leader = wait_for_leader(&etcd.endpoint(), &round_prefix(url, 1));
    (formed, leader, waiting)
}

/// Run options with one lane, and with 16 (round 0 then seals after a 1 s last call).
const LANES: [&str; 2] = [
    "min_nodes=3&max_nodes=3",
    "min_nodes=3&max_nodes=1000&last_call_timeout=1",
];

fn outcome(rx: &mpsc::Receiver<Outcome>, who: &str) -> Outcome {
    rx.recv_timeout(Duration::from_secs(15))
        .unwrap_or_else(|_| panic!("the {who} was not woken within 15 s"))
}

/// Runs `check` once for each entry of `LANES`, each time on a run of its own with `options`.
fn with_each_lane_count(run: &str, options: &str, check: fn(&Etcd, &str)) {
    let etcd = Etcd::start();
    for (i, lanes) in LANES.iter().enumerate() {
        let url = etcd.url(&format!("{run}-{i}"), &format!("{lanes}&{options}"));
        check(&etcd, &url);
    }
}

/// The leader of a round, woken by the close, withdraws and so deletes the `leader` key,
/// which wakes its followers too. Here the leader is frozen, so only the wake-up the close
/// wrote into the open round can end the follower's wait.
#[test]
fn a_close_wakes_a_follower_whose_leader_is_frozen() {
    with_each_lane_count(
        "close-wakes",
        "lease_ttl=60&join_timeout=120",
        close_wakes_a_follower_whose_leader_is_frozen,
    );
}

fn close_wakes_a_follower_whose_leader_is_frozen(etcd: &Etcd, url: &str) {
    // Round 0: a process (which goes straight on to round 1) and two handles.
    let leader = Node::spawn(url, &["--rounds", "2"]);
    let handles = formed(url, 2);
    let leader_id = leader.round(15)["node"].as_str().unwrap().to_string();
    // Round 1: the process is its first joiner, hence its leader; then it is frozen.
    assert_eq!(
        wait_for_leader(&etcd.endpoint(), &round_prefix(url, 1)),
        leader_id
    );
    signal(&leader, libc::SIGSTOP);
    let rx = next_on_thread(&handles[0]);
    wait_for_joiners(etcd, url, 1, 2);
    BlockingAdmin::new(Params::from_url(url).unwrap())
        .unwrap()
        .close()
        .unwrap();
    let err = outcome(&rx, "follower").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "{url}: {err}");
    signal(&leader, libc::SIGCONT);
}

#[test]
fn a_drained_follower_stops_waiting_at_once_and_the_leader_waits_on() {
    with_each_lane_count(
        "drain-wakes",
        "join_timeout=120",
        drained_follower_stops_waiting_and_the_leader_waits_on,
    );
}

fn drained_follower_stops_waiting_and_the_leader_waits_on(etcd: &Etcd, url: &str) {
    let (nodes, leader, waiting) = two_waiting_in_round_one(etcd, url);
    let (follower, rx) = waiting.iter().find(|(id, _)| *id != leader).unwrap();
    BlockingAdmin::new(Params::from_url(url).unwrap())
        .unwrap()
        .drain(follower, "maintenance")
        .unwrap();
    let err = outcome(rx, "drained follower").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::GracefulExit, "{err}");
    assert!(err.message().contains("maintenance"), "{err}");
    // The drain woke only the drained node: the leader still waits, and forms round 1 with
    // the third member of round 0 and a newcomer.
    let (_, leader_rx) = waiting.iter().find(|(id, _)| *id == leader).unwrap();
    assert!(
        leader_rx.try_recv().is_err(),
        "the leader's next ended with the drain of another node"
    );
    let third = next_on_thread(&nodes[2]);
    let newcomer = next_on_thread(&Arc::new(node(url)));
    let round = outcome(leader_rx, "leader").unwrap();
    assert_eq!((round.round, round.world_size), (1, 3), "{round:?}");
    for rx in [third, newcomer] {
        assert_eq!(outcome(&rx, "joiner").unwrap().round, 1);
    }
}

#[test]
fn a_follower_whose_lease_expired_while_frozen_joins_again_when_it_wakes() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "lease-wakes",
        "min_nodes=3&max_nodes=3&lease_ttl=2&join_timeout=120",
    );
    // The leader first, then the follower, a process of its own so it can be frozen.
    let leader_rx = next_on_thread(&Arc::new(node(&url)));
    wait_for_leader(&etcd.endpoint(), &round_prefix(&url, 0));
    let follower = Node::spawn(&url, &[]);
    wait_for_joiners(&etcd, &url, 0, 2);
    // Frozen until etcd has expired its lease and deleted its join key.
    signal(&follower, libc::SIGSTOP);
    wait_for_joiners(&etcd, &url, 0, 1);
    signal(&follower, libc::SIGCONT);
    // Awake, it learns from its lease keeper that the lease is gone, and joins again.
    wait_for_joiners(&etcd, &url, 0, 2);
    let third = node(&url);
    let (info, _) = third.next().unwrap();
    assert_eq!(info.world_size, 3);
    let round = follower.round(15);
    assert_eq!(round["world_size"], 3, "{round}");
    let leader_info = outcome(&leader_rx, "leader").unwrap();
    assert_eq!(leader_info.round, info.round);
}

/// The lanes a node watches before it joins come from its own `max_nodes`; the leader's lane
/// count (`seal/lanes`) rules. A follower configured with another `max_nodes` than its leader
/// must still receive the seal, whichever of the two has more lanes.
#[test]
fn a_follower_with_another_lane_count_than_its_leader_still_receives_the_seal() {
    let etcd = Etcd::start();
    let (one, many) = ("max_nodes=3", "max_nodes=1000");
    for (i, (leader_lanes, follower_lanes)) in [(one, many), (many, one)].into_iter().enumerate() {
        let options = format!("min_nodes=3&{leader_lanes}&last_call_timeout=1&join_timeout=120");
        let leader_url = etcd.url(&format!("lane-counts-{i}"), &options);
        let follower_url = leader_url.replace(leader_lanes, follower_lanes);
        let leader_rx = next_on_thread(&Arc::new(node(&leader_url)));
        wait_for_leader(&etcd.endpoint(), &round_prefix(&leader_url, 0));
        let followers: Vec<_> = (0..2)
            .map(|_| next_on_thread(&Arc::new(node(&follower_url))))
            .collect();
        let leader = outcome(&leader_rx, "leader").unwrap();
        assert_eq!(
            leader.world_size, 3,
            "{leader_lanes} leading {follower_lanes}"
        );
        for rx in &followers {
            let info = outcome(rx, "follower").unwrap();
            assert_eq!((info.round, info.world_size), (leader.round, 3));
        }
    }
}

/// A takeover by a leader with another lane count: the round's first leader (16 lanes) is
/// killed, a follower (one lane) takes over and seals into its one lane, and the other
/// follower, which waited on its lane of the first leader's 16, must move to that one.
#[test]
fn a_takeover_by_a_leader_with_another_lane_count_reaches_every_follower() {
    let etcd = Etcd::start();
    let options = "min_nodes=2&max_nodes=1000&lease_ttl=2&last_call_timeout=60&join_timeout=120";
    let first_url = etcd.url("takeover-lanes", options);
    let follower_url = first_url
        .replace("max_nodes=1000", "max_nodes=4")
        .replace("last_call_timeout=60", "last_call_timeout=1");
    let mut first = Node::spawn(&first_url, &[]);
    wait_for_leader(&etcd.endpoint(), &round_prefix(&first_url, 0));
    let followers: Vec<_> = (0..2)
        .map(|_| next_on_thread(&Arc::new(node(&follower_url))))
        .collect();
    // The first leader's last call (60 s) keeps the round open until it is killed.
    wait_for_joiners(&etcd, &first_url, 0, 3);
    first.child.kill().unwrap();
    let infos: Vec<RoundInfo> = followers
        .iter()
        .map(|rx| outcome(rx, "follower").unwrap())
        .collect();
    assert_eq!((infos[0].round, infos[0].world_size), (0, 2), "{infos:?}");
    assert_eq!((infos[1].round, infos[1].world_size), (0, 2), "{infos:?}");
    assert_ne!(infos[0].rank, infos[1].rank);
}
