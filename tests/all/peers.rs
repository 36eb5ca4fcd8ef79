//! Members watch each other directly (core/src/rendezvous/peers.rs), at default settings: a
//! node whose processes are all killed is out of the round within a second and a half, one cut
//! off by its network within two; one frozen for 3 s, or starved of CPU, keeps its place; one
//! suspected while it still reaches etcd answers and keeps it. The victims are `rdzv-node`
//! processes, killed and frozen by real signals; the survivor is this process.

use crate::common;

use common::node::{node_bin, run_of, Node};
use common::{Etcd, NetNs};
use rdzv::{BlockingRendezvous, Params};
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// A killed node's bound: a probe (200 ms apart) finds its port closed, then the suspicion
/// waits out the half-second answer window and revokes the lease.
const KILLED_WITHIN: Duration = Duration::from_millis(1500);
/// A node cut off: `peer_timeout` (1 s) of silence, the answer window, and the probes' slack.
const CUT_OFF_WITHIN: Duration = Duration::from_secs(2);

/// `n` nodes in one round: this process's (returned) and `n - 1` rdzv-node processes that stay
/// in the round, polling it, as an agent does.
fn round_of(etcd: &Etcd, run: &str, n: usize) -> (BlockingRendezvous, Vec<(Node, u64)>, String) {
    let url = etcd.url(run, &format!("min_nodes={n}&max_nodes={n}"));
    let others: Vec<Node> = (1..n)
        .map(|_| Node::spawn(&url, &["--rounds", "2", "--follow"]))
        .collect();
    let me = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let (round, _) = me.next().unwrap();
    assert_eq!(round.world_size as usize, n);
    let others: Vec<(Node, u64)> = others
        .into_iter()
        .map(|other| {
            let line = other.round(30);
            assert_eq!(line["world_size"], n);
            let rank = line["rank"].as_u64().unwrap();
            (other, rank)
        })
        .collect();
    // The watch starts with the first count asked for, as in an agent's loop.
    assert_eq!(me.num_lost().unwrap(), 0);
    (me, others, url)
}

/// How long until this node counts a member lost, polled every 10 ms up to `limit`.
fn lost_after(me: &BlockingRendezvous, since: Instant, limit: Duration) -> Option<Duration> {
    while since.elapsed() < limit {
        if me.num_lost().unwrap() > 0 {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Checks that no member is counted lost for `span`, polling every 10 ms.
fn keeps_everyone_for(me: &BlockingRendezvous, span: Duration, what: &str) {
    let since = Instant::now();
    while since.elapsed() < span {
        assert_eq!(
            me.num_lost().unwrap(),
            0,
            "{what}: a member was evicted after {:?}",
            since.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(node: &Node, sig: i32) {
    // SAFETY: a plain kill(2) of a child this test owns.
    assert_eq!(unsafe { libc::kill(node.child.id() as i32, sig) }, 0);
}

#[test]
fn a_node_whose_processes_are_all_killed_is_out_of_the_round_within_1_5_s() {
    let etcd = Etcd::start();
    for n in [2, 8] {
        let (me, mut others, _) = round_of(&etcd, &format!("killed-{n}"), n);
        let (victim, rank) = others.pop().unwrap();
        let victim_id = me.members().unwrap()[rank as usize].clone();
        signal(&victim, libc::SIGKILL);
        let killed = Instant::now();
        let noticed = lost_after(&me, killed, Duration::from_secs(10));
        eprintln!("{n} nodes: a killed node was counted lost after {noticed:?}");
        let noticed = noticed.expect("the killed node is lost within its lease");
        assert!(
            noticed <= KILLED_WITHIN,
            "{n} nodes: the killed node was out after {noticed:?}, not within {KILLED_WITHIN:?} \
             (its lease, 10 s, would have been)"
        );
        // Its prober noted the eviction, before the revoke the loss came from.
        let run = me.run_store().unwrap();
        let key = format!("notes/evicted/{victim_id}");
        let note = run.get(&key, Some(Duration::from_secs(2))).unwrap();
        let note: serde_json::Value = serde_json::from_slice(&note).unwrap();
        let at = |k: &str| note[k].as_u64().unwrap_or_else(|| panic!("no {k}: {note}"));
        assert!(note["by"].is_string() && note["round"].is_u64(), "{note}");
        assert!(note["by"] != victim_id.as_str(), "{note}");
        assert!(at("answered_ms") <= at("suspected_ms"), "{note}");
        assert!(at("suspected_ms") <= at("evicted_ms"), "{note}");
        me.shutdown().unwrap();
    }
}

#[test]
fn two_neighbours_killed_together_are_both_out_within_two_bounds() {
    // A rack that fails whole: the first is found by its predecessor, which then probes the
    // one after it, found the same way.
    let etcd = Etcd::start();
    let (me, others, _) = round_of(&etcd, "neighbours", 8);
    let rank_of = |r: u64| others.iter().position(|(_, rank)| *rank == r);
    let first = (0..8)
        .find(|&r| rank_of(r).is_some() && rank_of((r + 1) % 8).is_some())
        .unwrap();
    let pair = [rank_of(first).unwrap(), rank_of((first + 1) % 8).unwrap()];
    for &i in &pair {
        signal(&others[i].0, libc::SIGKILL);
    }
    let killed = Instant::now();
    let deadline = killed + 2 * KILLED_WITHIN;
    while me.num_lost().unwrap() < 2 {
        assert!(
            Instant::now() < deadline,
            "two neighbours killed: {} counted lost after {:?}",
            me.num_lost().unwrap(),
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "two neighbours killed: both lost after {:?}",
        killed.elapsed()
    );
    me.shutdown().unwrap();
}

#[test]
fn a_node_frozen_for_3_s_or_starved_of_cpu_keeps_its_place() {
    let etcd = Etcd::start();
    let (me, others, _) = round_of(&etcd, "frozen", 2);
    let victim = &others[0].0;
    signal(victim, libc::SIGSTOP);
    keeps_everyone_for(&me, Duration::from_secs(3), "frozen for 3 s");
    signal(victim, libc::SIGCONT);
    // Longer than a suspicion takes, so one begun during the freeze would show.
    keeps_everyone_for(&me, CUT_OFF_WITHIN, "after the freeze");

    // Every core busy for 4 s: probes are answered by the kernel, and a late wake-up of the
    // prober is not taken for its peer's silence.
    match Command::new("stress-ng")
        .args(["--cpu", "0", "--timeout", "4s", "--quiet"])
        .spawn()
    {
        Ok(mut stress) => {
            keeps_everyone_for(&me, Duration::from_secs(4), "under stress-ng --cpu 0");
            stress.wait().unwrap();
        }
        Err(e) => panic!("stress-ng is needed (scripts/install-deps.sh installs it): {e}"),
    }
    me.shutdown().unwrap();
}

#[test]
fn a_suspected_node_that_reaches_etcd_answers_and_keeps_its_place() {
    // What a node cut off from its peers but not from etcd goes through: suspected, it deletes
    // the suspicion, and nobody evicts it.
    let etcd = Etcd::start();
    let (me, _others, url) = round_of(&etcd, "answers", 2);
    let key = format!("/rdzv/{}/suspect/{}", run_of(&url), me.node_id());
    let (rt, mut client) = common::etcd_client(&etcd);
    rt.block_on(client.put(key.as_str(), "a test", None))
        .unwrap();
    let asked = Instant::now();
    loop {
        let left = rt.block_on(client.get(key.as_str(), None)).unwrap().count();
        if left == 0 {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "the suspect did not answer within the answer window"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    keeps_everyone_for(&me, Duration::from_secs(1), "after answering");
    me.shutdown().unwrap();
}

#[test]
fn a_node_cut_off_by_its_network_is_out_of_the_round_within_2_s() {
    let ns = match NetNs::create() {
        Ok(ns) => ns,
        Err(why) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED a_node_cut_off_by_its_network_is_out_of_the_round_within_2_s: \
                 cannot create a network namespace here ({why})"
            );
            return;
        }
    };
    let records = crate::records::records();
    let etcd = common::EtcdCluster::start_on(1, &[&ns.host_addr]);
    let url = etcd.url("cut-off", "min_nodes=2&max_nodes=2");
    // The node inside publishes its own address, which its peer probes across the veth.
    let inside_url = format!(
        "{}&local_addr={}",
        url.replacen("127.0.0.1", &ns.host_addr, 1),
        ns.ns_addr
    );
    let inside = Node::spawn_command(
        ns.command(node_bin()),
        &inside_url,
        &["--rounds", "2", "--follow"],
    );
    let me = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    me.next().unwrap();
    assert_eq!(inside.round(30)["world_size"], 2);
    assert_eq!(me.num_lost().unwrap(), 0);
    // Probing works across the link before it is cut: nobody is suspected.
    keeps_everyone_for(&me, Duration::from_secs(1), "before the cut");
    ns.pull_cable();
    let cut = Instant::now();
    let noticed = lost_after(&me, cut, Duration::from_secs(10));
    eprintln!("a node cut off was counted lost after {noticed:?}");
    let run = run_of(&url);
    // Logged once the revoke is done, which the survivor may see first.
    records.await_line(0, &format!("run={run} "), "evicted the next member");
    let evicted: Vec<String> = records
        .lines()
        .into_iter()
        .filter(|l| l.contains(&format!("run={run} ")) && l.contains("evicted"))
        .collect();
    assert!(
        evicted.len() == 1 && evicted[0].contains("why=\"no answer for "),
        "evicted for its silence, not a refusal from elsewhere: {evicted:?}"
    );
    let noticed = noticed.expect("the cut-off node is lost within its lease");
    assert!(
        noticed <= CUT_OFF_WITHIN,
        "the cut-off node was out after {noticed:?}, not within {CUT_OFF_WITHIN:?}"
    );
    me.shutdown().unwrap();
    drop(inside);
}
