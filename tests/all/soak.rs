//! Churn with real processes: two long-lived nodes and a third that joins, completes a round,
//! leaves, and is replaced, again and again. Every join and every departure forms a new round.
//! The short version runs with the test suite; the soak (a few hundred rounds) is opt-in:
//! `cargo test --release --test all -- --ignored soak::`.

use crate::common;

use common::node::Node;
use common::Etcd;

/// Runs `cycles` join-and-leave cycles (two rounds each) and checks every round.
fn churn(cycles: usize) {
    let etcd = Etcd::start();
    let url = etcd.url(
        "churn",
        "min_nodes=2&max_nodes=3&last_call_timeout=0.2&lease_ttl=2",
    );
    let stayers = [
        Node::spawn(&url, &["--rounds", "100000", "--follow"]),
        Node::spawn(&url, &["--rounds", "100000", "--follow"]),
    ];
    let check_pair = |expect_world: u64| -> u64 {
        let (a, b) = (stayers[0].round(60), stayers[1].round(60));
        assert_eq!(a["round"], b["round"], "{a} {b}");
        assert_eq!(
            (a["world_size"].as_u64(), b["world_size"].as_u64()),
            (Some(expect_world), Some(expect_world)),
            "{a} {b}"
        );
        assert_ne!(a["rank"], b["rank"], "{a} {b}");
        assert_eq!(a["master_port"], b["master_port"]);
        // Rank 0 never moves while both stayers live.
        assert!(
            a["rank"].as_u64().unwrap() < 2 && b["rank"].as_u64().unwrap() < 2,
            "{a} {b}"
        );
        a["round"].as_u64().unwrap()
    };
    let mut round = check_pair(2);
    for cycle in 0..cycles {
        let visitor = Node::spawn(&url, &[]);
        let joined = visitor.round(60);
        let with_visitor = check_pair(3);
        assert_eq!(with_visitor, round + 1, "cycle {cycle}: no round skipped");
        assert_eq!(joined["round"].as_u64(), Some(with_visitor));
        assert_eq!(
            joined["rank"], 2,
            "cycle {cycle}: the newcomer ranks after the survivors"
        );
        let mut visitor = visitor;
        assert!(visitor.child.wait().unwrap().success());
        // The visitor's shutdown revokes its lease: the stayers see it lost and re-form.
        round = check_pair(2);
        assert_eq!(round, with_visitor + 1, "cycle {cycle}: no round skipped");
    }
}

#[test]
fn members_leave_and_join_for_twenty_rounds() {
    churn(10);
}

#[test]
#[ignore = "soak: a few hundred rounds; run with --ignored"]
fn soak_members_leave_and_join_for_three_hundred_rounds() {
    churn(150);
}
