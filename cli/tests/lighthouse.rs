//! `rdzv lighthouse` against a real etcd: two lighthouse processes serve one job, replica
//! groups (gRPC clients generated from the same torchft.proto as the command) heartbeat and
//! ask for quorums through either, and the leader is SIGKILLed mid-job. Checks torchft's
//! quorum rules as a manager sees them, that the per-step path writes nothing to etcd, and
//! that `quorum_id` keeps growing across the failover.

#[path = "../../tests/common/mod.rs"]
mod common;

mod proto {
    #![allow(clippy::all)]
    tonic::include_proto!("torchft");
}

#[path = "support/lighthouse.rs"]
mod harness;

#[path = "lighthouse/failover.rs"]
mod failover;

use common::Etcd;
use harness::{client, ids, step, Lighthouse, Replica, HEARTBEAT_TIMEOUT_MS, RDZV};
use proto::{LighthouseHeartbeatRequest, LighthouseQuorumRequest, QuorumMember};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn an_empty_replica_id_is_refused_by_name() {
    let etcd = Etcd::start();
    let job = format!("lighthouse-empty-{}", std::process::id());
    let mut a = Lighthouse::start(&etcd.endpoint(), &job);
    a.wait_line(Duration::from_secs(10), "lighthouse: leading");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = client(&a.address).await;
        let beat = c
            .heartbeat(LighthouseHeartbeatRequest {
                replica_id: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(beat.code(), tonic::Code::InvalidArgument, "{beat:?}");
        assert!(beat.message().contains("replica_id"), "{beat:?}");
        let mut ask = tonic::Request::new(LighthouseQuorumRequest {
            requester: Some(QuorumMember {
                step: 1,
                world_size: 1,
                ..Default::default()
            }),
        });
        // Refused at once, not left to time out.
        ask.set_timeout(Duration::from_secs(10));
        let started = Instant::now();
        let quorum = c.quorum(ask).await.unwrap_err();
        assert_eq!(quorum.code(), tonic::Code::InvalidArgument, "{quorum:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{quorum:?}");
    });
}

#[test]
fn quorums_follow_torchfts_rules_and_survive_a_killed_leader() {
    let etcd = Etcd::start();
    let job = format!("lighthouse-{}", std::process::id());
    let mut a = Lighthouse::start(&etcd.endpoint(), &job);
    a.wait_line(Duration::from_secs(10), "lighthouse: leading");
    let mut b = Lighthouse::start(&etcd.endpoint(), &job);
    assert!(!b.said_leading(), "only one lighthouse leads");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Two replica groups through the leader, two through the follower.
        let mut r = vec![];
        for (i, addr) in [&a.address, &a.address, &b.address, &b.address]
            .into_iter()
            .enumerate()
        {
            r.push(Replica::start(&format!("replica{i}"), addr).await);
        }
        let all: Vec<&Replica> = r.iter().collect();
        let first = step(&all, 1).await;
        assert_eq!(
            ids(&first),
            ["replica0", "replica1", "replica2", "replica3"]
        );
        let id0 = first.quorum_id;
        assert!(id0 >= 1);

        // The fast path, step after step: the same id, and not one write to etcd.
        let puts = etcd.metric("etcd_mvcc_put_total");
        for s in 2..12 {
            assert_eq!(step(&all, s).await.quorum_id, id0, "same members, same id");
        }
        assert_eq!(
            etcd.metric("etcd_mvcc_put_total"),
            puts,
            "the fast path wrote to etcd"
        );

        // replica3 dies (no heartbeats, no asks): the others get a quorum without it once its
        // heartbeat times out, with a higher id.
        r[3].stop_heartbeats();
        let started = Instant::now();
        let three: Vec<&Replica> = r[..3].iter().collect();
        let shrunk = step(&three, 12).await;
        assert_eq!(ids(&shrunk), ["replica0", "replica1", "replica2"]);
        assert_eq!(
            shrunk.quorum_id,
            id0 + 1,
            "a membership change grows the id"
        );
        assert!(
            started.elapsed() < Duration::from_millis(HEARTBEAT_TIMEOUT_MS + 1000),
            "a lost replica group noticed within heartbeat_timeout (took {:?})",
            started.elapsed()
        );

        // Everyone moves to the follower; the leader is SIGKILLed between two steps.
        for rep in r.iter_mut().take(3) {
            rep.switch_to(&b.address).await;
        }
        let three: Vec<&Replica> = r[..3].iter().collect();
        assert_eq!(step(&three, 13).await.quorum_id, id0 + 1);
        assert!(
            !b.said_leading(),
            "the first lighthouse still leads when it is killed"
        );
        unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
        let _ = a.child.wait();
        let killed = Instant::now();
        let after = step(&three, 14).await;
        println!(
            "first quorum after the leader's SIGKILL: {:?}",
            killed.elapsed()
        );
        assert_eq!(ids(&after), ["replica0", "replica1", "replica2"]);
        assert_eq!(
            after.quorum_id,
            id0 + 1,
            "same members after failover: same id"
        );
        assert!(
            b.says_leading_within(Duration::from_secs(5)),
            "the follower took over"
        );
        // Its address refusing connections, the dead leader's lease is revoked at once rather
        // than left to expire (lease_ttl = 2 s).
        assert!(
            killed.elapsed() < Duration::from_millis(1500),
            "the new leader answered {:?} after the kill",
            killed.elapsed()
        );
        assert!(b.seen.iter().any(|l| l.contains("refuses connections")));

        // replica3 comes back. As with torchft, a fast quorum does not wait for a newcomer: the
        // others step on (as managers do) until a quorum includes it, and its id grows past
        // every id handed out before the failover.
        r[3].switch_to(&b.address).await;
        let three: Vec<&Replica> = r[..3].iter().collect();
        let newcomer = tokio::spawn(r[3].quorum(15, Duration::from_secs(15)));
        let mut s = 15;
        let back = loop {
            let q = step(&three, s).await;
            if q.participants.len() == 4 {
                break q;
            }
            assert_eq!(q.quorum_id, id0 + 1, "without replica3, the same id");
            s += 1;
            assert!(s < 100, "replica3 never got into a quorum");
        };
        let got = newcomer.await.unwrap().expect("replica3's quorum");
        assert_eq!(ids(&got), ids(&back));
        assert_eq!(
            back.quorum_id,
            id0 + 2,
            "quorum_id grows across the failover"
        );

        // min_replicas=2: a replica group asking alone gets no quorum. (Last: its ask stays
        // pending at the lighthouse, as in torchft, and would count in a next quorum.)
        let alone = r[0].quorum(100, Duration::from_millis(500)).await;
        assert!(
            alone.is_err(),
            "a quorum of 1 with min_replicas=2: {alone:?}"
        );
    });
    let status = Command::new(RDZV)
        .args([
            "status",
            &format!("--rdzv-endpoint={}", etcd.endpoint()),
            &format!("--rdzv-id={job}"),
        ])
        .output()
        .expect("rdzv status");
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains(&format!("leader {}", b.address)) && table.contains("replica3"),
        "rdzv status shows the lighthouse:\n{table}"
    );
}

#[test]
fn quorums_go_on_while_etcds_raft_leader_is_killed() {
    let mut cluster = common::EtcdCluster::start(3);
    let endpoints: Vec<String> = (0..3).map(|i| cluster.endpoint(i)).collect();
    let endpoints = endpoints.join(",");
    let job = format!("lighthouse-etcd-{}", std::process::id());
    let mut a = Lighthouse::start(&endpoints, &job);
    a.wait_line(Duration::from_secs(10), "lighthouse: leading");
    let mut b = Lighthouse::start(&endpoints, &job);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut r = vec![];
        for i in 0..3 {
            r.push(Replica::start(&format!("replica{i}"), &b.address).await);
        }
        let all: Vec<&Replica> = r.iter().collect();
        let id0 = step(&all, 1).await.quorum_id;
        // The harness asks etcd on a runtime of its own.
        let leader = tokio::task::block_in_place(|| cluster.raft_leader());
        cluster.kill(leader);
        let killed = Instant::now();
        // Steps with the same members need nothing from etcd: they go on through the election.
        let mut slowest = Duration::ZERO;
        for s in 2..12 {
            let started = Instant::now();
            assert_eq!(step(&all, s).await.quorum_id, id0);
            slowest = slowest.max(started.elapsed());
        }
        println!(
            "ten steps within {:?} of etcd's leader SIGKILL, the slowest {slowest:?}",
            killed.elapsed()
        );
        // A membership change writes to etcd (now on its new leader): replica2 is lost.
        r[2].stop_heartbeats();
        let two: Vec<&Replica> = r[..2].iter().collect();
        let shrunk = step(&two, 12).await;
        assert_eq!(ids(&shrunk), ["replica0", "replica1"]);
        assert_eq!(shrunk.quorum_id, id0 + 1);
    });
    assert!(
        !a.seen.iter().any(|l| l.contains("no longer leading")) && !b.said_leading(),
        "the lighthouse's leader kept its lease through etcd's election"
    );
}

#[test]
fn a_paused_leader_is_replaced_after_its_lease_and_steps_down_when_it_resumes() {
    let etcd = Etcd::start();
    let job = format!("lighthouse-paused-{}", std::process::id());
    let mut a = Lighthouse::start(&etcd.endpoint(), &job);
    a.wait_line(Duration::from_secs(10), "lighthouse: leading");
    let mut b = Lighthouse::start(&etcd.endpoint(), &job);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut r = vec![];
        for i in 0..3 {
            r.push(Replica::start(&format!("replica{i}"), &b.address).await);
        }
        let all: Vec<&Replica> = r.iter().collect();
        let id0 = step(&all, 1).await.quorum_id;
        // SIGSTOP: the leader neither refreshes its lease nor answers, nor refuses connections.
        unsafe { libc::kill(a.child.id() as i32, libc::SIGSTOP) };
        let paused = Instant::now();
        r[2].stop_heartbeats();
        let two: Vec<&Replica> = r[..2].iter().collect();
        let after = step(&two, 2).await;
        println!(
            "first quorum after the leader's SIGSTOP: {:?}",
            paused.elapsed()
        );
        assert!(
            paused.elapsed() >= Duration::from_secs(1),
            "replaced before its lease (2 s) could expire"
        );
        assert!(b.says_leading_within(Duration::from_secs(5)));
        assert_eq!(ids(&after), ["replica0", "replica1"]);
        assert_eq!(after.quorum_id, id0 + 1);
        // A call reaches the paused leader (it waits in its socket's queue), then it resumes:
        // it finds its lease gone, stops leading, and the call waiting in it is forwarded to
        // the new leader, whose quorum it returns (the id only grew).
        let mut via_a = client(&a.address).await;
        let mut ask = tonic::Request::new(LighthouseQuorumRequest {
            requester: Some(QuorumMember {
                replica_id: "replica1".into(),
                ..Default::default()
            }),
        });
        ask.set_timeout(Duration::from_secs(15));
        let waiting = tokio::spawn(async move { via_a.quorum(ask).await });
        let other = tokio::spawn(r[0].quorum(3, Duration::from_secs(15)));
        unsafe { libc::kill(a.child.id() as i32, libc::SIGCONT) };
        let through_a = waiting
            .await
            .unwrap()
            .expect("a quorum through the old leader");
        let later = through_a.into_inner().quorum.expect("a quorum");
        assert_eq!(ids(&later), ["replica0", "replica1"]);
        assert_eq!(other.await.unwrap().unwrap().quorum_id, later.quorum_id);
        assert!(a.said_line("no longer leading"));
        assert_eq!(later.quorum_id, id0 + 1);
    });
}
