//! The run's store (`Rendezvous::run_store`) against a real etcd: it outlives rounds, its
//! `add` is exact across nodes, it goes with the run (deleted by the last node out and by a
//! purge, nothing written after), its waits end as a round store's do, and its `notes/` keys
//! are in the run's status, its JSON and its watch.

use crate::common;

use common::node::run_of;
use common::{on_threads, Etcd};
use rdzv::admin::{Admin, Purge};
use rdzv::{BlockingAdmin, BlockingRendezvous, ErrorKind, Params};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

fn count_under(etcd: &Etcd, prefix: &str) -> i64 {
    let (rt, mut client) = common::etcd_client(etcd);
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    rt.block_on(client.get(prefix, Some(opts))).unwrap().count()
}

/// Set in round 1, read in round 3, when round 1's own store has been deleted (the round two
/// after it formed): the run's store belongs to no round.
#[test]
fn the_run_store_outlives_the_rounds() {
    let etcd = Etcd::start();
    let url = etcd.url("run-store-rounds", "min_nodes=1&max_nodes=1");
    let member = node(&url);
    member.next().unwrap();
    let (first, round_store) = member.next().unwrap();
    assert_eq!(first.round, 1);
    let run = member.run_store().unwrap();
    assert!(run.is_run_store() && !round_store.is_run_store());
    assert_eq!(run.round(), u64::MAX, "a run store belongs to no round");
    run.set("hang/last", b"rank 3 in allreduce").unwrap();
    round_store.set("k", b"round 1").unwrap();
    assert_eq!(run.add("restarts", 1).unwrap(), 1);

    let (third, _) = {
        member.next().unwrap();
        member.next().unwrap()
    };
    assert_eq!(third.round, 3);
    let round1 = format!("/rdzv/{}/r/{:020}/", run_of(&url), 1);
    assert_eq!(count_under(&etcd, &round1), 0, "round 1 was rotated out");
    let err = round_store.get("k", None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::State, "{err}");

    assert_eq!(run.get("hang/last", None).unwrap(), b"rank 3 in allreduce");
    assert_eq!(run.add("restarts", 1).unwrap(), 2);
    // Another handle on it (as another node would take) sees the same keys.
    let again = member.run_store().unwrap();
    assert_eq!(again.get("restarts", Some(Duration::ZERO)).unwrap(), b"2");
    assert_eq!(again.num_keys().unwrap(), 2);
    assert!(again.check(&["hang/last", "restarts"]).unwrap());

    // Every value is bound to the run's lease, whose id the run's `lease` key holds.
    let (rt, mut client) = common::etcd_client(&etcd);
    let namespace = format!("/rdzv/{}/", run_of(&url));
    let lease_key = rt
        .block_on(client.get(format!("{namespace}lease"), None))
        .unwrap();
    let run_lease: i64 = lease_key.kvs()[0].value_str().unwrap().parse().unwrap();
    let values = rt
        .block_on(client.get(
            format!("{namespace}store/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ))
        .unwrap();
    assert_eq!(values.kvs().len(), 2);
    assert!(values.kvs().iter().all(|kv| kv.lease() == run_lease));
    member.shutdown().unwrap();
}

/// A job-wide budget: nodes that never formed a round together add to one counter at once;
/// every add returns a distinct running total and the sum is exact.
#[test]
fn run_store_adds_from_many_nodes_are_exact() {
    const NODES: usize = 6;
    const PER_NODE: i64 = 20;
    let etcd = Etcd::start();
    let url = etcd.url("run-store-add", "min_nodes=1");
    let nodes: Vec<Arc<BlockingRendezvous>> = on_threads(NODES, {
        let url = url.clone();
        move |_| node(&url)
    })
    .into_iter()
    .map(Arc::new)
    .collect();
    let results = on_threads(NODES, {
        let nodes = nodes.clone();
        move |i| {
            let budget = nodes[i].run_store().unwrap();
            (0..PER_NODE)
                .map(|_| budget.add("restarts", 1).unwrap())
                .collect::<Vec<i64>>()
        }
    });
    let mut all: Vec<i64> = results.into_iter().flatten().collect();
    all.sort();
    let expected: Vec<i64> = (1..=NODES as i64 * PER_NODE).collect();
    assert_eq!(all, expected, "every add returns a distinct running total");
    let store = nodes[0].run_store().unwrap();
    assert_eq!(
        store.get("restarts", None).unwrap(),
        (NODES as i64 * PER_NODE).to_string().as_bytes()
    );
    for n in &nodes {
        n.shutdown().unwrap();
    }
}

/// The last node out deletes the run's store with the rest of the run (nothing is left but,
/// for a closed run, `closed`); a store of a node that shut down refuses every call.
#[test]
fn the_last_node_out_deletes_the_run_store() {
    let etcd = Etcd::start();
    let url = etcd.url("run-store-last", "min_nodes=2&max_nodes=2");
    let namespace = format!("/rdzv/{}/", run_of(&url));
    let nodes = on_threads(2, {
        let url = url.clone();
        move |i| {
            let node = node(&url);
            let (_, round_store) = node.next().unwrap();
            round_store.set("x", b"1").unwrap();
            let run = node.run_store().unwrap();
            run.set(&format!("health/{i}"), b"ok").unwrap();
            run.set(&format!("notes/left/{i}"), b"job done").unwrap();
            (node, run)
        }
    });
    assert_eq!(count_under(&etcd, &format!("{namespace}store/")), 4);
    let mut nodes = nodes.into_iter();
    let (first, first_store) = nodes.next().unwrap();
    let (kept, kept_store) = nodes.next().unwrap();
    first.set_closed().unwrap();
    first.shutdown().unwrap();
    let err = first_store.set("after", b"1").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    assert!(err.message().contains("run store"), "{err}");
    // One node left: the run and its store stay.
    assert_eq!(kept_store.get("health/0", None).unwrap(), b"ok");
    kept.shutdown().unwrap();
    let (rt, mut client) = common::etcd_client(&etcd);
    let left = rt
        .block_on(client.get(
            namespace.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ))
        .unwrap();
    let keys: Vec<String> = left
        .kvs()
        .iter()
        .map(|kv| {
            kv.key_str()
                .unwrap()
                .trim_start_matches(&namespace)
                .to_string()
        })
        .collect();
    assert_eq!(keys, ["closed"], "the last node out leaves only `closed`");
}

/// A run gone under a live store (here purged by force, which leaves its running nodes without
/// their keys): every call fails with a state error that says so and writes nothing, and a
/// wait in progress ends with it.
#[test]
fn a_run_store_of_a_run_that_is_gone_refuses_to_write() {
    let etcd = Etcd::start();
    let url = etcd.url("run-store-gone", "min_nodes=1");
    let log = crate::records::records();
    let member = node(&url);
    let run = member.run_store().unwrap();
    run.set("before", b"1").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let operator = rt
        .block_on(Admin::connect(Params::from_url(&url).unwrap()))
        .unwrap();
    // A wait in progress when the run goes ends, instead of waiting for its timeout.
    let since = log.mark();
    let waiter = {
        let run = member.run_store().unwrap();
        std::thread::spawn(move || run.get("never-set", Some(Duration::from_secs(120))))
    };
    log.await_line(since, &run_of(&url), "missing=never-set");
    let started = Instant::now();
    assert!(matches!(
        rt.block_on(operator.purge(true)).unwrap(),
        Purge::Deleted(n) if n >= 3
    ));
    let err = waiter.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::State, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));

    let namespace = format!("/rdzv/{}/", run_of(&url));
    for (what, err) in [
        ("set", run.set("orphan", b"1").unwrap_err()),
        ("add", run.add("n", 1).unwrap_err()),
        ("compare_set", run.compare_set("c", b"", b"1").unwrap_err()),
        ("delete_key", run.delete_key("before").unwrap_err()),
        ("multi_set", run.multi_set(&["a"], &[b"1"]).unwrap_err()),
        ("get", run.get("before", None).unwrap_err()),
        ("num_keys", run.num_keys().unwrap_err()),
    ] {
        assert_eq!(err.kind(), ErrorKind::State, "{what}: {err}");
        assert!(
            err.message().starts_with("run store no longer exists"),
            "{what}: {err}"
        );
        assert!(!err.message().contains("round"), "{what}: {err}");
    }
    assert_eq!(count_under(&etcd, &namespace), 0, "nothing was written");
}

/// Waits on the run's store end as a round store's do: a key set by another node, a cancel,
/// the node shut down, the run closed with the key still missing.
#[test]
fn run_store_waits_end_as_round_store_waits_do() {
    let etcd = Etcd::start();
    let url = etcd.url("run-store-waits", "min_nodes=1");
    let (log, run) = (crate::records::records(), run_of(&url));
    let (a, b) = (node(&url), node(&url));
    let (sa, sb) = (a.run_store().unwrap(), Arc::new(b.run_store().unwrap()));
    // A wait on `key`, returned once its watch is set (its record says so): what ends it then
    // ends a wait in progress, not a call that had not started.
    let blocked = |key: &'static str| {
        let (tx, rx) = mpsc::channel();
        let store = sb.clone();
        let since = log.mark();
        std::thread::spawn(move || tx.send(store.get(key, Some(Duration::from_secs(120)))));
        log.await_line(since, &run, &format!("missing={key}"));
        rx
    };

    let set_later = blocked("late");
    sa.set("late", b"here").unwrap();
    let got = set_later.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(got.unwrap(), b"here");

    let cancelled = blocked("never-set");
    sb.cancel();
    let err = cancelled
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(err.message().starts_with("run store"), "{err}");

    // The node shut down: its store's wait ends, and so do later calls.
    let c = node(&url);
    let sc = Arc::new(c.run_store().unwrap());
    let shut = {
        let (tx, rx) = mpsc::channel();
        let store = sc.clone();
        let since = log.mark();
        std::thread::spawn(move || tx.send(store.get("never-set", None)));
        log.await_line(since, &run, "missing=never-set");
        rx
    };
    c.shutdown().unwrap();
    let err = shut
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    assert!(err.message().starts_with("run store"), "{err}");
    assert_eq!(sc.set("k", b"v").unwrap_err().kind(), ErrorKind::Shutdown);
    assert_eq!(
        c.run_store().map(|_| ()).unwrap_err().kind(),
        ErrorKind::Shutdown
    );

    let closed = blocked("never-set");
    a.set_closed().unwrap();
    let err = closed
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(err.message().contains("never-set"), "{err}");
    // Keys that exist are still readable and writable in a closed run, as in a round's store.
    sa.set("why/a", b"closed by a").unwrap();
    assert_eq!(sb.get("why/a", None).unwrap(), b"closed by a");
    b.shutdown().unwrap();
    a.shutdown().unwrap();
}

/// Keys under `notes/` are the run's notes: in the status (read with the rest of it), in its
/// JSON, and seen by the watch; the run store's other keys are not notes and wake no watcher.
#[test]
fn notes_are_in_the_status_its_json_and_its_watch() {
    let etcd = Etcd::start();
    let url = etcd.url("run-store-notes", "min_nodes=1");
    let member = node(&url);
    member.next().unwrap();
    let run = member.run_store().unwrap();
    run.set("notes/why/node-2", b"drained: preempted").unwrap();
    run.set("notes/hang", &[b'r', 0xff, b'3']).unwrap();
    run.set("restarts", b"2").unwrap();
    let operator = BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    let status = operator.status().unwrap();
    let notes: Vec<(&str, &str)> = status
        .notes
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        notes,
        [("hang", "r\u{fffd}3"), ("why/node-2", "drained: preempted")],
        "notes in key order, invalid UTF-8 replaced, other keys left out"
    );
    let json = status.to_json();
    assert_eq!(json["notes"]["why/node-2"], "drained: preempted");
    assert_eq!(json["notes"].as_object().unwrap().len(), 2);

    // The watch: the first status, then nothing for a write outside the notes, then the note.
    let first = operator.watch_next(Duration::from_secs(30)).unwrap();
    assert_eq!(first.notes.len(), 2);
    run.set("restarts", b"3").unwrap();
    let quiet = operator.watch_next(Duration::from_millis(800)).unwrap_err();
    assert_eq!(quiet.kind(), ErrorKind::Timeout, "{quiet}");
    run.set("notes/hang", b"rank 5 in allreduce").unwrap();
    let changed = operator.watch_next(Duration::from_secs(30)).unwrap();
    assert_eq!(changed.notes["hang"], "rank 5 in allreduce");
    assert!(run.delete_key("notes/hang").unwrap());
    let removed = operator.watch_next(Duration::from_secs(30)).unwrap();
    assert!(!removed.notes.contains_key("hang"));
    member.shutdown().unwrap();
    assert!(
        operator.status().unwrap().notes.is_empty(),
        "gone with the run"
    );
}
