//! Faults of the etcd cluster and of the network, with real `rdzv-node` processes: the raft
//! leader of a three-member etcd cluster dies while nodes are blocked in their join, and one
//! node is cut off from etcd by a network partition (a network namespace whose veth link is
//! taken down). And a member being added (a learner) among the endpoints nodes are given.

use crate::common;

use common::node::{joiners_of_round, node_bin, run_of, Node};
use common::{on_threads, Etcd, EtcdCluster, NetNs};
use rdzv::{BlockingRendezvous, Params};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Asserts the lines are one round: ranks exactly 0..n, and everyone agrees on round, world
/// size and master.
fn assert_one_world(lines: &[Value]) {
    let ranks: BTreeSet<u64> = lines
        .iter()
        .map(|l| {
            l["rank"]
                .as_u64()
                .unwrap_or_else(|| panic!("a round line: {l}"))
        })
        .collect();
    assert_eq!(
        ranks,
        (0..lines.len() as u64).collect(),
        "ranks must be 0..n, unique: {lines:?}"
    );
    for l in lines {
        assert_eq!(l["world_size"], lines.len(), "{lines:?}");
        assert_eq!(
            (&l["round"], &l["master_addr"], &l["master_port"]),
            (
                &lines[0]["round"],
                &lines[0]["master_addr"],
                &lines[0]["master_port"]
            ),
            "every member must see the same round: {lines:?}"
        );
    }
}

/// Three nodes, min = max = 3, all given the three endpoints. `early` of them join and block;
/// then the raft leader of etcd is SIGKILLed and the rest arrive. The round must form on
/// the two surviving etcd members, and its store must work.
fn round_survives_the_death_of_the_etcd_leader(early: usize) {
    let mut cluster = EtcdCluster::start(3);
    let url = cluster.url("etcd-leader", "min_nodes=3&max_nodes=3&join_timeout=60");
    // Each node's records at info level on the test's stderr: leases created, lost and
    // revoked, rounds sealed and deleted, so a failure here says which of them undid the round.
    let spawn = || {
        let mut command = std::process::Command::new(node_bin());
        command.env("RDZV_LOG", "info");
        Node::spawn_command(command, &url, &["--exchange"])
    };
    let mut nodes: Vec<Node> = (0..early).map(|_| spawn()).collect();
    // Blocked in their join: every early node's join key is in etcd.
    common::wait_for_key_count(&cluster.endpoint(0), &joiners_of_round(&url, 0), |n| {
        n == early
    });
    let victim = cluster.raft_leader();
    cluster.kill(victim);
    let killed_at = Instant::now();
    nodes.extend((early..3).map(|_| spawn()));
    let lines: Vec<Value> = nodes.iter().map(|n| n.line(60)).collect();
    eprintln!(
        "round formed {:.1} s after the etcd leader (member {victim}) was killed",
        killed_at.elapsed().as_secs_f64()
    );
    assert_one_world(&lines);
    assert_eq!(lines[0]["round"], 0, "{lines:?}");
    // The store, after the failover: every rank read every other rank's id, and concurrent
    // adds each saw a distinct total.
    let mut adds = BTreeSet::new();
    for l in &lines {
        assert_eq!(l["peers_read"], 3, "{l}");
        assert_eq!(l["own_id_ok"], true, "{l}");
        adds.insert(l["add_result"].as_i64().unwrap());
    }
    assert_eq!(adds, (1..=3).collect(), "{lines:?}");
    for n in nodes {
        assert_eq!(n.finish(30), 0);
    }
}

#[test]
fn round_forms_when_the_etcd_leader_dies_with_one_node_joined() {
    round_survives_the_death_of_the_etcd_leader(1);
}

#[test]
fn round_forms_when_the_etcd_leader_dies_with_two_nodes_joined() {
    round_survives_the_death_of_the_etcd_leader(2);
}

/// A join sent to a follower just after the raft leader died is forwarded to the dead leader
/// and lost: etcd answers it only after its own request timeout (7 s with the default
/// election timeout). The node sees the cluster's new leader (a higher raft term) and sends
/// the join again; the round forms under the new leader.
#[test]
fn a_join_lost_with_the_etcd_leader_is_sent_again_to_the_new_one() {
    let records = crate::records::records();

    let mut cluster = EtcdCluster::start(3);
    let victim = cluster.raft_leader();
    // The node knows only a follower, so its join must go through the leader.
    let follower = cluster.endpoint((victim + 1) % cluster.member_count());
    let url = format!("etcd://{follower}/lost-join?min_nodes=1&max_nodes=1&join_timeout=60");
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    // Connected, with its lease: the next request it sends is the join.
    cluster.kill(victim);
    let killed = std::time::Instant::now();
    let (info, _store) = node
        .next()
        .expect("the round forms under the new etcd leader");
    assert_eq!((info.rank, info.world_size), (0, 1));
    // DESIGN's bound: sent again once there is a new leader, not after etcd's own request
    // timeout (5 s and two election timeouts: 7 s), when etcd would have answered anyway.
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(7),
        "the join formed {took:?} after the leader died: not before etcd's request timeout"
    );
    node.shutdown().unwrap();
    let messages = records.lines();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("lost-join")
                && m.contains("changed leader while join was unanswered")),
        "the join should have been sent again once etcd had a new leader: {messages:?}"
    );
}

/// The other side: etcd frozen (SIGSTOP) for longer than a request counts as stuck, with no
/// leader change. The node's requests wait for etcd's answer; none is sent again.
#[test]
fn a_frozen_etcd_without_a_new_leader_gets_no_repeated_request() {
    let records = crate::records::records();
    let etcd = Etcd::start();
    let params =
        Params::from_url(&etcd.url("frozen", "min_nodes=1&max_nodes=1&join_timeout=60")).unwrap();
    let run = params.run_id().to_string();
    let node = Arc::new(BlockingRendezvous::new(params).unwrap());
    let resumed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    etcd.signal(libc::SIGSTOP);
    let waiting = {
        let (node, resumed) = (node.clone(), resumed.clone());
        std::thread::spawn(move || {
            let done = node.next();
            (done, resumed.load(std::sync::atomic::Ordering::SeqCst))
        })
    };
    // The fault's length: past the second after which a request counts as stuck, and several
    // of the connection's term probes (every 500 ms).
    std::thread::sleep(Duration::from_secs(3));
    resumed.store(true, std::sync::atomic::Ordering::SeqCst);
    etcd.signal(libc::SIGCONT);
    let (done, after_resume) = waiting.join().unwrap();
    let (info, _store) = done.expect("the round forms once etcd answers again");
    assert_eq!(info.world_size, 1);
    assert!(
        after_resume,
        "next cannot have finished while etcd was frozen"
    );
    node.shutdown().unwrap();
    let repeated: Vec<String> = records
        .lines()
        .iter()
        .filter(|r| r.contains(&run) && r.contains("changed leader while"))
        .cloned()
        .collect();
    assert!(
        repeated.is_empty(),
        "no leader change, so no request may be sent again: {repeated:?}"
    );
}

#[test]
fn a_partitioned_node_is_dropped_and_gets_an_error() {
    let ns = match NetNs::create() {
        Ok(ns) => ns,
        Err(why) => {
            // Straight to stderr, past libtest's capture, so the skip shows in every run.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED a_partitioned_node_is_dropped_and_gets_an_error: \
                 cannot create a network namespace here ({why})"
            );
            return;
        }
    };
    let etcd = EtcdCluster::start_on(1, &[&ns.host_addr]);
    // lease_ttl=2: the cut-off node is dropped within about 2 s. min_nodes=2 lets the
    // survivors re-form without it. connect_timeout and close_timeout bound how long the
    // cut-off node takes to give up. The last call is long enough for the three first
    // nodes to make one round, short enough to keep the test quick.
    let query =
        "min_nodes=2&max_nodes=3&last_call_timeout=2&lease_ttl=2&connect_timeout=3&join_timeout=10&close_timeout=3";
    let url = etcd.url("partition", query);
    let inside_url = url.replacen("127.0.0.1", &ns.host_addr, 1);
    let args = ["--rounds", "2", "--follow"];

    // The node in the namespace joins first (and so leads round 0): proof that it reaches
    // etcd across the veth.
    let inside = Node::spawn_command(ns.command(node_bin()), &inside_url, &args);
    common::wait_for_leader(&etcd.endpoint(0), &format!("/rdzv/{}/", run_of(&url)));
    let outside: Vec<Node> = (0..2).map(|_| Node::spawn(&url, &args)).collect();
    let first: Vec<Value> = std::iter::once(&inside)
        .chain(&outside)
        .map(|n| n.line(30))
        .collect();
    assert_one_world(&first);
    let inside_id = first[0]["node"].clone();

    ns.cut();
    let cut_at = Instant::now();

    // The survivors notice the loss within about the lease TTL...
    for n in &outside {
        let change = n.line(15);
        assert_eq!(change["event"], "change", "{change}");
        assert_eq!(change["lost"], 1, "the cut-off node must be lost: {change}");
    }
    let noticed = cut_at.elapsed();
    // ...and form a round of two without it.
    let second: Vec<Value> = outside.iter().map(|n| n.line(30)).collect();
    let formed = cut_at.elapsed();
    assert_one_world(&second);
    assert_eq!(second[0]["round"], 1, "{second:?}");
    assert!(
        second.iter().all(|l| l["node"] != inside_id),
        "the cut-off node must not be a member: {second:?}"
    );

    // The cut-off node cannot reach etcd: it reports an error and exits 2, instead of
    // claiming a place in any later round.
    let error = inside.line(15);
    let failed = cut_at.elapsed();
    eprintln!(
        "after the cut: loss noticed in {:.1} s, round of 2 in {:.1} s, \
         cut-off node failed in {:.1} s with {error}",
        noticed.as_secs_f64(),
        formed.as_secs_f64(),
        failed.as_secs_f64()
    );
    assert!(
        error.get("rank").is_none() && error.get("event").is_none(),
        "the cut-off node must not report a round or a change: {error}"
    );
    assert!(
        error["error"] == "Connection" || error["error"] == "LeaseLost",
        "expected a connection error: {error}"
    );
    assert!(
        noticed < Duration::from_secs(8),
        "the loss must be noticed within about lease_ttl: {noticed:?}"
    );
    // num_waiting gives up after connect_timeout (3 s); rdzv-node prints the error once its
    // handle is dropped, and the drop's shutdown tries to revoke the lease for up to
    // close_timeout (3 s) more. Without close_timeout=3 the default 30 s would apply here.
    assert!(
        failed < Duration::from_secs(3 + 3 + 3),
        "the cut-off node must fail within connect_timeout + close_timeout: {failed:?}"
    );
    assert_eq!(inside.finish(10), 2);
    for n in outside {
        assert_eq!(n.finish(15), 0);
    }
}

/// A learner refuses every request but serializable reads, with Unavailable up to etcd 3.5 and
/// FailedPrecondition from 3.6. Nodes given the voting member and the learner must reach a
/// round and use its store, every request that the learner refuses being retried (requests
/// are spread over both endpoints, so each node sends some to the learner; a long
/// connect_timeout gives a node's first requests room for the retries of a streak of bad luck).
#[test]
fn a_learner_among_the_endpoints_does_not_fail_requests() {
    let etcd = Etcd::start();
    let learner = etcd.add_learner();
    let url = format!(
        "etcd://{},{}/learner-{}?min_nodes=4&max_nodes=4&join_timeout=60&connect_timeout=30",
        etcd.endpoint(),
        learner.endpoint(),
        std::process::id()
    );
    let results = on_threads(4, move |_| -> rdzv::Result<(Vec<Vec<u8>>, i64)> {
        let node = BlockingRendezvous::new(Params::from_url(&url)?)?;
        let (info, store) = node.next()?;
        store.set(&format!("rank/{}", info.rank), b"here")?;
        let ranks: Vec<String> = (0..info.world_size).map(|r| format!("rank/{r}")).collect();
        let keys: Vec<&str> = ranks.iter().map(String::as_str).collect();
        let values = store.multi_get(&keys, Some(Duration::from_secs(30)))?;
        let added = store.add("count", 1)?;
        node.shutdown()?;
        Ok((values, added))
    });
    let mut adds = BTreeSet::new();
    for (i, result) in results.into_iter().enumerate() {
        let (values, added) = result.unwrap_or_else(|e| panic!("node {i}: {e}"));
        assert_eq!(
            values,
            vec![b"here".to_vec(); 4],
            "node {i} read every rank"
        );
        adds.insert(added);
    }
    assert_eq!(adds, (1..=4).collect(), "each add saw a distinct total");
}

/// The etcd binary of the pinned version of `minor` (`3.5`) that scripts/etcd-build.sh cached,
/// if it is there (the test command builds every pinned version first).
fn cached_etcd(minor: &str) -> Option<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let pinned = std::fs::read_to_string(root.join("scripts/etcd-versions")).ok()?;
    let version = pinned
        .lines()
        .find(|l| l.starts_with(&format!("v{minor}.")))?
        .trim()
        .to_string();
    let cache = std::env::var_os("RDZV_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|c| std::path::PathBuf::from(c).join("rdzv"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/rdzv"))
        })?;
    let binary = cache.join(format!("etcd-{version}")).join("etcd");
    binary.is_file().then_some(binary)
}

/// A rolling upgrade under a running job, as docs/OPERATIONS.md describes it: a 3-member etcd
/// 3.5 is upgraded to 3.6 member by member (SIGTERM, the new binary on the same data
/// directory, the next once it serves) while two nodes keep forming rounds and using their
/// store. No call fails, rounds keep forming through each step, and every member ends on 3.6.
#[test]
fn a_job_rides_out_a_rolling_upgrade_of_its_etcd() {
    let (Some(old), Some(new)) = (cached_etcd("3.5"), cached_etcd("3.6")) else {
        eprintln!("skipped: etcd 3.5 and 3.6 are not built (scripts/etcd-build.sh builds them)");
        return;
    };
    let mut cluster = EtcdCluster::start_from(3, &[], Some(old));
    let url = cluster.url(
        "upgrade",
        "min_nodes=2&max_nodes=2&last_call_timeout=0.5&lease_ttl=5&join_timeout=60",
    );
    // Each node forms round after round until the run is closed; any other error fails the
    // test. (A stop flag would leave one node waiting in `next` for a partner that stopped.)
    let nodes: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || -> Result<u64, String> {
                let node = BlockingRendezvous::new(Params::from_url(&url).unwrap())
                    .map_err(|e| format!("new: {e}"))?;
                let mut rounds = 0;
                loop {
                    let (info, store) = match node.next() {
                        Ok(round) => round,
                        Err(e) if e.kind() == rdzv::ErrorKind::Closed => break,
                        Err(e) => return Err(format!("next: {e}")),
                    };
                    let other = format!("k{}", 1 - info.rank);
                    store
                        .set(&format!("k{}", info.rank), b"v")
                        .map_err(|e| format!("store set: {e}"))?;
                    match store.get(&other, Some(Duration::from_secs(60))) {
                        Ok(_) => rounds += 1,
                        Err(e) if e.kind() == rdzv::ErrorKind::Closed => break,
                        Err(e) => return Err(format!("store get: {e}")),
                    }
                }
                node.shutdown().map_err(|e| format!("shutdown: {e}"))?;
                Ok(rounds)
            })
        })
        .collect();
    // Rounds form before, between and after the steps: the open round number moves on (seen
    // by an operator's watch).
    let admin = rdzv::BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    let round_moves_on = |what: &str| {
        let mut status = admin.status().unwrap();
        let target = status.open_round + 3;
        let deadline = Instant::now() + Duration::from_secs(30);
        while status.open_round < target {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no round formed {what}");
            status = admin
                .watch_next(left)
                .unwrap_or_else(|e| panic!("watching the run {what}: {e}"));
        }
    };
    round_moves_on("before the upgrade");
    for i in 0..cluster.member_count() {
        cluster.upgrade(i, &new);
        round_moves_on(&format!("after member {i} was upgraded"));
    }
    admin.close().unwrap();
    for n in nodes {
        let rounds = n
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("a call failed: {e}"));
        assert!(rounds >= 12, "only {rounds} rounds");
    }
    // Every member now runs 3.6.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for i in 0..cluster.member_count() {
        let version = rt.block_on(async {
            let mut c = etcd_client::Client::connect([cluster.endpoint(i)], None)
                .await
                .unwrap();
            c.status().await.unwrap().version().to_string()
        });
        assert!(version.starts_with("3.6."), "member {i} runs {version}");
    }
}
