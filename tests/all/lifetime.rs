//! How long things live: store waits end when they can no longer succeed (run closed, node
//! shut down, cancelled), a store whose round was deleted refuses to write, a finished run
//! leaves nothing in etcd, a refused connection is reported at once, and the handles of one
//! process share one connection, even when created at once. Real etcd.

use crate::common;

use common::node::{run_of, Node};
use common::Etcd;
use rdzv::{BlockingRendezvous, BlockingStore, ErrorKind, Params};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn node(url: &str) -> BlockingRendezvous {
    node_result(url).unwrap()
}

fn node_result(url: &str) -> rdzv::Result<BlockingRendezvous> {
    BlockingRendezvous::new(Params::from_url(url).unwrap())
}

fn count_under(etcd: &Etcd, prefix: &str) -> i64 {
    let (rt, mut client) = common::etcd_client(etcd);
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    rt.block_on(client.get(prefix, Some(opts))).unwrap().count()
}

/// Runs a store `get` of a key nobody sets on another thread (default timeout 300 s).
fn blocked_get(store: &Arc<BlockingStore>) -> mpsc::Receiver<rdzv::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    let store = store.clone();
    std::thread::spawn(move || tx.send(store.get("never-set", None)));
    rx
}

#[test]
fn closing_the_run_ends_store_waits_with_closed() {
    let etcd = Etcd::start();
    let url = etcd.url("store-close", "min_nodes=1");
    let member = node(&url);
    let store = Arc::new(member.next().unwrap().1);
    let started = Instant::now();
    let rx = blocked_get(&store);
    node(&url).set_closed().unwrap();
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the get outlived the run")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(err.message().contains("never-set"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Keys that exist are still readable from a closed run.
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k", None).unwrap(), b"v");
}

#[test]
fn shutting_the_node_down_ends_store_waits_and_later_calls() {
    let etcd = Etcd::start();
    let url = etcd.url("store-shutdown", "min_nodes=1");
    let member = Arc::new(node(&url));
    let store = Arc::new(member.next().unwrap().1);
    let rx = blocked_get(&store);
    member.shutdown().unwrap();
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the get outlived its node")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    let err = store.set("k", b"v").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
}

#[test]
fn cancel_ends_a_store_wait_and_the_store_stays_usable() {
    let etcd = Etcd::start();
    let url = etcd.url("store-cancel", "min_nodes=1");
    let member = node(&url);
    let store = Arc::new(member.next().unwrap().1);
    let rx = blocked_get(&store);
    // Once: a cancel made before the wait began ends it as soon as it starts.
    store.cancel();
    let result = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the cancelled get kept waiting");
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Cancelled);
    store.set("after", b"1").unwrap();
    assert_eq!(store.get("after", Some(Duration::ZERO)).unwrap(), b"1");
    // The cancel was used up: a wait that starts now waits (and times out).
    let err = store
        .get("never-set", Some(Duration::from_millis(300)))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}

/// A store's cancel made while no wait runs is kept for the next wait to start, which ends at
/// once, whichever of the three it is; the wait after it runs normally.
#[test]
fn a_store_cancel_made_before_a_wait_ends_the_next_wait() {
    let etcd = Etcd::start();
    let url = etcd.url("store-cancel-before", "min_nodes=1");
    let member = node(&url);
    let (_, store) = member.next().unwrap();
    store.set("here", b"v").unwrap();
    let long = Some(Duration::from_secs(60));
    for what in ["get", "wait", "multi_get"] {
        store.cancel();
        let started = Instant::now();
        let err = match what {
            "get" => store.get("here", long).map(|_| ()),
            "wait" => store.wait(&["never-set"], long),
            _ => store.multi_get(&["here", "never-set"], long).map(|_| ()),
        }
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{what}: {err}");
        assert!(started.elapsed() < Duration::from_secs(3), "{what}");
        assert_eq!(store.get("here", long).unwrap(), b"v", "after {what}");
    }
}

/// A cancel made after a store wait is called, before its future is first polled, ends it
/// (see `a_cancel_made_before_next_is_first_polled_is_not_lost`).
#[test]
fn a_cancel_made_before_a_store_wait_is_first_polled_is_not_lost() {
    let etcd = Etcd::start();
    let url = etcd.url("store-cancel-early", "min_nodes=1");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let member = rt
        .block_on(rdzv::Rendezvous::new(Params::from_url(&url).unwrap()))
        .unwrap();
    let (_, store) = rt.block_on(member.next()).unwrap();
    let forever = Some(Duration::from_secs(3600));
    let keys = ["never-set"];
    for what in ["get", "wait", "multi_get"] {
        // Each call is made here; its future is first polled below, after the cancel.
        let wait: std::pin::Pin<Box<dyn std::future::Future<Output = rdzv::Result<()>>>> =
            match what {
                "get" => {
                    let call = store.get("never-set", forever);
                    Box::pin(async move { call.await.map(|_| ()) })
                }
                "wait" => Box::pin(store.wait(&keys, forever)),
                _ => {
                    let call = store.multi_get(&keys, forever);
                    Box::pin(async move { call.await.map(|_| ()) })
                }
            };
        store.cancel();
        let got = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), wait).await })
            .unwrap_or_else(|_| panic!("{what}: cancelled before its first poll, it kept waiting"));
        assert_eq!(got.unwrap_err().kind(), ErrorKind::Cancelled, "{what}");
    }
    rt.block_on(store.set("after", b"1")).unwrap();
    assert_eq!(rt.block_on(store.get("after", None)).unwrap(), b"1");
}

#[test]
fn a_store_whose_round_was_deleted_refuses_to_write() {
    let etcd = Etcd::start();
    let url = etcd.url("store-gone", "min_nodes=1");
    let member = node(&url);
    let (first, old) = member.next().unwrap();
    old.set("before", b"1").unwrap();
    // Round 0's data is deleted when round 2 forms.
    member.next().unwrap();
    member.next().unwrap();
    let store0 = format!("/rdzv/{}/r/{:020}/", run_of(&url), first.round);
    assert_eq!(count_under(&etcd, &store0), 0, "round 0 was rotated out");
    for (what, err) in [
        ("set", old.set("orphan", b"1").unwrap_err()),
        ("add", old.add("n", 1).unwrap_err()),
        ("get", old.get("before", None).unwrap_err()),
        ("multi_set", old.multi_set(&["a"], &[b"1"]).unwrap_err()),
    ] {
        assert_eq!(err.kind(), ErrorKind::State, "{what}: {err}");
        assert!(err.message().contains("no longer exists"), "{what}: {err}");
    }
    assert_eq!(count_under(&etcd, &store0), 0, "nothing was written");
}

#[test]
fn a_finished_run_leaves_nothing_and_its_id_starts_over() {
    let etcd = Etcd::start();
    let url = etcd.url("finished", "min_nodes=2&max_nodes=2");
    let run = format!("/rdzv/{}/", run_of(&url));
    let nodes: Vec<Node> = (0..2).map(|_| Node::spawn(&url, &["--exchange"])).collect();
    for n in nodes {
        assert_eq!(n.round(30)["round"], 0);
        assert_eq!(n.finish(30), 0);
    }
    assert_eq!(count_under(&etcd, &run), 0, "a finished job leaves no keys");
    // The same id again is a new job: round 0, fresh store.
    let again: Vec<Node> = (0..2).map(|_| Node::spawn(&url, &["--exchange"])).collect();
    for n in again {
        let round = n.round(30);
        assert_eq!(
            (
                round["round"].as_u64(),
                round["add_result"].as_i64().map(|v| v <= 2)
            ),
            (Some(0), Some(true))
        );
        assert_eq!(n.finish(30), 0);
    }
}

#[test]
fn a_closed_run_id_fails_clearly_until_its_retention_ends() {
    let etcd = Etcd::start();
    let url = etcd.url("closed-id", "min_nodes=1");
    let first = node(&url);
    first.next().unwrap();
    first.set_closed().unwrap();
    first.shutdown().unwrap();
    let err = node(&url).next().map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert!(
        err.message().contains("new run id"),
        "say what to do: {err}"
    );
}

#[test]
fn a_refused_connection_is_reported_at_once() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("etcd://127.0.0.1:{port}/refused?connect_timeout=10");
    let started = Instant::now();
    let err = BlockingRendezvous::new(Params::from_url(&url).unwrap())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    assert!(
        err.message().contains("connection refused")
            && err.message().contains(&format!("127.0.0.1:{port}"))
            && err.message().contains("is etcd running"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?} of connect_timeout=10",
        started.elapsed()
    );
}

/// Creates `n` handles from `n` threads at once; each thread's result.
fn handles_at_once(url: &str, n: usize) -> Vec<rdzv::Result<BlockingRendezvous>> {
    let start = Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (url, start) = (url.to_string(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                node_result(&url)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// This process's established TCP connections to `port` (Linux: /proc).
fn connections_to(port: u16) -> usize {
    let own_sockets: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_string())
        })
        .collect();
    let remote = format!(":{port:04X}");
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .flat_map(|table| {
            std::fs::read_to_string(table)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|line| {
            // sl, local, remote, state (01: established), queues, timer, retransmits, uid,
            // timeout, inode
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 9
                && cols[2].ends_with(&remote)
                && cols[3] == "01"
                && own_sockets.contains(cols[9])
        })
        .count()
}

#[test]
fn handles_created_at_once_share_one_connection() {
    let etcd = Etcd::start();
    let port = etcd.client_port;
    let url = etcd.url("shared", "min_nodes=1");
    let nodes: Vec<_> = handles_at_once(&url, 32)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Each handle used to open its own connection when none was there yet.
    assert_eq!(
        connections_to(port),
        1,
        "32 handles created at once, one process"
    );
    drop(nodes);
}

/// The `LeaseKeepAlive` streams etcd has opened so far.
fn lease_streams(etcd: &Etcd) -> f64 {
    etcd.metric_sum(
        "grpc_server_started_total",
        &["grpc_method=\"LeaseKeepAlive\""],
    )
}

#[test]
fn every_lease_of_a_process_is_refreshed_over_one_stream() {
    let etcd = Etcd::start();
    let url = etcd.url("one-stream", "min_nodes=8&max_nodes=8&lease_ttl=3");
    let streams = || lease_streams(&etcd);
    let before = streams();
    let nodes: Vec<_> = handles_at_once(&url, 8)
        .into_iter()
        .map(|n| Arc::new(n.unwrap()))
        .collect();
    let rounds = common::on_threads(8, {
        let nodes = nodes.clone();
        move |i| nodes[i].next().unwrap().0
    });
    assert!(rounds.iter().all(|r| r.world_size == 8));
    // Nine leases (eight nodes' and the run's), one stream: a stream per lease held a gRPC
    // stream's buffers per handle.
    assert_eq!(streams() - before, 1.0, "LeaseKeepAlive streams opened");
    // Refreshed over that stream: every lease outlives two of its TTLs.
    let refreshes = || {
        etcd.metric_sum(
            "grpc_server_msg_received_total",
            &["grpc_method=\"LeaseKeepAlive\""],
        )
    };
    let sent = refreshes();
    let lease_ends = Instant::now() + Duration::from_secs(6);
    while Instant::now() < lease_ends {
        assert_eq!(nodes[0].num_lost().unwrap(), 0);
        std::thread::sleep(Duration::from_millis(100));
    }
    // A third of the TTL apart, once per lease: the run's lease is refreshed once for the
    // process, not once per handle (8 handles each refreshing two leases sent 16 per period).
    let per_second = (refreshes() - sent) / 6.0;
    assert!(
        (6.0..=11.0).contains(&per_second),
        "{per_second} refreshes per second for nine leases with a 1 s period"
    );
    assert_eq!(streams() - before, 1.0, "LeaseKeepAlive streams opened");
}

/// A stream carries at most 32 leases: etcd answers a stream's refreshes one after another (a
/// round trip to its raft leader each, from a follower), and one stream for the 900 leases of
/// a process of 800 nodes fell behind their TTLs once etcd slowed (`scripts/soak.sh`: leases
/// expired by the thousand). 60 handles hold 61 leases (theirs and the run's): two streams,
/// and every lease outlives two of its TTLs (3 s, as the one-stream test's: with 2 s, four
/// test lanes at once on 2 cores once kept the process from etcd for a whole TTL).
#[test]
fn a_process_of_many_leases_refreshes_them_over_streams_of_at_most_32() {
    let etcd = Etcd::start();
    let url = etcd.url("many-leases", "min_nodes=60&max_nodes=60&lease_ttl=3");
    let streams = || lease_streams(&etcd);
    let before = streams();
    let nodes: Vec<_> = handles_at_once(&url, 60)
        .into_iter()
        .map(|n| n.unwrap())
        .collect();
    let admin = rdzv::BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    let lease_ends = Instant::now() + Duration::from_secs(6);
    while Instant::now() < lease_ends {
        assert_eq!(admin.status().unwrap().alive, 60, "a lease expired");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(streams() - before, 2.0, "LeaseKeepAlive streams opened");
    drop(nodes);
}

/// etcd slowed by load answers every refresh late, later than a refresh period (a third of
/// the TTL) but well within the TTL: every lease must live on. The refresh task used to take
/// a stream that slow for stuck, drop it, and bound the new one's opening by a refresh period:
/// its first answer came as late, so no stream ever opened again and every lease of the
/// stream expired (a 30-minute soak lost hundreds so in one minute). Here every answer of etcd
/// reaches the process 1.3 s late, with a TTL of 3 s: the leases outlive three TTLs.
#[test]
fn leases_outlive_an_etcd_that_answers_later_than_a_refresh_period() {
    let etcd = Etcd::start();
    let proxy = common::SlowProxy::start(etcd.client_port, Duration::from_millis(1300));
    let url = etcd.url(
        "slow-answers",
        "min_nodes=4&max_nodes=4&lease_ttl=3&connect_timeout=30",
    );
    let slow_url = url.replace(&etcd.endpoint(), &proxy.endpoint());
    let nodes: Vec<_> = handles_at_once(&slow_url, 4)
        .into_iter()
        .map(|n| n.unwrap())
        .collect();
    // Read past the proxy: what etcd holds.
    let admin = rdzv::BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    assert_eq!(admin.status().unwrap().alive, 4);
    let lease_ends = Instant::now() + Duration::from_secs(9);
    while Instant::now() < lease_ends {
        assert_eq!(admin.status().unwrap().alive, 4, "a lease expired");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(nodes);
}

/// A job whose nodes all leave at once (a job that ended): every lease is gone from etcd
/// afterwards, and the run's lease is revoked once, by the node whose cleanup deleted its key,
/// not by every node that ran the cleanup (each revoke is a write every member applies; a
/// soak's job ended with up to 8 of them, all but one answered "lease not found").
#[test]
fn a_job_that_ends_at_once_revokes_each_lease_once() {
    const N: usize = 8;
    let etcd = Etcd::start();
    let url = etcd.url("ends-at-once", &format!("min_nodes={N}&max_nodes={N}"));
    let nodes: Vec<_> = handles_at_once(&url, N)
        .into_iter()
        .map(|n| Arc::new(n.unwrap()))
        .collect();
    let rounds = {
        let nodes = nodes.clone();
        common::on_threads(N, move |i| nodes[i].next().map(|(info, _)| info.round))
    };
    assert!(
        rounds.iter().all(|r| r.as_ref().is_ok_and(|r| *r == 0)),
        "{rounds:?}"
    );
    // The grants of nodes that lost the race to publish the run's lease are revoked in the
    // background: counted once they are gone, when etcd holds each node's lease and the run's.
    let (rt, mut client) = common::etcd_client(&etcd);
    let mut leases = || rt.block_on(client.leases()).unwrap().leases().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while leases() != N + 1 {
        assert!(
            Instant::now() < deadline,
            "{} leases, not {}",
            leases(),
            N + 1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let revokes = || etcd.metric_sum("grpc_server_handled_total", &["LeaseRevoke"]);
    let before = revokes();
    let start = Arc::new(std::sync::Barrier::new(N));
    let left = {
        let nodes = nodes.clone();
        common::on_threads(N, move |i| {
            start.wait();
            nodes[i].shutdown()
        })
    };
    assert!(left.iter().all(|r| r.is_ok()), "{left:?}");
    assert_eq!(leases(), 0, "leases left in etcd once every node left");
    // One revoke per node's own lease, and one of the run's.
    assert_eq!(
        revokes() - before,
        (N + 1) as f64,
        "LeaseRevoke calls etcd handled"
    );
}

/// The transaction that publishes the run's lease took effect, but its answer was lost (the
/// connection cut right after, as when a member fails after applying it or a leader change
/// strands it): it was sent again and found a lease published already, its own. It used to
/// take that for another node's lease and revoke it, which deletes the run's lease key and
/// every round bound to that lease. The run's lease must stay the one published, alive,
/// through a round.
#[test]
fn a_run_lease_whose_publication_lost_its_answer_is_kept() {
    let etcd = Etcd::start();
    let url = etcd.url("lost-publication", "min_nodes=1&max_nodes=1");
    let key = format!("/rdzv/{}/lease", run_of(&url));
    // The publication's guard: no other request compares this key's creation.
    let guard = common::SlowProxy::compare_on(1, &key);
    let proxy = common::SlowProxy::lose_answer_to(etcd.client_port, guard);
    let cut_url = url.replace(&etcd.endpoint(), &proxy.endpoint());
    let node = BlockingRendezvous::new(Params::from_url(&cut_url).unwrap()).unwrap();
    assert!(proxy.answer_lost(), "the publication's answer was not lost");
    let (rt, mut client) = common::etcd_client(&etcd);
    let mut published = || {
        let got = rt.block_on(client.get(key.as_str(), None)).unwrap();
        got.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        })
    };
    let first = published().expect("the run's lease key is gone once the handle was made");
    let (_info, store) = node.next().unwrap();
    store.set("after", b"1").unwrap();
    assert_eq!(
        published(),
        Some(first.clone()),
        "the run's lease was replaced (revoked, then published anew)"
    );
    let id: i64 = first.0.parse().unwrap();
    let (rt, mut client) = common::etcd_client(&etcd);
    let ttl = rt
        .block_on(client.lease_time_to_live(id, None))
        .unwrap()
        .ttl();
    assert!(ttl > 0, "the run's lease {id} was revoked (TTL {ttl})");
    node.shutdown().unwrap();
}

#[test]
fn a_connect_waiting_behind_another_fails_within_its_own_connect_timeout() {
    // Listening (the kernel completes the TCP handshake) but never answering.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = |timeout: u32| format!("etcd://127.0.0.1:{port}/silent?connect_timeout={timeout}");
    let patient = {
        let url = url(8);
        std::thread::spawn(move || node_result(&url).map(|_| ()))
    };
    // Its first connection: the patient handle is connecting and holds the process's connect.
    let mut pending = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&silent),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut pending, 1, 30_000) };
    assert_eq!(ready, 1, "the first handle never connected");
    let _held = silent.accept().unwrap();
    let started = Instant::now();
    let err = node_result(&url(1)).map(|_| ()).unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.message().contains("within 1.0 s"), "{err}");
    // Queued behind the patient one, it would fail only when that one gives up (8 s).
    assert!(
        took < Duration::from_secs(6),
        "took {took:?} with connect_timeout=1"
    );
    drop(silent);
    assert_eq!(
        patient.join().unwrap().unwrap_err().kind(),
        ErrorKind::Connection
    );
}

#[test]
fn next_after_the_run_closed_fails_and_does_not_return_the_old_round() {
    let etcd = Etcd::start();
    let url = etcd.url("closed-member", "min_nodes=1");
    let member = node(&url);
    member.next().unwrap();
    member.set_closed().unwrap();
    let err = member.next().map(|(info, _)| info).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
}

/// The keys under a run's prefix, relative to it.
fn keys_under(kvs: &[etcd_client::KeyValue], run: &str) -> Vec<String> {
    kvs.iter()
        .map(|kv| kv.key_str().unwrap().trim_start_matches(run).to_string())
        .collect()
}

/// Waits (by watch, at most 30 s) until the run's prefix holds exactly `expected`.
fn wait_until_only(etcd: &Etcd, run: &str, expected: &[&str]) {
    let mut last = Vec::new();
    let matched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        common::watch_until(&etcd.endpoint(), run, |kvs| {
            last = keys_under(kvs, run);
            (last == expected).then_some(())
        })
    }));
    assert!(
        matched.is_ok(),
        "the run left keys behind: {last:?}, expected only {expected:?}"
    );
}

/// A member SIGKILLed while the others shut down within its lease: its `alive` key outlives
/// them, so none of them is the last node out, and nobody deletes the run's keys. The run's
/// lease, which only live nodes refresh, takes them once it expires.
#[test]
fn a_run_whose_member_died_leaves_nothing_once_its_leases_expire() {
    let etcd = Etcd::start();
    let url = etcd.url("died", "min_nodes=3&max_nodes=3&lease_ttl=2");
    let run = format!("/rdzv/{}/", run_of(&url));
    let victim = Node::spawn(&url, &["--rounds", "forever", "--follow"]);
    let others = common::on_threads(2, {
        let url = url.clone();
        move |_| {
            let node = node(&url);
            let (_, store) = node.next().unwrap();
            store.set("x", b"1").unwrap();
            // The run's store goes with the run's lease too.
            let run = node.run_store().unwrap();
            run.add("restarts", 1).unwrap();
            run.set(&format!("notes/{}", node.node_id()), b"here")
                .unwrap();
            node
        }
    });
    assert_eq!(victim.round(30)["world_size"], 3);
    let mut victim = victim;
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    for node in others {
        node.shutdown().unwrap();
    }
    // Within 30 s: the victim's lease (2 s) and the run's lease (2 s after the last node).
    wait_until_only(&etcd, &run, &[]);
}

/// The same when the dead node was drained first (a preemption notice, then the machine
/// disappears): the survivors re-form, close the run and shut down within its lease; only
/// `closed` stays.
#[test]
fn a_drained_then_killed_node_leaves_only_the_closed_marker() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "drained-died",
        "min_nodes=2&max_nodes=3&last_call_timeout=0.5&lease_ttl=2",
    );
    let run = format!("/rdzv/{}/", run_of(&url));
    let victim = Node::spawn(&url, &["--rounds", "forever", "--follow"]);
    let mut others = common::on_threads(2, {
        let url = url.clone();
        move |_| {
            let node = node(&url);
            node.next().unwrap();
            node
        }
    });
    let round = victim.round(30);
    assert_eq!(round["world_size"], 3);
    let operator = rdzv::BlockingAdmin::new(Params::from_url(&url).unwrap()).unwrap();
    let sealed = operator.status().unwrap().sealed.unwrap();
    let victim_rank = round["rank"].as_u64().unwrap() as u32;
    let victim_id = &sealed
        .members
        .iter()
        .find(|m| m.rank == victim_rank)
        .unwrap()
        .node;
    operator.drain(victim_id, "preempted").unwrap();
    let mut victim = victim;
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // The survivors re-form without it (at once: a drained node is not waited for).
    let survivors = common::on_threads(2, {
        let nodes: Vec<_> = others.drain(..).map(Arc::new).collect();
        move |i| {
            let (info, store) = nodes[i].next().unwrap();
            store.set("y", b"1").unwrap();
            let run = nodes[i].run_store().unwrap();
            run.set("notes/left", b"drained: preempted").unwrap();
            (info.round, nodes[i].clone())
        }
    });
    assert!(survivors.iter().all(|(round, _)| *round == 1));
    survivors[0].1.set_closed().unwrap();
    for (_, node) in survivors {
        node.shutdown().unwrap();
    }
    wait_until_only(&etcd, &run, &["closed"]);
}

/// The other side of the run's lease: a node that lives keeps the run, however the others
/// left. The victim registers first, so it creates the run's lease; once its own lease has
/// expired, the survivor must have refreshed the run's lease since, and its next round and
/// its store are intact.
#[test]
fn a_live_node_keeps_the_run_after_the_node_that_created_it_died() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "keeps",
        "min_nodes=1&max_nodes=2&last_call_timeout=30&lease_ttl=2",
    );
    let run = format!("/rdzv/{}/", run_of(&url));
    let mut victim = Node::spawn(&url, &["--rounds", "forever", "--follow"]);
    let run_lease = common::watch_until(&etcd.endpoint(), &run, |kvs| {
        kvs.iter()
            .find(|kv| kv.key_str().unwrap().ends_with("/lease"))
            .map(|kv| kv.lease())
    });
    let survivor = node(&url);
    let (first, store) = survivor.next().unwrap();
    assert_eq!((first.round, first.world_size), (0, 2));
    store.set("x", b"kept").unwrap();
    let run_store = survivor.run_store().unwrap();
    run_store.set("notes/x", b"kept").unwrap();
    victim.round(30);
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // The victim's `alive` key goes with its lease.
    common::wait_for_key_count(&etcd.endpoint(), &format!("{run}alive/"), |n| n == 1);
    // A full lease TTL later (a lease of the test's own, granted now, has expired), the run's
    // lease still exists: the survivor alone refreshed it.
    let (rt, mut client) = common::etcd_client(&etcd);
    let sentinel = rt.block_on(client.lease_grant(2, None)).unwrap().id();
    let put = etcd_client::PutOptions::new().with_lease(sentinel);
    rt.block_on(client.put("/sentinel/ttl", "1", Some(put)))
        .unwrap();
    common::wait_for_key_count(&etcd.endpoint(), "/sentinel/", |n| n == 0);
    let ttl = rt
        .block_on(client.lease_time_to_live(run_lease, None))
        .unwrap();
    assert!(
        ttl.ttl() > 0,
        "the run's lease expired while a node was alive"
    );
    let (second, _) = survivor.next().unwrap();
    assert_eq!((second.round, second.world_size), (1, 1), "the run went on");
    assert_eq!(store.get("x", None).unwrap(), b"kept");
    assert_eq!(run_store.get("notes/x", None).unwrap(), b"kept");
    survivor.shutdown().unwrap();
    assert_eq!(
        count_under(&etcd, &run),
        0,
        "the last node out deletes the run"
    );
}
