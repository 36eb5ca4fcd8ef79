//! etcd out of space: a real etcd with a 16 MiB backend quota, filled until it raises its
//! NOSPACE alarm. A store write (and a new node) then fails at once with a message that says
//! what the operator must do; `Admin::status` and `rdzv status` (table and `--json`) show the
//! alarm; a running node keeps its lease and one that leaves still cleans up; and the way out
//! that OPERATIONS.md gives (compact, defragment, disarm) makes the run write again.

use rdzv_test_support as common;

use common::{etcd_client, Etcd};
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, CompactionOptions};
use rdzv::{BlockingAdmin, BlockingRendezvous, ErrorKind, Params};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RDZV: &str = env!("CARGO_BIN_EXE_rdzv");

/// etcd's smallest sensible quota: a few of the 1 MiB writes below fill it.
const QUOTA: &str = "--quota-backend-bytes=16777216";

/// Writes 1 MiB values to one key outside the run until etcd refuses for lack of space (its
/// history keeps every version: a standalone etcd does not compact by default). Returns how
/// many writes it took.
fn fill(etcd: &Etcd) -> usize {
    let (rt, mut client) = etcd_client(etcd);
    let value = vec![b'x'; 1 << 20];
    for written in 0..64 {
        match rt.block_on(client.put("/filler", value.clone(), None)) {
            Ok(_) => {}
            Err(etcd_client::Error::GRpcStatus(s))
                if s.code() == tonic::Code::ResourceExhausted =>
            {
                assert!(s.message().contains("database space exceeded"), "{s:?}");
                return written;
            }
            Err(e) => panic!("filling etcd: {e}"),
        }
    }
    panic!("64 MiB written and etcd never ran out of space: was the quota applied?")
}

/// The way out of NOSPACE, as OPERATIONS.md gives it with etcdctl: compact the history,
/// defragment, disarm `member`'s alarm.
fn free(etcd: &Etcd, member: u64) {
    let (rt, mut client) = etcd_client(etcd);
    let revision = rt
        .block_on(client.get("/filler", None))
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let compact = CompactionOptions::new().with_physical();
    rt.block_on(client.compact(revision, Some(compact)))
        .unwrap();
    rt.block_on(client.defragment()).unwrap();
    let mut disarm = AlarmOptions::new();
    disarm.with_member(member);
    rt.block_on(client.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(disarm)))
        .unwrap();
}

/// An error of a call refused for lack of space: a connection error that says NOSPACE and what
/// to do, within the bound RELIABILITY states ("at once": under 5 s on a loaded machine, where
/// a retried write would wait out its deadline).
fn refused_for_space(what: &str, took: Duration, err: rdzv::Error) {
    assert_eq!(err.kind(), ErrorKind::Connection, "{what}: {err}");
    assert!(took < Duration::from_secs(5), "{what} took {took:?}: {err}");
    for says in ["NOSPACE", "alarm disarm", "OPERATIONS.md"] {
        assert!(err.message().contains(says), "{what}: {err}");
    }
}

/// `rdzv status` with `args`: (exit code, stdout, stderr).
fn rdzv_status(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(RDZV)
        .arg("status")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn a_full_etcd_fails_writes_at_once_says_what_to_do_and_status_shows_the_alarm() {
    let etcd = Etcd::start_with(&[QUOTA]);
    let url = etcd.url(
        "nospace",
        "min_nodes=1&max_nodes=1&store_timeout=20&lease_ttl=4",
    );
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let (_, store) = node.next().unwrap();
    store.set("before", b"1").unwrap();
    // Another process: this one's first status is read after the fill (a list without an
    // alarm is kept for a second, process-wide).
    let (code, json, err) = rdzv_status(&["--json", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(json.contains("\"alarms\":[]"), "no alarm before: {json}");

    let written = fill(&etcd);
    let full = Instant::now();
    eprintln!("etcd refused the write after {written} MiB");

    // Fails at once: not retried until the store's 20 s deadline, since nothing but an
    // operator frees the space.
    let started = Instant::now();
    let err = store.set("after", b"2").unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {err}");
    let m = err.message();
    for says in [
        "database space exceeded",
        "NOSPACE",
        "compact",
        "defrag",
        "alarm disarm",
        "OPERATIONS.md",
        &etcd.endpoint(),
    ] {
        assert!(m.contains(says), "the error does not say {says:?}: {m}");
    }
    // A read still works: the run's state is there to look at.
    assert_eq!(store.get("before", None).unwrap(), b"1");

    // The node's lease outlives its TTL: refreshing a lease is no write, so a running job
    // keeps its members through the alarm (only what writes fails).
    // (lease_ttl 4 s: with 2 s, the run's lease, refreshed every third of it, once lapsed on a
    // machine running four suites beside this one, and the round's store went with it.)
    std::thread::sleep(Duration::from_secs(5).saturating_sub(full.elapsed()));
    let admin = BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    let status = admin.status().unwrap();
    assert!(status.exists);
    assert_eq!(status.alive, 1, "the node's lease expired under the alarm");
    assert!(status.lost().is_empty());
    assert_eq!(status.alarms.len(), 1, "{:?}", status.alarms);
    assert_eq!(status.alarms[0].alarm, "NOSPACE");
    let member = status.alarms[0].member;

    let (code, table, err) = rdzv_status(&[&url]);
    assert_eq!(code, 0, "{err}");
    let line = format!("alarm    etcd: NOSPACE on member {member:x}: ");
    assert!(table.contains(&line), "{table}");
    assert!(table.contains("OPERATIONS.md"), "{table}");
    let (code, json, err) = rdzv_status(&["--json", &url]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        json["alarms"],
        serde_json::json!([{"alarm": "NOSPACE", "member": format!("{member:x}")}]),
        "{json}"
    );

    // The way out, as OPERATIONS.md gives it with etcdctl: compact the history, defragment,
    // disarm. Then the run writes again and the alarm is gone from its status.
    free(&etcd, member);
    store.set("after", b"2").unwrap();
    assert_eq!(store.get("after", None).unwrap(), b"2");
    assert_eq!(admin.status().unwrap().alarms, []);
    let (code, table, err) = rdzv_status(&[&url]);
    assert_eq!(code, 0, "{err}");
    assert!(!table.contains("alarm"), "{table}");
    node.shutdown().unwrap();
}

#[test]
fn a_node_that_starts_on_a_full_etcd_fails_at_once_and_one_that_leaves_cleans_up() {
    let etcd = Etcd::start_with(&[QUOTA]);
    let leaving = etcd.url("nospace-leaving", "min_nodes=1&max_nodes=1");
    let node = BlockingRendezvous::new(Params::from_url(&leaving).unwrap()).unwrap();
    let (_, store) = node.next().unwrap();
    store.set("x", b"1").unwrap();
    fill(&etcd);
    // Revoking a lease and deleting keys are no writes that take space: the last node out
    // still deletes the run's keys.
    node.shutdown().unwrap();
    let run = Params::from_url(&leaving).unwrap();
    let prefix = format!("{}/{}/", run.key_prefix(), run.run_id());
    let (rt, mut client) = etcd_client(&etcd);
    let left = rt
        .block_on(client.get(
            prefix.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ))
        .unwrap();
    assert_eq!(
        left.count(),
        0,
        "keys left under {prefix}: {:?}",
        left.kvs()
    );

    let url = etcd.url("nospace-new", "min_nodes=1&max_nodes=1&connect_timeout=20");
    let started = Instant::now();
    // Its lease is refused: a handle cannot register on an etcd that takes no writes.
    let err = match BlockingRendezvous::new(Params::from_url(&url).unwrap()) {
        Ok(_) => panic!("a node registered on an etcd out of space"),
        Err(e) => e,
    };
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {err}");
    for says in ["NOSPACE", "alarm disarm", "OPERATIONS.md"] {
        assert!(err.message().contains(says), "{err}");
    }
}

/// What an agent and an operator do on a full etcd: a node's `next`, closing the run and
/// draining a node (from the node and from `Admin`) each fail at once, saying what to do, and
/// leave nothing half done: once the space is freed, the same calls work.
#[test]
fn next_close_and_drain_fail_at_once_on_a_full_etcd_and_work_once_it_is_freed() {
    let etcd = Etcd::start_with(&[QUOTA]);
    let url = etcd.url(
        "nospace-ops",
        "min_nodes=1&max_nodes=1&lease_ttl=5&join_timeout=30&close_timeout=20",
    );
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let admin = BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    let (first, _store) = node.next().unwrap();
    fill(&etcd);
    let timed = |f: &dyn Fn() -> rdzv::Result<()>| {
        let started = Instant::now();
        let r = f();
        (started.elapsed(), r)
    };
    let calls: [(&str, &dyn Fn() -> rdzv::Result<()>); 5] = [
        ("next", &|| node.next().map(|_| ())),
        ("set_closed", &|| node.set_closed()),
        ("drain", &|| node.drain("maintenance")),
        ("Admin::close", &|| admin.close()),
        ("Admin::drain", &|| {
            admin.drain(node.node_id(), "maintenance")
        }),
    ];
    for (what, call) in calls {
        let (took, r) = timed(call);
        match r {
            Ok(()) => panic!("{what} succeeded on an etcd out of space"),
            Err(e) => refused_for_space(what, took, e),
        }
    }
    let status = admin.status().unwrap();
    assert!(!status.closed, "a refused close closed the run");
    assert!(
        status.draining().is_empty() && status.waiting.is_empty(),
        "{status:?}"
    );
    let member = status.alarms[0].member;
    free(&etcd, member);
    // The node's lease lived through it; the next round forms, and the run closes.
    let (second, _store) = node.next().unwrap();
    assert!(second.round > first.round, "{second:?} after {first:?}");
    node.set_closed().unwrap();
    assert!(admin.status().unwrap().closed);
    node.shutdown().unwrap();
}
