//! Multi-node scenarios with real processes (`rdzv-node`) and real signals.

use crate::common;

use common::node::{joiners_of_round, Node};
use common::Etcd;
use serde_json::Value;
use std::collections::BTreeSet;

fn ranks(lines: &[Value]) -> BTreeSet<u64> {
    lines
        .iter()
        .map(|l| l["rank"].as_u64().expect("a round line"))
        .collect()
}

#[test]
fn processes_form_a_round_and_exchange_through_the_store() {
    let etcd = Etcd::start();
    let url = etcd.url("proc", "min_nodes=4&max_nodes=4");
    let nodes: Vec<Node> = (0..4).map(|_| Node::spawn(&url, &["--exchange"])).collect();
    let lines: Vec<Value> = nodes.iter().map(|n| n.line(60)).collect();
    assert_eq!(ranks(&lines), (0..4).collect());
    let mut adds = BTreeSet::new();
    for l in &lines {
        assert_eq!(l["world_size"], 4);
        assert_eq!(l["peers_read"], 4);
        assert_eq!(l["own_id_ok"], true);
        adds.insert(l["add_result"].as_i64().unwrap());
    }
    assert_eq!(
        adds,
        (1..=4).collect(),
        "concurrent adds must each see a distinct total"
    );
    for n in nodes {
        assert_eq!(n.finish(30), 0);
    }
}

#[test]
fn a_killed_member_is_reported_and_survivors_form_a_new_round() {
    let etcd = Etcd::start();
    // lease_ttl=2: the death is visible within about 2 s.
    let url = etcd.url(
        "kill",
        "min_nodes=2&max_nodes=3&last_call_timeout=0.5&lease_ttl=2",
    );
    let nodes: Vec<Node> = (0..3)
        .map(|_| Node::spawn(&url, &["--rounds", "2", "--follow"]))
        .collect();
    let first: Vec<Value> = nodes.iter().map(|n| n.line(60)).collect();
    assert_eq!(ranks(&first), (0..3).collect());

    // SIGKILL the member with rank 1: no shutdown, no lease revoke.
    let victim = first.iter().position(|l| l["rank"] == 1).unwrap();
    let mut nodes = nodes;
    let mut dead = nodes.remove(victim);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let killed = std::time::Instant::now();

    for n in &nodes {
        let change = n.line(30);
        assert_eq!(change["event"], "change", "{change}");
        assert_eq!(
            change["lost"], 1,
            "the dead member must be reported: {change}"
        );
        // "Within about one lease_ttl" (2 s here): etcd expires leases on a 500 ms tick, and the
        // margin is for a loaded 2-core machine (RELIABILITY says so beside the claim).
        let told = killed.elapsed();
        assert!(
            told < std::time::Duration::from_secs(2 + 3),
            "a survivor was told {told:?} after the SIGKILL (lease_ttl 2 s)"
        );
    }
    let second: Vec<Value> = nodes.iter().map(|n| n.line(60)).collect();
    assert_eq!(ranks(&second), (0..2).collect());
    assert_eq!(second[0]["round"], 1);
    // Rank 0 survived, so it stays rank 0.
    let old_rank0 = first.iter().find(|l| l["rank"] == 0).unwrap()["node"].clone();
    assert!(second
        .iter()
        .any(|l| l["node"] == old_rank0 && l["rank"] == 0));
    for n in nodes {
        assert_eq!(n.finish(30), 0);
    }
}

#[test]
fn a_leader_killed_before_the_round_completes_is_replaced() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "leader",
        "min_nodes=2&max_nodes=3&last_call_timeout=0.5&lease_ttl=2",
    );
    let run = common::node::run_of(&url);
    // The first node to join leads the round; kill it before anyone else arrives.
    let mut first = Node::spawn(&url, &[]);
    common::wait_for_leader(&etcd.endpoint(), &format!("/rdzv/{run}/"));
    let follower = Node::spawn(&url, &[]);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let last = Node::spawn(&url, &[]);
    let lines = [follower.line(60), last.line(60)];
    assert_eq!(ranks(&lines), (0..2).collect(), "{lines:?}");
    assert!(
        lines.iter().all(|l| l["world_size"] == 2),
        "the dead leader must not be a member"
    );
    assert_eq!(follower.finish(30), 0);
    assert_eq!(last.finish(30), 0);
}

#[test]
fn a_member_killed_during_the_last_call_is_left_out() {
    let etcd = Etcd::start();
    // min 2 reached at once; the last call (4 s) outlasts the dead node's lease (2 s).
    let url = etcd.url(
        "lastcall-kill",
        "min_nodes=2&max_nodes=4&last_call_timeout=4&lease_ttl=2",
    );
    let mut nodes: Vec<Node> = (0..3).map(|_| Node::spawn(&url, &[])).collect();
    common::wait_for_key_count(&etcd.endpoint(), &joiners_of_round(&url, 0), |n| n == 3);
    let mut victim = nodes.remove(1);
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    let lines: Vec<Value> = nodes.iter().map(|n| n.line(60)).collect();
    assert_eq!(ranks(&lines), (0..2).collect(), "{lines:?}");
    assert!(
        lines.iter().all(|l| l["world_size"] == 2),
        "the killed node must not be a member: {lines:?}"
    );
    for n in nodes {
        assert_eq!(n.finish(30), 0);
    }
}

#[test]
fn below_min_nodes_the_survivors_wait_for_replacements() {
    let etcd = Etcd::start();
    let url = etcd.url("below-min", "min_nodes=3&max_nodes=3&lease_ttl=2");
    let mut first: Vec<Node> = (0..2).map(|_| Node::spawn(&url, &[])).collect();
    common::wait_for_key_count(&etcd.endpoint(), &joiners_of_round(&url, 0), |n| n == 2);
    let mut victim = first.remove(0);
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // Until its lease expires a killed node is indistinguishable from a slow one; wait for
    // etcd to drop it so the newcomers cannot be sealed together with it.
    common::wait_for_key_count(&etcd.endpoint(), &joiners_of_round(&url, 0), |n| n == 1);
    // One survivor cannot form a round of 3; two newcomers complete it without the dead node.
    let late: Vec<Node> = (0..2).map(|_| Node::spawn(&url, &[])).collect();
    let all: Vec<Node> = first.into_iter().chain(late).collect();
    let lines: Vec<Value> = all.iter().map(|n| n.line(60)).collect();
    assert_eq!(ranks(&lines), (0..3).collect(), "{lines:?}");
    let victim_pid = victim.child.id();
    assert!(lines
        .iter()
        .all(|l| l["pid"] != victim_pid && l["world_size"] == 3));
    for n in all {
        assert_eq!(n.finish(30), 0);
    }
}
