//! The operator module (`rdzv::admin`) against a real etcd: status of absent, forming, running
//! and broken runs, the watch, close and purge.

use crate::common;

use common::Etcd;
use rdzv::admin::{Admin, Purge, RunStatus};
use rdzv::{BlockingRendezvous, ErrorKind, Params};
use std::time::Duration;

/// A runtime that keeps running between calls: the library shares one etcd connection per
/// process, and the connection made here also serves the blocking nodes of the test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn admin(rt: &tokio::runtime::Runtime, url: &str) -> Admin {
    rt.block_on(Admin::connect(Params::from_url(url).unwrap()))
        .unwrap()
}

/// `n` nodes that complete round 0 together; returned in rank order.
fn formed(url: &str, n: usize) -> Vec<BlockingRendezvous> {
    let url = url.to_string();
    let mut nodes = common::on_threads(n, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        let (info, _store) = node.next().unwrap();
        (info.rank, node)
    });
    nodes.sort_by_key(|(rank, _)| *rank);
    nodes.into_iter().map(|(_, node)| node).collect()
}

#[test]
fn a_run_that_never_started_is_absent() {
    let etcd = Etcd::start();
    let rt = runtime();
    let a = admin(&rt, &etcd.url("absent", ""));
    let s = rt.block_on(a.status()).unwrap();
    assert!(!s.exists && !s.closed && s.sealed.is_none() && s.waiting.is_empty());
    assert_eq!(s.to_json()["exists"], false);
}

#[test]
fn status_lists_members_in_rank_order_then_waiting_and_lost_nodes() {
    let etcd = Etcd::start();
    let rt = runtime();
    let url = etcd.url("members", "min_nodes=2&max_nodes=2&last_call_timeout=1");
    let nodes = formed(&url, 2);
    let a = admin(&rt, &url);
    let s = rt.block_on(a.status()).unwrap();
    let sealed = s.sealed.as_ref().expect("round 0 is sealed");
    assert_eq!((sealed.round, s.open_round), (0, 1));
    let ids: Vec<&str> = sealed.members.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(ids, [nodes[0].node_id(), nodes[1].node_id()]);
    assert!(sealed.members.iter().all(|m| m.alive && m.addr.is_some()));
    assert_eq!(s.alive, 2);

    // A third node arrives while the round runs: it waits for round 1.
    let late_url = url.clone();
    let late = std::thread::spawn(move || {
        let node = BlockingRendezvous::new(Params::from_url(&late_url).unwrap()).unwrap();
        let result = node.next().map(|(info, _)| info.round);
        (node.node_id().to_string(), result)
    });
    let mut watch = a.watch();
    let waiting = rt.block_on(async {
        loop {
            let s = watch.next().await.unwrap();
            if let Some(j) = s.waiting.first() {
                return j.clone();
            }
        }
    });
    assert_eq!(waiting.member_rank, None, "a newcomer, not a member");

    // Rank 1 leaves: it is lost for the round it ran in.
    nodes[1].shutdown().unwrap();
    let s = rt.block_on(a.status()).unwrap();
    let lost: Vec<u32> = s.lost().iter().map(|m| m.rank).collect();
    assert_eq!(lost, [1]);
    assert_eq!(s.to_json()["lost"][0]["rank"], 1);

    rt.block_on(a.close()).unwrap();
    let (late_id, late_result) = late.join().unwrap();
    assert_eq!(late_id, waiting.node);
    assert_eq!(late_result.unwrap_err().kind(), ErrorKind::GracefulExit);
}

#[test]
fn the_watch_reports_a_seal_and_a_close_as_they_happen() {
    let etcd = Etcd::start();
    let rt = runtime();
    let url = etcd.url("watch", "min_nodes=2&max_nodes=2");
    let a = admin(&rt, &url);
    let mut watch = a.watch();
    let first = rt.block_on(watch.next()).unwrap();
    assert!(!first.exists);
    let join_url = url.clone();
    let nodes = std::thread::spawn(move || formed(&join_url, 2));
    let sealed = rt.block_on(async {
        loop {
            let s = tokio::time::timeout(Duration::from_secs(30), watch.next())
                .await
                .expect("a change within 30 s")
                .unwrap();
            if s.sealed.is_some() {
                return s;
            }
        }
    });
    assert_eq!(sealed.sealed.unwrap().members.len(), 2);
    let nodes = nodes.join().unwrap();
    rt.block_on(a.close()).unwrap();
    let closed = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .unwrap()
            .unwrap()
    });
    assert!(closed.closed);
    assert!(nodes[0].is_closed().unwrap());
}

/// Waits (at most 30 s) for a status from `watch` that `done` accepts, then checks that it is
/// what a fresh read of etcd says: the watch builds its status from the events it is sent,
/// `status` from a read, and nothing changes in between.
fn settled(
    rt: &tokio::runtime::Runtime,
    watch: &mut rdzv::admin::StatusWatch,
    a: &Admin,
    what: &str,
    done: impl Fn(&RunStatus) -> bool,
) -> RunStatus {
    let seen = rt.block_on(async {
        loop {
            let s = tokio::time::timeout(Duration::from_secs(30), watch.next())
                .await
                .unwrap_or_else(|_| panic!("no status with {what} within 30 s"))
                .unwrap();
            if done(&s) {
                return s;
            }
        }
    });
    let read = rt.block_on(a.status()).unwrap();
    assert!(read.revision >= seen.revision, "{what}");
    let unrevised = |s: &RunStatus| RunStatus {
        revision: 0,
        ..s.clone()
    };
    assert_eq!(
        unrevised(&seen),
        unrevised(&read),
        "{what}: the watch's status against a read"
    );
    seen
}

/// The watch keeps its status from events (it reads etcd only when it opens): at each step of a
/// run's life it shows what a fresh read shows, across an etcd restart that breaks the watch,
/// and after the run is purged and begun again from round 0.
#[test]
fn the_watch_shows_what_a_read_shows_through_a_runs_life() {
    let mut etcd = Etcd::start();
    let rt = runtime();
    let url = etcd.url("view", "min_nodes=2&max_nodes=2&last_call_timeout=1");
    let a = admin(&rt, &url);
    let mut watch = a.watch();
    settled(&rt, &mut watch, &a, "no run", |s| !s.exists);

    let nodes = formed(&url, 2);
    let s = settled(&rt, &mut watch, &a, "round 0 sealed", |s| {
        s.sealed
            .as_ref()
            .is_some_and(|r| r.members.iter().all(|m| m.alive))
    });
    assert_eq!(s.sealed.unwrap().members.len(), 2);

    // A newcomer waits for round 1.
    let late_url = url.clone();
    let late = std::thread::spawn(move || {
        let node = BlockingRendezvous::new(Params::from_url(&late_url).unwrap()).unwrap();
        node.next().map(|(info, _)| info.round)
    });
    settled(&rt, &mut watch, &a, "a waiting node", |s| {
        s.waiting.len() == 1
    });

    // etcd restarts: the watch breaks, is opened again and reads afresh.
    etcd.restart();
    nodes[0]
        .run_store()
        .unwrap()
        .set("notes/why", b"after a restart")
        .unwrap();
    settled(&rt, &mut watch, &a, "a note", |s| {
        s.notes.contains_key("why")
    });

    rt.block_on(a.drain(nodes[1].node_id(), "maintenance"))
        .unwrap();
    settled(&rt, &mut watch, &a, "a drained member", |s| {
        s.draining().len() == 1
    });
    nodes[0].shutdown().unwrap();
    settled(&rt, &mut watch, &a, "a lost member", |s| {
        s.lost().len() == 1
    });
    rt.block_on(a.close()).unwrap();
    // The waiting node withdraws its join as its `next` ends: compared once it has.
    assert_eq!(
        late.join().unwrap().unwrap_err().kind(),
        ErrorKind::GracefulExit
    );
    settled(&rt, &mut watch, &a, "closed", |s| {
        s.closed && s.waiting.is_empty()
    });

    // Purged while a node is alive, and begun again from round 0.
    assert!(matches!(
        rt.block_on(a.purge(true)).unwrap(),
        Purge::Deleted(_)
    ));
    settled(&rt, &mut watch, &a, "purged", |s| {
        !s.closed && s.open_round == 0
    });
    let again = formed(&url, 2);
    let s = settled(&rt, &mut watch, &a, "round 0 sealed again", |s| {
        s.sealed
            .as_ref()
            .is_some_and(|r| r.members.iter().all(|m| m.alive))
    });
    let ids: Vec<&str> = s
        .sealed
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| m.node.as_str())
        .collect();
    assert_eq!(ids, [again[0].node_id(), again[1].node_id()]);
}

#[test]
fn purge_refuses_a_running_job_whose_alive_keys_another_client_deleted() {
    let etcd = Etcd::start();
    let rt = runtime();
    let url = etcd.url("purge-alive-gone", "min_nodes=1&max_nodes=1");
    let a = admin(&rt, &url);
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let (_, store) = node.next().unwrap();
    let (crt, mut client) = common::etcd_client(&etcd);
    let run = common::node::run_of(&url);
    let opts = etcd_client::DeleteOptions::new().with_prefix();
    let gone = crt
        .block_on(client.delete(format!("/rdzv/{run}/alive/"), Some(opts)))
        .unwrap();
    assert!(gone.deleted() >= 1);
    // No alive key left, but the run's lease is refreshed: the job runs, nothing is deleted.
    assert_eq!(
        rt.block_on(a.purge(false)).unwrap(),
        Purge::Refused {
            alive: 0,
            lease_live: true
        }
    );
    store.set("still", b"here").unwrap();
    assert_eq!(store.get("still", None).unwrap(), b"here");
    node.shutdown().unwrap();
}

#[test]
fn purge_refuses_while_a_node_is_alive_and_deletes_what_a_crash_left() {
    let etcd = Etcd::start();
    let rt = runtime();
    let url = etcd.url("purge", "");
    let a = admin(&rt, &url);
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    assert!(matches!(
        rt.block_on(a.purge(false)).unwrap(),
        Purge::Refused { alive: 1, .. }
    ));
    node.shutdown().unwrap();

    // What a run whose nodes all crashed leaves: a round counter nobody will delete.
    let (crt, mut client) = common::etcd_client(&etcd);
    let run = common::node::run_of(&url);
    crt.block_on(client.put(format!("/rdzv/{run}/current"), "3", None))
        .unwrap();
    let s = rt.block_on(a.status()).unwrap();
    assert!(s.exists && s.open_round == 3);
    assert_eq!(rt.block_on(a.purge(false)).unwrap(), Purge::Deleted(1));
    assert!(!rt.block_on(a.status()).unwrap().exists);

    // --force deletes under a live node too.
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    assert!(matches!(rt.block_on(a.purge(true)).unwrap(), Purge::Deleted(n) if n >= 1));
    drop(node);
}

#[test]
fn every_run_on_one_etcd_is_listed_and_read_on_one_connection() {
    let etcd = Etcd::start();
    let rt = runtime();
    // Run ids that need escaping come back as they were; another key prefix is not listed.
    let runs = ["job/a", "job b", "job-c"];
    let urls: Vec<String> = runs
        .iter()
        .map(|run| {
            let url = etcd.url("x", "min_nodes=1&max_nodes=1");
            let at = url.rfind('/').unwrap() + 1;
            let end = url[at..].find('?').map_or(url.len(), |q| at + q);
            let escaped: String = run.replace('/', "%2F").replace(' ', "%20");
            format!("{}{escaped}{}", &url[..at], &url[end..])
        })
        .collect();
    let nodes: Vec<BlockingRendezvous> = urls.iter().map(|u| formed(u, 1).remove(0)).collect();
    let elsewhere = etcd.url("other", "min_nodes=1&max_nodes=1&key_prefix=/elsewhere");
    let _other = formed(&elsewhere, 1);
    let a = admin(&rt, &urls[0]);
    let mut listed = rt.block_on(a.runs(100)).unwrap();
    listed.sort();
    let mut want: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
    want.sort();
    assert_eq!(listed, want);
    assert_eq!(
        rt.block_on(a.runs(2)).unwrap().len(),
        2,
        "at most the limit"
    );
    for (run, node) in runs.iter().zip(&nodes) {
        let s = rt.block_on(a.for_run(run).unwrap().status()).unwrap();
        assert_eq!(s.run_id, *run);
        let sealed = s.sealed.expect("its round is sealed");
        assert_eq!(sealed.members[0].node, node.node_id());
    }
    let bad = a.for_run("").err().expect("an empty run id is refused");
    assert_eq!(bad.kind(), ErrorKind::InvalidArgument, "{bad:?}");
}
