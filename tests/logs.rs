//! Log records reach a host's handler (`rdzv::log::set_handler`, what the C ABI's
//! `rdzv_set_log_handler` installs a C function with; tests/c/log_test.c checks that part) with the
//! fields an operator needs; a flood of them from many threads, while the handler is being
//! replaced, neither deadlocks nor loses, reorders or misroutes a record; handlers that call
//! back into rdzv or panic do no harm. Real etcd. One test function, since the handler and the
//! filter are process-wide; a watchdog fails it instead of hanging if anything deadlocks.

use rdzv_test_support as common;

use common::{on_threads, Etcd};
use rdzv::log::{set_handler, Record};
use rdzv::{BlockingRendezvous, Params};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tracing::Level;

struct Line {
    level: Level,
    target: String,
    text: String,
}

static LINES: Mutex<Vec<Line>> = Mutex::new(Vec::new());
/// Notified after each record kept, for tests that wait for one.
static NEW_LINE: Condvar = Condvar::new();

/// One handler's own data: the test retires it once `set_handler` replaced it; a
/// call after that is a broken promise.
struct Generation {
    retired: AtomicBool,
}

static CALLS_AFTER_RETIREMENT: AtomicUsize = AtomicUsize::new(0);

fn collect(record: &Record<'_>, generation: &Generation) {
    if generation.retired.load(Ordering::SeqCst) {
        CALLS_AFTER_RETIREMENT.fetch_add(1, Ordering::SeqCst);
    }
    // Calling back into rdzv from the handler is allowed.
    assert!(Params::from_url("etcd://127.0.0.1:1/probe").is_ok());
    LINES.lock().unwrap().push(Line {
        level: record.level,
        target: record.target.to_string(),
        text: record.line.to_string(),
    });
    NEW_LINE.notify_all();
}

/// Waits (at most 30 s) until a record matching `what` has arrived; returns its text.
fn wait_for_line(what: &str, matches: impl Fn(&Line) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut lines = LINES.lock().unwrap();
    loop {
        if let Some(l) = lines.iter().find(|l| matches(l)) {
            return l.text.clone();
        }
        let left = deadline
            .checked_duration_since(std::time::Instant::now())
            .unwrap_or_else(|| panic!("no record {what} within 30 s"));
        lines = NEW_LINE.wait_timeout(lines, left).unwrap().0;
    }
}

/// Installs `collect` with a fresh generation and retires the previous one.
fn install_collect(previous: Option<&'static Generation>) -> &'static Generation {
    let generation: &'static Generation = Box::leak(Box::new(Generation {
        retired: AtomicBool::new(false),
    }));
    // What the C ABI's rdzv_set_log_handler does first: rdzv's subscriber, filtered by RDZV_LOG.
    rdzv::log::install_default();
    set_handler(Some(Arc::new(move |record: &Record<'_>| {
        collect(record, generation)
    })));
    if let Some(previous) = previous {
        previous.retired.store(true, Ordering::SeqCst);
    }
    generation
}

/// The value of `name=` in a record's line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
}

fn take_lines() -> Vec<Line> {
    std::mem::take(&mut *LINES.lock().unwrap())
}

#[test]
fn records_reach_the_host_handler_in_order_without_deadlock() {
    std::env::set_var("RDZV_LOG", "debug");
    let (done, finished) = std::sync::mpsc::channel();
    let body = std::thread::spawn(move || {
        let mut etcd = Etcd::start();
        let generation = install_collect(None);
        a_round_names_run_node_and_round(&etcd);
        withdrawals_and_lost_members_are_logged(&etcd);
        retries_are_logged_and_a_lasting_one_warns(&mut etcd);
        a_flood_while_the_handler_changes_keeps_order(&etcd, generation);
        handlers_that_reenter_or_panic_do_no_harm();
        replacing_from_inside_returns_when_the_other_thread_leaves();
        a_handler_may_make_blocking_calls(&etcd);
        set_handler(None);
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(240)) {
        Ok(()) => body.join().unwrap(),
        // A panic in the body drops the sender: report it rather than a deadlock.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => body.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("logging deadlocked: the test did not finish within 240 s")
        }
    }
}

fn a_round_names_run_node_and_round(etcd: &Etcd) {
    let url = etcd.url("logs", "min_nodes=3&max_nodes=3");
    let run = common::node::run_of(&url);
    let ids = on_threads(3, {
        let url = url.clone();
        move |_| {
            let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
            node.next().unwrap();
            let id = node.node_id().to_string();
            node.shutdown().unwrap();
            id
        }
    });
    let lines = take_lines();
    let of_run = |msg: &str| -> Vec<&Line> {
        lines
            .iter()
            .filter(|l| l.text.starts_with(msg) && field(&l.text, "run") == Some(run.as_str()))
            .collect()
    };
    let connected = of_run("connected to etcd");
    assert_eq!(connected.len(), 3, "one per node");
    for l in &connected {
        assert!(field(&l.text, "etcd_version").is_some_and(|v| v.starts_with("3.")));
        assert_eq!(field(&l.text, "endpoints"), Some(etcd.endpoint().as_str()));
    }
    for (msg, per_node) in [
        ("connected to etcd", 1),
        ("joined round", 1),
        ("round complete", 1),
        ("shut down", 1),
    ] {
        for id in &ids {
            let mine: Vec<_> = of_run(msg)
                .into_iter()
                .filter(|l| field(&l.text, "node") == Some(id))
                .collect();
            assert_eq!(mine.len(), per_node, "{msg:?} of node {id}");
            assert_eq!(mine[0].level, Level::INFO);
            if msg != "connected to etcd" && msg != "shut down" {
                assert_eq!(field(&mine[0].text, "round"), Some("0"), "{}", mine[0].text);
            }
        }
    }
    let complete = of_run("round complete");
    assert!(complete
        .iter()
        .all(|l| field(&l.text, "world_size") == Some("3") && l.target == "rdzv::rendezvous"));
    let joined = of_run("joined round");
    let leaders: Vec<_> = joined
        .iter()
        .filter(|l| field(&l.text, "role") == Some("leader"))
        .collect();
    assert_eq!(leaders.len(), 1, "one leader");
    let leader = field(&leaders[0].text, "node").unwrap();
    let sealed = of_run("round sealed");
    assert_eq!(sealed.len(), 1, "one leader seals");
    let s = &sealed[0].text;
    assert_eq!(field(s, "node"), Some(leader), "{s}");
    assert_eq!(field(s, "trigger"), Some("max_nodes"), "{s}");
    assert_eq!(field(s, "world_size"), Some("3"), "{s}");
    assert_eq!(field(s, "joined"), Some("3"), "{s}");
    assert!(
        field(s, "since_first_join_ms").is_some_and(|ms| ms.parse::<u64>().is_ok()),
        "{s}"
    );
    assert_eq!(sealed[0].target, "rdzv::rendezvous::round");
}

/// A cancelled next says it withdrew and why; a member that leaves is named by the survivor.
fn withdrawals_and_lost_members_are_logged(etcd: &Etcd) {
    let url = etcd.url("withdraw", "min_nodes=2&max_nodes=2");
    let run = common::node::run_of(&url);
    let alone = Arc::new(BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap());
    let id = alone.node_id().to_string();
    let waiting = std::thread::spawn({
        let alone = alone.clone();
        move || alone.next().map(|_| ()).unwrap_err().kind()
    });
    wait_for_line("joined round", |l| {
        l.text.starts_with("joined round") && field(&l.text, "node") == Some(id.as_str())
    });
    alone.cancel();
    assert_eq!(waiting.join().unwrap(), rdzv::ErrorKind::Cancelled);
    let withdrew = wait_for_line("withdrew", |l| {
        l.text.starts_with("withdrew the join request") && field(&l.text, "node") == Some(&id)
    });
    assert_eq!(field(&withdrew, "run"), Some(run.as_str()), "{withdrew}");
    assert_eq!(field(&withdrew, "round"), Some("0"), "{withdrew}");
    assert_eq!(field(&withdrew, "reason"), Some("Cancelled"), "{withdrew}");
    assert_eq!(
        field(&withdrew, "sealed_first"),
        Some("false"),
        "{withdrew}"
    );
    let failed = wait_for_line("next failed", |l| {
        l.text.starts_with("next failed") && field(&l.text, "node") == Some(&id)
    });
    assert_eq!(field(&failed, "round"), Some("0"), "{failed}");

    // Two members; one leaves; the other, polling num_lost, names it.
    let nodes = on_threads(2, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        node.next().unwrap();
        node
    });
    drop(alone);
    let (stays, leaves) = (&nodes[0], &nodes[1]);
    assert_eq!(stays.num_lost().unwrap(), 0);
    leaves.shutdown().unwrap();
    let lost = wait_for_line("member lost", |l| {
        l.text.starts_with("member of the round lost")
            && field(&l.text, "node") == Some(stays.node_id())
    });
    assert_eq!(field(&lost, "lost"), Some(leaves.node_id()), "{lost}");
    assert!(field(&lost, "round").is_some(), "{lost}");
    assert_eq!(stays.num_lost().unwrap(), 1);
    let count = wait_for_line("lost count", |l| {
        l.text.starts_with("members of the round lost")
            && field(&l.text, "node") == Some(stays.node_id())
    });
    assert_eq!(field(&count, "count"), Some("1"), "{count}");
    stays.shutdown().unwrap();
}

/// With etcd down, a store write retries: each retry at debug with its count, a warning once
/// it lasts over a second, and another when etcd answers again.
fn retries_are_logged_and_a_lasting_one_warns(etcd: &mut Etcd) {
    let url = etcd.url("retry", "min_nodes=1&max_nodes=1&connect_timeout=1");
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let (_, store) = node.next().unwrap();
    let me = node.node_id().to_string();
    let mine = |l: &Line, prefix: &str| {
        l.text.starts_with(prefix) && field(&l.text, "node") == Some(me.as_str())
    };
    etcd.kill();
    let writer = std::thread::spawn(move || store.set("k", b"v"));
    let warned = wait_for_line("keeps failing", |l| mine(l, "etcd keeps failing"));
    assert!(warned.contains(r#" what="store set" "#), "{warned}");
    assert_eq!(field(&warned, "round"), Some("0"), "{warned}");
    etcd.restart();
    writer.join().unwrap().unwrap();
    let again = wait_for_line("answered again", |l| mine(l, "etcd answered again"));
    assert!(field(&again, "attempts").is_some(), "{again}");
    let lines = LINES.lock().unwrap();
    let retries: Vec<_> = lines
        .iter()
        .filter(|l| mine(l, "etcd request failed; retrying"))
        .collect();
    assert!(!retries.is_empty());
    assert!(retries.iter().all(|l| l.level == Level::DEBUG));
    assert_eq!(field(&retries[0].text, "attempt"), Some("1"));
    let warnings = lines
        .iter()
        .filter(|l| mine(l, "etcd keeps failing") && l.level == Level::WARN)
        .count();
    assert_eq!(warnings, 1, "one warning per lasting failure");
    drop(lines);
    node.shutdown().unwrap();
    take_lines();
}

/// 8 real nodes run 10 rounds while 8 threads each make 2,000 records and another thread
/// replaces the handler again and again. Every record arrives exactly once, each source's
/// records in the order it made them, and no replaced handler is called after its
/// replacement returned.
fn a_flood_while_the_handler_changes_keeps_order(etcd: &Etcd, first: &'static Generation) {
    const SOURCES: usize = 8;
    const PER_SOURCE: u64 = 2000;
    const ROUNDS: u64 = 10;
    let url = etcd.url("flood", "min_nodes=8&max_nodes=8");
    let run = common::node::run_of(&url);
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut current = first;
            let mut swaps = 0u32;
            while !stop.load(Ordering::SeqCst) {
                current = install_collect(Some(current));
                swaps += 1;
                std::thread::yield_now();
            }
            swaps
        }
    });
    let nodes = std::thread::spawn(move || {
        on_threads(8, move |_| {
            let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
            for _ in 0..ROUNDS {
                node.next().unwrap();
            }
            node.shutdown().unwrap();
        })
    });
    on_threads(SOURCES, |src| {
        for seq in 0..PER_SOURCE {
            tracing::info!(target: "rdzv::flood", src, seq, "flood");
        }
    });
    nodes.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 10, "the handler was replaced only {swaps} times");
    assert_eq!(
        CALLS_AFTER_RETIREMENT.load(Ordering::SeqCst),
        0,
        "a handler was called after set_handler replaced it"
    );

    let lines = take_lines();
    let mut seqs: HashMap<usize, Vec<u64>> = HashMap::new();
    for l in lines.iter().filter(|l| l.target == "rdzv::flood") {
        let src = field(&l.text, "src").unwrap().parse().unwrap();
        seqs.entry(src)
            .or_default()
            .push(field(&l.text, "seq").unwrap().parse().unwrap());
    }
    assert_eq!(seqs.len(), SOURCES);
    for (src, got) in seqs {
        assert!(
            got == (0..PER_SOURCE).collect::<Vec<_>>(),
            "source {src}: {} records, not 0..{PER_SOURCE} in order",
            got.len()
        );
    }
    let mut by_node: HashMap<&str, Vec<(&str, u64)>> = HashMap::new();
    for l in lines
        .iter()
        .filter(|l| field(&l.text, "run") == Some(run.as_str()))
    {
        let kind = if l.text.starts_with("joined round") {
            "joined"
        } else if l.text.starts_with("round complete") {
            "complete"
        } else {
            continue;
        };
        let round = field(&l.text, "round").unwrap().parse().unwrap();
        by_node
            .entry(field(&l.text, "node").unwrap())
            .or_default()
            .push((kind, round));
    }
    assert_eq!(by_node.len(), 8);
    let expected: Vec<(&str, u64)> = (0..ROUNDS)
        .flat_map(|r| [("joined", r), ("complete", r)])
        .collect();
    for (node, seq) in by_node {
        assert_eq!(seq, expected, "node {node}: records out of order");
    }
}

static REENTERED: AtomicUsize = AtomicUsize::new(0);

/// Calls rdzv from inside: logs (dropped: a handler never runs inside itself) and replaces
/// itself (must not wait for itself).
fn reenter(record: &Record<'_>) {
    if record.line.starts_with("inside") {
        REENTERED.fetch_add(1000, Ordering::SeqCst); // must never happen
        return;
    }
    REENTERED.fetch_add(1, Ordering::SeqCst);
    tracing::info!(target: "rdzv::reenter", "inside the handler");
    set_handler(Some(Arc::new(reenter)));
}

fn handlers_that_reenter_or_panic_do_no_harm() {
    set_handler(Some(Arc::new(reenter)));
    on_threads(4, |_| {
        for _ in 0..50 {
            tracing::info!(target: "rdzv::reenter", "outside");
        }
    });
    assert_eq!(REENTERED.load(Ordering::SeqCst), 200);

    // A Rust handler that panics loses that record; the thread that logged carries on.
    let kept = Arc::new(Mutex::new(Vec::new()));
    rdzv::log::set_handler(Some(Arc::new({
        let kept = kept.clone();
        move |record: &rdzv::log::Record<'_>| {
            if record.line.starts_with("boom") {
                panic!("a broken handler");
            }
            kept.lock().unwrap().push(record.line.to_string());
        }
    })));
    tracing::info!(target: "rdzv::panic", "boom");
    tracing::info!(target: "rdzv::panic", n = 2, "after");
    assert_eq!(*kept.lock().unwrap(), vec!["after n=2".to_string()]);
}

/// What `hold` has seen: which threads are inside it, and whether the one holding may leave.
#[derive(Default)]
struct Hold {
    inside: Vec<&'static str>,
    release: bool,
    replaced_by_a: bool,
}
static HOLD: Mutex<Hold> = Mutex::new(Hold {
    inside: Vec::new(),
    release: false,
    replaced_by_a: false,
});
static HOLD_CHANGED: Condvar = Condvar::new();
static AFTER_HOLD: AtomicUsize = AtomicUsize::new(0);

/// Thread "b" stays inside until released; thread "a", once "b" is inside, replaces the
/// handler from inside it (and must then wait for "b" only).
fn hold(record: &Record<'_>) {
    let who = match record.line {
        "hold b" => "b",
        "hold a" => "a",
        _ => return,
    };
    let mut hold = HOLD.lock().unwrap();
    hold.inside.push(who);
    HOLD_CHANGED.notify_all();
    if who == "b" {
        while !hold.release {
            hold = HOLD_CHANGED.wait(hold).unwrap();
        }
        return;
    }
    while !hold.inside.contains(&"b") {
        hold = HOLD_CHANGED.wait(hold).unwrap();
    }
    drop(hold);
    set_handler(Some(Arc::new(after_hold)));
    HOLD.lock().unwrap().replaced_by_a = true;
    HOLD_CHANGED.notify_all();
}

fn after_hold(_: &Record<'_>) {
    AFTER_HOLD.fetch_add(1, Ordering::SeqCst);
}

/// Linux's scheduler state of one of this process's threads ('R' running, 'S' asleep, ...).
fn thread_state(tid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // The state follows the command name, which is in parentheses and may contain spaces.
    stat.rsplit_once(") ").unwrap().1.chars().next().unwrap()
}

/// The interleaving that once hung: thread "a", inside the handler, replaces it while thread
/// "b" is inside too; "a" waits, and "b" leaving must wake it (the wake-up used to come only
/// when nobody was left inside, which "a" itself never is). Made deterministic by watching
/// "a" fall asleep in that wait before "b" is let go.
fn replacing_from_inside_returns_when_the_other_thread_leaves() {
    set_handler(Some(Arc::new(hold)));
    let b = std::thread::spawn(|| tracing::info!(target: "rdzv::hold", "hold b"));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let a = std::thread::spawn(move || {
        tid_tx.send(unsafe { libc::gettid() }).unwrap();
        tracing::info!(target: "rdzv::hold", "hold a");
        let _ = done_tx.send(());
    });
    let a_tid = tid_rx.recv().unwrap();
    // The new handler is in place once a record made here reaches it; "a" then waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while AFTER_HOLD.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "'a' never replaced the handler"
        );
        tracing::info!(target: "rdzv::hold", "probe");
        std::thread::yield_now();
    }
    while thread_state(a_tid) != 'S' {
        assert!(std::time::Instant::now() < deadline, "'a' never waited");
        std::thread::yield_now();
    }
    assert!(
        !HOLD.lock().unwrap().replaced_by_a,
        "'a' did not wait for 'b'"
    );
    HOLD.lock().unwrap().release = true;
    HOLD_CHANGED.notify_all();
    done_rx.recv_timeout(Duration::from_secs(30)).expect(
        "set_handler, called from inside the handler, still waits after the only \
         other thread inside left: a lost wake-up",
    );
    a.join().unwrap();
    b.join().unwrap();
    assert!(HOLD.lock().unwrap().replaced_by_a);
}

/// Records are delivered on runtime threads and inside other calls' block_on: a handler's
/// blocking call there once panicked ("Cannot start a runtime from within a runtime"), and a
/// handle dropped there never shut down (its alive key stayed until its lease expired).
fn a_handler_may_make_blocking_calls(etcd: &Etcd) {
    let url = etcd.url("reenter-blocking", "min_nodes=1");
    let observer = Arc::new(BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap());
    let victim = Arc::new(Mutex::new(Some(
        BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap(),
    )));
    let victim_id = victim
        .lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .node_id()
        .to_string();
    let results = Arc::new(Mutex::new(Vec::new()));
    rdzv::log::set_handler(Some(Arc::new({
        let (observer, victim, results) = (observer.clone(), victim.clone(), results.clone());
        move |record: &rdzv::log::Record<'_>| {
            results
                .lock()
                .unwrap()
                .push(observer.is_closed().map_err(|e| e.to_string()));
            if record.line.starts_with("round complete") {
                drop(victim.lock().unwrap().take()); // shuts the node down, here
            }
        }
    })));
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    node.next().unwrap();
    node.shutdown().unwrap();
    rdzv::log::set_handler(None);
    let results = std::mem::take(&mut *results.lock().unwrap());
    assert!(!results.is_empty());
    let failed: Vec<_> = results.iter().filter(|r| **r != Ok(false)).collect();
    assert!(
        failed.is_empty(),
        "blocking calls from the handler failed: {failed:?}"
    );
    assert!(
        victim.lock().unwrap().is_none(),
        "the handler never dropped the handle"
    );
    let (rt, mut client) = common::etcd_client(etcd);
    let run = common::node::run_of(&url);
    let alive = rt
        .block_on(client.get(format!("/rdzv/{run}/alive/{victim_id}"), None))
        .unwrap();
    assert_eq!(
        alive.kvs().len(),
        0,
        "the handle dropped in the handler did not shut down"
    );
    observer.shutdown().unwrap();
}
