//! `rdzv lighthouse` against a real etcd: two lighthouse processes serve one job, replica
//! groups (gRPC clients generated from the same torchft.proto as the command) heartbeat and
//! ask for quorums through either, and the leader is SIGKILLed mid-job. Checks torchft's
//! quorum rules as a manager sees them, that the per-step path writes nothing to etcd, and
//! that `quorum_id` keeps growing across the failover. "One leader" is a window of looks
//! (each lighthouse's /status and etcd's leader key, every 20 ms), never one instant; a call
//! held back must end as its deadline ends it, not with any error.

use rdzv_test_support as common;

mod proto {
    #![allow(clippy::all)]
    tonic::include_proto!("torchft");
}

mod failover;
mod harness;
mod torn;

use common::Etcd;
use harness::{
    client, ids, metric, one_leader_for, paused_leader_kept_for, step, JobKeys, Lighthouse,
    Replica, HEARTBEAT_TIMEOUT_MS, RDZV,
};
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
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Only the first one leads, at every look for a while (the second one campaigns).
        let mut keys = JobKeys::connect(&etcd.endpoint(), &job).await;
        let window = Duration::from_millis(500);
        one_leader_for(window, &a.address, &[&b.address], &mut keys).await;
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
        // /metrics: the leader answered each of the 11 steps' 4 quorum calls (2 of them
        // forwarded by the follower, which counts those).
        let (leader, follower) = (&a.address, &b.address);
        assert_eq!(metric(leader, &job, "rdzv_lighthouse_leading"), 1.0);
        assert_eq!(metric(follower, &job, "rdzv_lighthouse_leading"), 0.0);
        assert_eq!(metric(leader, &job, "rdzv_lighthouse_quorums_total"), 44.0);
        assert_eq!(
            metric(follower, &job, "rdzv_lighthouse_forwarded_quorums_total"),
            22.0
        );
        assert_eq!(
            metric(leader, &job, "rdzv_lighthouse_quorum_id"),
            id0 as f64
        );
        assert_eq!(metric(leader, &job, "rdzv_lighthouse_participants"), 4.0);

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
        // The first lighthouse still leads, alone, when it is killed.
        one_leader_for(window, &a.address, &[&b.address], &mut keys).await;
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
        one_leader_for(window, &b.address, &[], &mut keys).await;

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

        // min_replicas=2: a replica group asking alone gets no quorum: its call is held until
        // its deadline, which tonic's server ends as Cancelled "Timeout expired" (any other
        // error would be the lighthouse failing the call, not holding it back). Last: its ask
        // stays pending at the lighthouse, as in torchft, and would count in a next quorum.
        let asked = Instant::now();
        let alone = r[0].quorum(100, Duration::from_millis(500)).await;
        let held = asked.elapsed();
        match &alone {
            Err(s) if s.code() == tonic::Code::Cancelled && s.message() == "Timeout expired" => {}
            other => panic!(
                "a quorum of 1 with min_replicas=2: expected it held back until its deadline, \
                 got {other:?}"
            ),
        }
        assert!(
            held >= Duration::from_millis(450),
            "held back only {held:?} of its 500 ms"
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
        // The lighthouses' leader keeps its lease through etcd's election: it alone leads at
        // every look while the steps go on, and for a while after (read from a live member).
        let mut keys = JobKeys::connect(&cluster.endpoint((leader + 1) % 3), &job).await;
        let window = Duration::from_millis(1500);
        let others = [b.address.as_str()];
        let looking = one_leader_for(window, &a.address, &others, &mut keys);
        // Steps with the same members need nothing from etcd: they go on through the election.
        let stepping = async {
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
        };
        let (samples, ()) = tokio::join!(looking, stepping);
        println!("one lighthouse leader at each of {samples} looks through etcd's election");
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
    // The leader reaches etcd through a proxy that can hold its next record write back: the
    // write it sends just before it is paused reaches etcd only after its lease lapsed, as
    // the network delivers what a process sent before a stop.
    // The write is the only request after the leader's start that names the record's key as
    // its field 1 (a put's; a compare names it as field 3).
    let record = format!("/rdzv/{job}/elect/lighthouse/record");
    let mut put = vec![0x0a, record.len() as u8];
    put.extend_from_slice(record.as_bytes());
    let (proxy, hold) = common::SlowProxy::hold(etcd.client_port, put);
    let mut a = Lighthouse::start(&proxy.endpoint(), &job);
    a.wait_line(Duration::from_secs(10), "lighthouse: leading");
    let mut b = Lighthouse::start(&etcd.endpoint(), &job);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut keys = JobKeys::connect(&etcd.endpoint(), &job).await;
        let mut r = vec![];
        for i in 0..3 {
            r.push(Replica::start(&format!("replica{i}"), &b.address).await);
        }
        let all: Vec<&Replica> = r.iter().collect();
        let id0 = step(&all, 1).await.quorum_id;
        // replica2 is lost: the leader's next quorum has a new id, which it must write first.
        // That write is held on its way, and the leader SIGSTOPped with it in flight: it
        // neither refreshes its lease nor answers, nor refuses connections.
        hold.arm();
        r[2].stop_heartbeats();
        let two: Vec<&Replica> = r[..2].iter().collect();
        let pause = async {
            let holding = tokio::task::spawn_blocking({
                let hold = hold.clone();
                move || hold.holding(Duration::from_secs(10))
            });
            assert!(
                holding.await.unwrap(),
                "the leader wrote the next quorum's id"
            );
            unsafe { libc::kill(a.child.id() as i32, libc::SIGSTOP) };
            let paused = Instant::now();
            // Until its lease expires (2 s after its last refresh), nobody else leads, at any
            // look.
            let window = Duration::from_secs(1);
            paused_leader_kept_for(window, &a.address, &[&b.address], &mut keys).await;
            paused
        };
        let (after, paused) = tokio::join!(step(&two, 2), pause);
        println!(
            "first quorum after the leader's SIGSTOP: {:?}",
            paused.elapsed()
        );
        assert!(b.says_leading_within(Duration::from_secs(5)));
        assert_eq!(ids(&after), ["replica0", "replica1"]);
        assert_eq!(after.quorum_id, id0 + 1);
        one_leader_for(Duration::from_millis(200), &b.address, &[], &mut keys).await;
        // The paused leader's write now reaches etcd: refused (it no longer holds the leader
        // key, and the record changed since it read it).
        hold.release();
        let answer = tokio::task::spawn_blocking({
            let hold = hold.clone();
            move || hold.answer(Duration::from_secs(10))
        });
        let answer = answer
            .await
            .unwrap()
            .expect("etcd's answer to the paused leader's write");
        assert!(
            !txn_succeeded(&answer),
            "etcd took the write of a leader whose lease had lapsed"
        );
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
        // Nothing the paused leader wrote landed: the record and the note beside it are the
        // new leader's, written in one transaction.
        let (note, noted) = keys.get("store/notes/lighthouse").await.expect("the note");
        let (_, recorded) = keys
            .get("elect/lighthouse/record")
            .await
            .expect("the record");
        assert!(
            note.starts_with(&format!("leader {},", b.address)),
            "the note names another leader: {note:?}"
        );
        assert_eq!(
            recorded, noted,
            "the record was written apart from the new leader's note"
        );
    });
}

/// Whether etcd's answer to a transaction (a gRPC message: a 5-byte prefix, then the
/// `TxnResponse`) says it succeeded: its field 2, absent when false.
fn txn_succeeded(message: &[u8]) -> bool {
    fn varint(p: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = p.split_first().expect("a whole varint");
            *p = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let mut p = &message[5..];
    while !p.is_empty() {
        let tag = varint(&mut p);
        match tag & 7 {
            0 => {
                let value = varint(&mut p);
                if tag >> 3 == 2 {
                    return value != 0;
                }
            }
            2 => {
                let len = varint(&mut p) as usize;
                p = &p[len..];
            }
            other => panic!("wire type {other} in a TxnResponse"),
        }
    }
    false
}
