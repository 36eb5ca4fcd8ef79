//! Faults and churn against a real etcd: etcd restarts under a blocked store read, history
//! compaction under waiting nodes, and many rounds in a row.

use crate::common;

use common::{on_threads, Etcd};
use rdzv::{BlockingRendezvous, Params};
use std::collections::BTreeSet;
use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

#[test]
fn a_blocked_get_survives_an_etcd_restart() {
    let mut etcd = Etcd::start();
    let url = etcd.url("get-restart", "min_nodes=2&max_nodes=2");
    let mut pairs = on_threads(2, {
        let url = url.clone();
        move |_| {
            let n = node(&url);
            let (info, store) = n.next().unwrap();
            (n, info, store)
        }
    });
    let (writer_node, _, writer) = pairs.pop().unwrap();
    let (reader_node, _, reader) = pairs.pop().unwrap();
    let (started_tx, started) = mpsc::channel();
    let t = std::thread::spawn(move || {
        started_tx.send(()).unwrap();
        reader.get("after-restart", Some(Duration::from_secs(60)))
    });
    started.recv().unwrap();
    etcd.restart();
    writer.set("after-restart", b"value").unwrap();
    assert_eq!(t.join().unwrap().unwrap(), b"value");
    drop((writer_node, reader_node));
}

#[test]
fn compacting_history_under_waiting_nodes_does_not_lose_the_round() {
    let etcd = Etcd::start();
    let url = etcd.url("compact", "min_nodes=3&max_nodes=3");
    let run = common::node::run_of(&url);
    let early = on_threads(2, {
        let url = url.clone();
        move |_| {
            let n = node(&url);
            std::thread::spawn(move || n.next().map(|(info, _)| info))
        }
    });
    // Both early nodes are in the round (its leader exists and they wait); compact everything.
    common::wait_for_leader(&etcd.endpoint(), &format!("/rdzv/{run}/"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .unwrap();
        let rev = c.get("/", None).await.unwrap().header().unwrap().revision();
        let opts = etcd_client::CompactionOptions::new().with_physical();
        c.compact(rev, Some(opts)).await.unwrap();
    });
    let last = node(&url).next().unwrap().0;
    let mut infos: Vec<_> = early
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    infos.push(last);
    let ranks: BTreeSet<u32> = infos.iter().map(|i| i.rank).collect();
    assert_eq!(ranks, (0..3).collect());
}

#[test]
fn a_hundred_rounds_in_a_row_keep_ranks_unique_and_agreed() {
    let etcd = Etcd::start();
    let url = etcd.url("churn", "min_nodes=3&max_nodes=3");
    let n = 3;
    let rounds = 100;
    let barrier = Arc::new(Barrier::new(n));
    let results = on_threads(n, move |_| {
        let me = node(&url);
        let mut seen = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let (info, _) = me.next().unwrap();
            seen.push((info.round, info.rank, info.world_size, info.master_port));
            barrier.wait(); // everyone has its answer before anyone rejoins
        }
        seen
    });
    for r in 0..rounds {
        let round: Vec<_> = results.iter().map(|s| s[r]).collect();
        let ranks: BTreeSet<u32> = round.iter().map(|x| x.1).collect();
        assert_eq!(ranks, (0..n as u32).collect(), "round {r}: {round:?}");
        assert!(
            round
                .iter()
                .all(|x| x.0 == round[0].0 && x.2 == 3 && x.3 == round[0].3),
            "round {r}: {round:?}"
        );
        assert_eq!(round[0].0, r as u64, "rounds are numbered consecutively");
        if r > 0 {
            // Everyone survived, so everyone keeps its rank.
            let before: Vec<u32> = results.iter().map(|s| s[r - 1].1).collect();
            let now: Vec<u32> = results.iter().map(|s| s[r].1).collect();
            assert_eq!(before, now, "round {r}: ranks must be stable");
        }
    }
}

#[test]
fn an_etcd_restart_between_rounds_loses_no_round_and_no_store_value() {
    let mut etcd = Etcd::start();
    let url = etcd.url("restart-complete", "min_nodes=2&max_nodes=2");
    let barrier = Arc::new(Barrier::new(2));
    let (restart_tx, restart_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let restart_tx = Arc::new(std::sync::Mutex::new(Some(restart_tx)));
    let done_rx = Arc::new(std::sync::Mutex::new(done_rx));
    let workers = {
        let url = url.clone();
        let barrier = barrier.clone();
        (0..2)
            .map(|_| {
                let (url, barrier, restart_tx, done_rx) = (
                    url.clone(),
                    barrier.clone(),
                    restart_tx.clone(),
                    done_rx.clone(),
                );
                std::thread::spawn(move || {
                    let me = node(&url);
                    let (first, store) = me.next().unwrap();
                    store.set(&format!("from/{}", first.rank), b"kept").unwrap();
                    // Both wrote; one asks the test to restart etcd, both wait for it.
                    if barrier.wait().is_leader() {
                        restart_tx.lock().unwrap().take().unwrap().send(()).unwrap();
                        done_rx.lock().unwrap().recv().unwrap();
                    }
                    barrier.wait();
                    let other = 1 - first.rank;
                    let kept = store
                        .get(&format!("from/{other}"), Some(Duration::from_secs(30)))
                        .unwrap();
                    let (second, _) = me.next().unwrap();
                    (first, second, kept)
                })
            })
            .collect::<Vec<_>>()
    };
    restart_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    etcd.restart();
    done_tx.send(()).unwrap();
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for (first, second, kept) in &results {
        assert_eq!(kept, b"kept", "store values survive the restart");
        assert_eq!(first.round, 0);
        assert_eq!(
            second.round, 1,
            "no round lost or duplicated across the restart"
        );
        assert_eq!(second.rank, first.rank, "ranks stay stable");
    }
}
