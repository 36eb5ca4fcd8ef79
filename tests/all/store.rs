//! Store semantics (c10d-style) against a real etcd.

use crate::common;

use common::{on_threads, Etcd};
use rdzv::{BlockingRendezvous, BlockingStore, ErrorKind, Params};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn round_stores(etcd: &Etcd, n: usize) -> Vec<BlockingStore> {
    let url = etcd.url("store", &format!("min_nodes={n}&max_nodes={n}"));
    on_threads(n, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        let (_, store) = node.next().unwrap();
        std::mem::forget(node); // keep the member alive for the rest of the test
        store
    })
}

#[test]
fn set_get_check_delete_and_count() {
    let etcd = Etcd::start();
    let s = round_stores(&etcd, 1).pop().unwrap();
    assert_eq!(s.num_keys().unwrap(), 0);
    s.set("a", b"1").unwrap();
    s.set("bin", &[0, 255, 10]).unwrap();
    assert_eq!(s.get("a", None).unwrap(), b"1");
    assert_eq!(s.get("bin", None).unwrap(), vec![0, 255, 10]);
    assert!(s.check(&["a", "bin"]).unwrap());
    assert!(!s.check(&["a", "missing"]).unwrap());
    assert_eq!(s.num_keys().unwrap(), 2);
    assert!(s.delete_key("a").unwrap());
    assert!(!s.delete_key("a").unwrap());
    assert_eq!(s.num_keys().unwrap(), 1);
    s.multi_set(&["x", "y"], &[b"X", b""]).unwrap();
    assert_eq!(
        s.multi_get(&["x", "y"], None).unwrap(),
        vec![b"X".to_vec(), Vec::new()]
    );
}

#[test]
fn get_waits_for_a_key_set_by_another_node_and_times_out_otherwise() {
    let etcd = Etcd::start();
    let mut stores = round_stores(&etcd, 2);
    let (a, b) = (stores.pop().unwrap(), stores.pop().unwrap());
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        tx.send(()).unwrap();
        b.get("late", Some(Duration::from_secs(20))).unwrap()
    });
    rx.recv().unwrap();
    a.set("late", b"here").unwrap();
    assert_eq!(t.join().unwrap(), b"here");

    let started = Instant::now();
    let err = a
        .get("never", Some(Duration::from_millis(300)))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("never"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        a.wait(&["late", "never"], Some(Duration::ZERO))
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
}

#[test]
fn compare_set_follows_c10d() {
    let etcd = Etcd::start();
    let s = round_stores(&etcd, 1).pop().unwrap();
    // Absent key, non-empty expected: returns expected, changes nothing.
    assert_eq!(s.compare_set("k", b"old", b"new").unwrap(), b"old");
    assert!(!s.check(&["k"]).unwrap());
    // Absent key, empty expected: sets.
    assert_eq!(s.compare_set("k", b"", b"v1").unwrap(), b"v1");
    // Wrong expectation: returns the current value.
    assert_eq!(s.compare_set("k", b"nope", b"v2").unwrap(), b"v1");
    assert_eq!(s.compare_set("k", b"v1", b"v2").unwrap(), b"v2");
    assert_eq!(s.get("k", None).unwrap(), b"v2");
}

#[test]
fn concurrent_adds_from_many_nodes_are_exact() {
    let etcd = Etcd::start();
    let stores: Vec<Arc<BlockingStore>> =
        round_stores(&etcd, 8).into_iter().map(Arc::new).collect();
    let per_node = 25;
    let results = on_threads(8, {
        let stores = stores.clone();
        move |i| {
            (0..per_node)
                .map(|_| stores[i].add("counter", 3).unwrap())
                .collect::<Vec<i64>>()
        }
    });
    let mut all: Vec<i64> = results.into_iter().flatten().collect();
    all.sort();
    let expected: Vec<i64> = (1..=8 * per_node as i64).map(|k| 3 * k).collect();
    assert_eq!(
        all, expected,
        "every add must return a distinct running total"
    );
    assert_eq!(
        stores[0].get("counter", None).unwrap(),
        (3 * 8 * per_node).to_string().as_bytes()
    );
    assert_eq!(
        stores[0]
            .add("counter", -(3 * 8 * per_node as i64))
            .unwrap(),
        0
    );
}

#[test]
fn bad_store_input_is_rejected_clearly() {
    let etcd = Etcd::start();
    let s = round_stores(&etcd, 1).pop().unwrap();
    assert_eq!(
        s.set("", b"x").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let long_key = "k".repeat(5000);
    assert_eq!(
        s.set(&long_key, b"x").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let huge = vec![0u8; 2 * 1024 * 1024];
    let err = s.set("big", &huge).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message().contains("big") && err.message().contains("bytes"),
        "{err}"
    );
    s.set("text", b"abc").unwrap();
    assert_eq!(
        s.add("text", 1).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.multi_set(&["a"], &[]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(s.num_keys().unwrap(), 1, "failed calls change nothing");
}

#[test]
fn stores_are_scoped_to_their_round() {
    let etcd = Etcd::start();
    let url = etcd.url("scope", "min_nodes=1&max_nodes=1");
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let (r0, s0) = node.next().unwrap();
    s0.set("k", b"round0").unwrap();
    let (r1, s1) = node.next().unwrap();
    assert_eq!(r1.round, r0.round + 1);
    assert!(
        !s1.check(&["k"]).unwrap(),
        "a new round starts with an empty store"
    );
    s1.set("k", b"round1").unwrap();
    assert_eq!(s0.get("k", None).unwrap(), b"round0");
}

/// etcd refuses a transaction of more than 128 operations (`--max-txn-ops`): a torch agent's
/// `multi_get` and `multi_set` over a world of 300 nodes, and a wait for 300 keys, take
/// several. Every key is read and written, in order, and the wait ends when the last key it
/// waits for is set by another node.
#[test]
fn calls_over_more_keys_than_etcd_takes_in_one_transaction() {
    const N: usize = 300;
    let etcd = Etcd::start();
    let mut stores = round_stores(&etcd, 2);
    let (a, b) = (stores.pop().unwrap(), stores.pop().unwrap());
    let keys: Vec<String> = (0..N).map(|i| format!("role_info/{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = (0..N).map(|i| format!("v{i}").into_bytes()).collect();
    let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();

    // All but the last key; the wait for every key must still be waiting for it.
    a.multi_set(&keys[..N - 1], &value_refs[..N - 1]).unwrap();
    assert!(!b.check(&keys).unwrap(), "the last key is not set yet");
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        std::thread::spawn(move || {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            tx.send(()).unwrap();
            b.multi_get(&keys, Some(Duration::from_secs(30)))
        })
    };
    rx.recv().unwrap();
    a.set(keys[N - 1], &values[N - 1]).unwrap();
    let got = waiter
        .join()
        .unwrap()
        .expect("every key, once the last is set");
    assert_eq!(got, values);
    assert!(a.check(&keys).unwrap());
    assert_eq!(a.num_keys().unwrap(), N as i64);
}

/// A read of more keys than one transaction takes reads its later transactions at the first
/// one's revision (one snapshot). A shared etcd compacts its history on a schedule; when it
/// compacted past that revision in between, the read failed with etcd's "required revision
/// has been compacted". It now reads again at a fresh revision. Here another client writes
/// and compacts to its newest revision as fast as it can while the store reads.
#[test]
fn a_read_over_many_keys_survives_compaction_between_its_transactions() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const N: usize = 300;
    const READS: usize = 50;
    let etcd = Etcd::start();
    let store = round_stores(&etcd, 1).pop().unwrap();
    let keys: Vec<String> = (0..N).map(|i| format!("role_info/{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = (0..N).map(|i| format!("v{i}").into_bytes()).collect();
    let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    store.multi_set(&keys, &value_refs).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let compactions = Arc::new(AtomicU64::new(0));
    let compactor = {
        let (rt, mut client) = common::etcd_client(&etcd);
        let (stop, compactions) = (stop.clone(), compactions.clone());
        std::thread::spawn(move || {
            rt.block_on(async {
                while !stop.load(Ordering::Relaxed) {
                    let put = client.put("churn", "x", None).await.unwrap();
                    let revision = put.header().unwrap().revision();
                    client.compact(revision, None).await.unwrap();
                    compactions.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
    };
    let reads: Vec<rdzv::Result<Vec<Vec<u8>>>> = (0..READS)
        .map(|_| store.multi_get(&keys, Some(Duration::from_secs(30))))
        .collect();
    stop.store(true, Ordering::Relaxed);
    compactor.join().unwrap();
    let failed: Vec<String> = reads
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.message().to_string()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {READS} reads failed, first: {:?}",
        failed.len(),
        failed.first()
    );
    assert!(reads.iter().all(|r| r.as_ref().unwrap() == &values));
    assert!(
        compactions.load(Ordering::Relaxed) >= READS as u64 / 5,
        "the history was compacted only {} times during the reads",
        compactions.load(Ordering::Relaxed)
    );
}

/// An add whose answer is lost after etcd applied it (the connection cut as the answer
/// comes, as when a member fails right after a write) is sent again by the library; it must
/// still count once. A barrier that counts its arrivals with `add` would pass a node early.
#[test]
fn an_add_whose_answer_is_lost_counts_once() {
    let etcd = Etcd::start();
    let url = etcd.url("lost-add", "min_nodes=1&max_nodes=1");
    // The add's guard: no other request compares this key's modification revision. The
    // round is 0: the run is new.
    let key = format!(
        "/rdzv/{}/r/{:020}/store/arrived",
        common::node::run_of(&url),
        0
    );
    let guard = common::SlowProxy::compare_on(2, &key);
    let proxy = common::SlowProxy::lose_answer_to(etcd.client_port, guard);
    let cut_url = url.replace(&etcd.endpoint(), &proxy.endpoint());
    let node = BlockingRendezvous::new(Params::from_url(&cut_url).unwrap()).unwrap();
    let (_, store) = node.next().unwrap();
    assert_eq!(store.add("arrived", 1).unwrap(), 1);
    assert!(proxy.answer_lost(), "the add's answer was not lost");
    assert_eq!(
        store.get("arrived", None).unwrap(),
        b"1",
        "the add counted twice"
    );
    assert_eq!(store.add("arrived", 1).unwrap(), 2);
    assert_eq!(
        store.num_keys().unwrap(),
        1,
        "the store shows more than its key"
    );
    // Each add deletes the receipts of those before it; the run's end deletes the last.
    let receipts = format!("/rdzv/{}/adds/", common::node::run_of(&url));
    let count = || {
        let (rt, mut client) = common::etcd_client(&etcd);
        let only_count = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        rt.block_on(client.get(receipts.as_str(), Some(only_count)))
            .unwrap()
            .count()
    };
    assert_eq!(count(), 1, "receipts of answered adds were kept");
    // A later round's store deletes the receipt of the round before.
    let (_, next_store) = node.next().unwrap();
    assert_eq!(next_store.add("arrived", 5).unwrap(), 5);
    assert_eq!(count(), 1, "a round left its add's receipt behind");
    // A node's last receipt stays while the run goes on (here with another node), and goes
    // with the run.
    let other = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    node.shutdown().unwrap();
    assert_eq!(count(), 1, "receipts of answered adds were kept");
    other.set_closed().unwrap();
    other.shutdown().unwrap();
    assert_eq!(count(), 0, "a receipt outlived its run");
}
