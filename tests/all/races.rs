//! Regression tests for races between a node giving up (cancel, timeout) and the round being
//! sealed, for nodes beyond `max_nodes`, and for the order of "sealed" and "closed". Each one
//! failed before its fix. Real etcd, nodes as threads or `rdzv-node` processes, real signals;
//! timings that must be forced are forced (SIGSTOP) or swept with a printed seed.

use crate::common;

use common::node::{joiners_of_round, run_of, Node};
use common::{etcd_client, watch_until, Etcd};
use rdzv::{BlockingRendezvous, ErrorKind, Params};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn node(url: &str) -> BlockingRendezvous {
    BlockingRendezvous::new(Params::from_url(url).unwrap()).unwrap()
}

fn signal(child: &std::process::Child, sig: i32) {
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// The keys under `prefix`, read directly from etcd.
fn keys_under(etcd: &Etcd, prefix: &str) -> Vec<String> {
    let (rt, mut client) = etcd_client(etcd);
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    let resp = rt.block_on(client.get(prefix, Some(opts))).unwrap();
    resp.kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// The sealed members of `round`, in rank order, as etcd has them (its lanes).
fn sealed_members(etcd: &Etcd, url: &str, round: u64) -> Vec<String> {
    let key = format!("/rdzv/{}/r/{round:020}/seal/final", run_of(url));
    let (rt, mut client) = etcd_client(etcd);
    let resp = rt.block_on(client.get(key.clone(), None)).unwrap();
    let kv = resp.kvs().first().unwrap_or_else(|| panic!("{key} absent"));
    let sealed = rdzv::test_support::FinalRecord::parse(kv.key(), kv.value()).unwrap();
    let ranks = format!("/rdzv/{}/r/{round:020}/lane/", run_of(url));
    let options = etcd_client::GetOptions::new().with_prefix();
    let chunks = rt.block_on(client.get(ranks, Some(options))).unwrap();
    let chunks = chunks.kvs().iter().map(|kv| (kv.key(), kv.value()));
    rdzv::test_support::members_from_chunks(&sealed, chunks)
        .unwrap()
        .to_vec()
}

/// Waits (by watch) until round `round` of `url` has exactly `n` join keys.
fn wait_for_joiners(etcd: &Etcd, url: &str, round: u64, n: usize) {
    watch_until(&etcd.endpoint(), &joiners_of_round(url, round), |kvs| {
        (kvs.len() == n).then_some(())
    });
}

/// A small seeded generator, so a failing sweep can be replayed from its printed seed.
struct Rng(u64);
impl Rng {
    fn from_env_or_time() -> Rng {
        let seed = std::env::var("RDZV_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("seed {seed} (replay with RDZV_TEST_SEED={seed})");
        Rng(seed | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A leads with the last call running; B joins, then gives up while A is frozen. When A wakes
/// its last call is over and its view still holds B: the seal must not include B.
#[test]
fn a_node_that_withdrew_is_never_sealed_into_the_round() {
    let etcd = Etcd::start();
    let url = etcd.url("withdrawn", "min_nodes=1&max_nodes=3&last_call_timeout=3");
    let leader = Node::spawn(&url, &[]);
    let prefix = format!("/rdzv/{}/r/{:020}/", run_of(&url), 0);
    common::wait_for_leader(&etcd.endpoint(), &prefix);
    let last_call_started = Instant::now();
    let b = Arc::new(node(&url));
    let (tx, rx) = mpsc::channel();
    {
        let b = b.clone();
        std::thread::spawn(move || tx.send(b.next().map(|(info, _)| info)));
    }
    wait_for_joiners(&etcd, &url, 0, 2);
    signal(&leader.child, libc::SIGSTOP);
    b.cancel();
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(keys_under(&etcd, &joiners_of_round(&url, 0)).len() == 1);
    // Fault injection, not a wait for an event: A stays frozen past the end of its last call,
    // so that it wakes with an expired timer and a view that still counts B.
    let frozen_until = last_call_started + Duration::from_secs(4);
    std::thread::sleep(frozen_until.saturating_duration_since(Instant::now()));
    signal(&leader.child, libc::SIGCONT);
    let round = leader.round(20);
    assert_eq!(
        round["world_size"], 1,
        "B withdrew but was sealed in: {round}"
    );
    assert_eq!(
        sealed_members(&etcd, &url, 0),
        vec![round["node"].as_str().unwrap().to_string()]
    );
}

/// Cancels swept across the end of the last call: whoever wins, A's world and B's outcome
/// agree (B cancelled means B is not a member; B a member means B got the round).
#[test]
fn a_cancel_racing_the_seal_either_withdraws_or_gets_the_round() {
    let etcd = Etcd::start();
    let mut rng = Rng::from_env_or_time();
    let (mut withdrew, mut joined) = (0, 0);
    for trial in 0..12 {
        let url = etcd.url(
            "cancel-seal",
            "min_nodes=1&max_nodes=3&last_call_timeout=0.3",
        );
        let a = Arc::new(node(&url));
        let (a_tx, a_rx) = mpsc::channel();
        {
            let a = a.clone();
            std::thread::spawn(move || a_tx.send(a.next().map(|(info, _)| info)));
        }
        let prefix = format!("/rdzv/{}/r/{:020}/", run_of(&url), 0);
        common::wait_for_leader(&etcd.endpoint(), &prefix);
        let started = Instant::now();
        let b = Arc::new(node(&url));
        let (b_tx, b_rx) = mpsc::channel();
        {
            let b = b.clone();
            std::thread::spawn(move || b_tx.send(b.next().map(|(info, _)| info)));
        }
        // Cancel somewhere between 250 ms and 310 ms after the last call began (it ends at
        // 300 ms): before, during and after the seal.
        let at = started + Duration::from_micros(250_000 + rng.below(60_000));
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        b.cancel();
        let a_info = a_rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        let b_result = b_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let members = sealed_members(&etcd, &url, 0);
        match b_result {
            Ok(b_info) => {
                joined += 1;
                assert_eq!(
                    (a_info.world_size, b_info.world_size),
                    (2, 2),
                    "trial {trial}"
                );
                assert!(members.contains(&b.node_id().to_string()));
            }
            Err(e) => {
                withdrew += 1;
                assert_eq!(e.kind(), ErrorKind::Cancelled, "trial {trial}: {e}");
                assert_eq!(
                    a_info.world_size, 1,
                    "trial {trial}: B was cancelled yet sealed in: {members:?}"
                );
                assert!(!members.contains(&b.node_id().to_string()));
            }
        }
    }
    println!("B withdrew in {withdrew} trials and was sealed in {joined}");
}

/// A first joiner cancelled while its join transaction is in flight: once `next` returns, it
/// must hold neither a join key nor the round's leadership, or the next node could never
/// form a round while this idle handle lives.
#[test]
fn a_cancel_during_the_join_leaves_no_phantom_leader() {
    let etcd = Etcd::start();
    let mut rng = Rng::from_env_or_time();
    let url = etcd.url("phantom", "min_nodes=2&max_nodes=2&join_timeout=20");
    let idle = Arc::new(node(&url));
    let round0 = format!("/rdzv/{}/r/{:020}/", run_of(&url), 0);
    for trial in 0..40 {
        let (tx, rx) = mpsc::channel();
        {
            let idle = idle.clone();
            std::thread::spawn(move || tx.send(idle.next().map(|_| ())));
        }
        // 0-3 ms after next starts: often while the join transaction is on the wire.
        std::thread::sleep(Duration::from_micros(rng.below(3_000)));
        // Once: a cancel made before next started is kept for it.
        idle.cancel();
        let result = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the cancelled next kept waiting");
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Cancelled);
        let left: Vec<String> = keys_under(&etcd, &round0)
            .into_iter()
            .filter(|k| k.ends_with("/leader") || k.contains("/join/"))
            .collect();
        assert!(left.is_empty(), "trial {trial}: left behind {left:?}");
    }
    // And the round still forms for others while the idle handle lives.
    let run = url.split('?').next().unwrap();
    let other = node(&format!("{run}?min_nodes=1&max_nodes=1&join_timeout=8"));
    let info = other.next().expect("a later node forms a round").0;
    assert_eq!(info.world_size, 1);
}

/// Three nodes, max_nodes=2: the spare must not be counted as waiting while the round is
/// full (members would re-form the same round forever), and is admitted when a member leaves.
#[test]
fn a_spare_node_beyond_max_does_not_make_a_full_round_reform() {
    let etcd = Etcd::start();
    let url = etcd.url("spare", "min_nodes=2&max_nodes=2&last_call_timeout=1");
    let members: Vec<Arc<BlockingRendezvous>> = (0..2).map(|_| Arc::new(node(&url))).collect();
    let infos = common::on_threads(2, {
        let members = members.clone();
        move |i| members[i].next().unwrap().0
    });
    assert_eq!((infos[0].world_size, infos[1].world_size), (2, 2));
    let spare = Arc::new(node(&url));
    let (tx, rx) = mpsc::channel();
    {
        let spare = spare.clone();
        std::thread::spawn(move || tx.send(spare.next().map(|(info, _)| info)));
    }
    wait_for_joiners(&etcd, &url, 1, 1);
    for m in &members {
        assert_eq!(m.num_waiting().unwrap(), 0, "the round is full: no room");
    }
    // A member leaves: now there is room, and the spare counts.
    let (leaving, staying) = if infos[0].rank == 0 { (1, 0) } else { (0, 1) };
    members[leaving].shutdown().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while members[staying].num_lost().unwrap() != 1 {
        assert!(Instant::now() < deadline, "the departure was never seen");
        std::thread::yield_now();
    }
    assert_eq!(members[staying].num_waiting().unwrap(), 1);
    let again = members[staying].next().unwrap().0;
    let admitted = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(
        (again.rank, again.world_size),
        (0, 2),
        "rank 0 stays rank 0"
    );
    assert_eq!((admitted.rank, admitted.world_size), (1, 2));
}

/// Members re-join whenever `num_waiting > 0`, as every agent does. With a spare node this
/// used to re-form the same full round back to back; now the two members stay put.
#[test]
fn agents_with_a_spare_node_do_not_livelock() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "livelock",
        "min_nodes=2&max_nodes=2&last_call_timeout=0.5&join_timeout=30",
    );
    let nodes: Vec<Node> = (0..3)
        .map(|_| Node::spawn(&url, &["--rounds", "2", "--follow"]))
        .collect();
    // Two nodes form round 0; the third ends up waiting in round 1.
    wait_for_joiners(&etcd, &url, 1, 1);
    // Bounded observation: with a livelock, round 1 seals within a few last calls.
    let (rt, mut client) = etcd_client(&etcd);
    let key = format!("/rdzv/{}/r/{:020}/seal/final", run_of(&url), 1);
    let sealed_again = rt.block_on(async {
        let mut stream = client.watch(key.clone(), None).await.unwrap();
        if client.get(key, None).await.unwrap().count() > 0 {
            return true;
        }
        let event = async {
            while let Some(resp) = stream.message().await.unwrap() {
                if !resp.events().is_empty() {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(4), event)
            .await
            .is_ok()
    });
    assert!(
        !sealed_again,
        "round 1 formed without anyone lost: members re-formed for a node they cannot take"
    );
    drop(nodes);
}

/// A member of a sealed round whose watch broke before it saw the seal, and which reads the
/// round only after the run was closed, must get its round: it was sealed before the close.
#[test]
fn sealed_comes_before_closed_after_a_watch_break() {
    let mut etcd = Etcd::start();
    let url = etcd.url(
        "sealed-closed",
        "min_nodes=2&max_nodes=3&last_call_timeout=4&lease_ttl=20",
    );
    let a = Arc::new(node(&url));
    let (tx, rx) = mpsc::channel();
    {
        let a = a.clone();
        std::thread::spawn(move || tx.send(a.next().map(|(info, _)| info)));
    }
    let prefix = format!("/rdzv/{}/r/{:020}/", run_of(&url), 0);
    common::wait_for_leader(&etcd.endpoint(), &prefix);
    let b = Node::spawn(&url, &[]);
    wait_for_joiners(&etcd, &url, 0, 2);
    // B sleeps through an etcd restart (its watch is broken when it wakes), the seal and the
    // close, and then can only learn its round from a fresh read.
    signal(&b.child, libc::SIGSTOP);
    etcd.restart();
    let a_info = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
    assert_eq!(a_info.world_size, 2);
    a.set_closed().unwrap();
    signal(&b.child, libc::SIGCONT);
    let round = b.round(30);
    assert_eq!(
        (round["round"].as_u64(), round["world_size"].as_u64()),
        (Some(0), Some(2))
    );
}

/// `next` with etcd frozen after joining: it returns at most about one second past its
/// join_timeout (the withdrawal's grace), not a connect_timeout later; and since it could not
/// withdraw, it lets its lease lapse so its join key goes away once etcd is back.
#[test]
fn next_does_not_overrun_join_timeout_when_etcd_freezes() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "overrun",
        "min_nodes=2&max_nodes=2&join_timeout=3&connect_timeout=10&lease_ttl=2",
    );
    let b = node(&url);
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let b = Arc::new(b);
    {
        let b = b.clone();
        std::thread::spawn(move || tx.send(b.next().map(|_| ())));
    }
    wait_for_joiners(&etcd, &url, 0, 1);
    etcd.signal(libc::SIGSTOP);
    let result = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let took = started.elapsed();
    etcd.signal(libc::SIGCONT);
    assert!(result.is_err());
    assert!(
        took < Duration::from_millis(4600),
        "join_timeout=3 took {took:?}"
    );
    // The lease was let go: etcd drops the join key within lease_ttl.
    wait_for_joiners(&etcd, &url, 0, 0);
}

/// A round of `members` (rank order) with two spares waiting in round 1 (`max_nodes=2`),
/// as their `next` calls (on threads) report.
type Spares = Vec<mpsc::Receiver<rdzv::Result<rdzv::RoundInfo>>>;

/// Forms round 0 of two members on `url` (min_nodes = max_nodes = 2) and starts two spares,
/// which wait in round 1. Returns the members in rank order and the spares' outcomes.
fn round_of_two_with_two_spares(etcd: &Etcd, url: &str) -> (Vec<Arc<BlockingRendezvous>>, Spares) {
    let mut members: Vec<Arc<BlockingRendezvous>> = (0..2).map(|_| Arc::new(node(url))).collect();
    let infos = common::on_threads(2, {
        let members = members.clone();
        move |i| members[i].next().unwrap().0
    });
    assert_eq!((infos[0].world_size, infos[1].world_size), (2, 2));
    if infos[0].rank != 0 {
        members.swap(0, 1);
    }
    let spares = (0..2)
        .map(|_| {
            let spare = node(url);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || tx.send(spare.next().map(|(info, _)| info)));
            rx
        })
        .collect();
    wait_for_joiners(etcd, url, 1, 2);
    (members, spares)
}

/// Rank 0 comes back to a re-rendezvous after its last call is over, with two spares waiting
/// (max_nodes=2): it keeps rank 0, B keeps rank 1, and the spares keep waiting. Before the
/// fix the last call sealed B with a spare and left A waiting as a spare.
#[test]
fn a_live_member_back_after_the_last_call_keeps_its_rank_over_spares() {
    let etcd = Etcd::start();
    let url = etcd.url(
        "keep-rank",
        "min_nodes=2&max_nodes=2&last_call_timeout=0.5&lease_ttl=10&join_timeout=30",
    );
    let (members, spares) = round_of_two_with_two_spares(&etcd, &url);
    let (a, b) = (members[0].clone(), members[1].clone());
    let (b_tx, b_rx) = mpsc::channel();
    {
        let b = b.clone();
        std::thread::spawn(move || b_tx.send(b.next().map(|(info, _)| info)));
    }
    // B is in round 1 with the spares: the round is activated and its last call runs.
    wait_for_joiners(&etcd, &url, 1, 3);
    // The scenario itself, not a wait for an event: A comes back 2 s later, four last calls
    // (well within lease_ttl: it is alive all along).
    std::thread::sleep(Duration::from_secs(2));
    let (a_tx, a_rx) = mpsc::channel();
    {
        let a = a.clone();
        std::thread::spawn(move || {
            let called = Instant::now();
            let result = a.next().map(|(info, _)| info);
            println!(
                "A's next returned {:?} after it was called",
                called.elapsed()
            );
            a_tx.send(result)
        });
    }
    let b_info = b_rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
    let sealed = sealed_members(&etcd, &url, 1);
    assert_eq!(
        sealed,
        vec![a.node_id().to_string(), b.node_id().to_string()],
        "round 1 must be A (rank 0) then B; B got rank {} of {}",
        b_info.rank,
        b_info.world_size
    );
    let a_info = a_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("A was left waiting")
        .unwrap();
    assert_eq!((a_info.round, a_info.rank, a_info.world_size), (1, 0, 2));
    assert_eq!((b_info.round, b_info.rank, b_info.world_size), (1, 1, 2));
    // The spares were left out of round 1 and wait in round 2; a close lets them go.
    wait_for_joiners(&etcd, &url, 2, 2);
    for spare in &spares {
        assert!(spare.try_recv().is_err(), "a spare returned from next");
    }
    a.set_closed().unwrap();
    for spare in spares {
        let result = spare.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(result.unwrap_err().kind(), ErrorKind::GracefulExit);
    }
}

/// A live member of the previous round that never comes back holds the round's seal for at
/// most `lease_ttl` past the end of the last call: then the others seal without it.
#[test]
fn a_live_member_that_never_comes_back_holds_the_round_at_most_a_lease_ttl() {
    let etcd = Etcd::start();
    let (last_call, lease_ttl) = (Duration::from_millis(500), Duration::from_secs(2));
    let url = etcd.url(
        "hold-bound",
        "min_nodes=2&max_nodes=2&last_call_timeout=0.5&lease_ttl=2&join_timeout=30",
    );
    let (members, _spares) = round_of_two_with_two_spares(&etcd, &url);
    let (a, b) = (&members[0], &members[1]);
    let started = Instant::now();
    let b_info = b.next().unwrap().0;
    let took = started.elapsed();
    println!("B's next returned {took:?} after it was called (last call 0.5 s, lease_ttl 2 s)");
    // A was alive all along (its handle lives and refreshes its lease) and never called next.
    let sealed = sealed_members(&etcd, &url, 1);
    assert_eq!((b_info.round, b_info.rank, b_info.world_size), (1, 0, 2));
    assert!(!sealed.contains(&a.node_id().to_string()), "{sealed:?}");
    assert!(
        took >= last_call + lease_ttl,
        "sealed {took:?} after B joined, before the hold for A was over"
    );
    // The bound, with slack for a loaded machine: not a join_timeout, not another lease.
    assert!(
        took < last_call + lease_ttl + Duration::from_secs(5),
        "a member that never came back held the round for {took:?}"
    );
    a.set_closed().unwrap();
}
