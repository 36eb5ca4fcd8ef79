//! `rdzv-node`: one rendezvous node as a process, for the demo, the multi-process tests, the
//! chaos run and the benchmark. Prints one JSON line per completed round on stdout and one
//! JSON line for an error, then exits (0 on success, 2 on a rendezvous error, 64 on bad usage).
//!
//! ```text
//! rdzv-node URL [--rounds N|forever] [--follow] [--exchange] [--close]
//!               [--history FILE] [--keep-going] [--churn SECS]
//! ```
//! `--rounds N`  take part in N rounds in a row (default 1); `forever` for no limit.
//! `--follow`    between rounds, stay in the round until another node waits or a member is
//!               lost (the way an elastic agent monitors its round), then call next again.
//! `--exchange`  in each round, publish this node's id under its rank, read every other
//!               rank's from the round's store and add 1 to a shared counter. Alone, the round's
//!               line reports what was read. With `--follow` the exchange runs on a thread of
//!               its own beside the monitoring (as a worker beside its agent), and then keeps
//!               writing `step/RANK` and reading the next rank's `step` every 200 ms until the
//!               node leaves the round.
//! `--close`     close the run after the last round.
//! `--history FILE`  append every event this node observes to FILE as JSON lines, each with
//!               the node id and a CLOCK_MONOTONIC time in nanoseconds (`t`; store calls also
//!               `t_end`), so the files of all nodes on one machine merge into one history:
//!               `start`, `next` (called), `sealed` (round, rank, world_size, members, master),
//!               `set`/`read`/`add` (round, key, value), `counts` (waiting, lost: when they
//!               change), `error` (op, kind, message), `exit`.
//! `--keep-going` an error does not end the process: it is reported and the node calls next
//!               again, until the run is closed (then it exits 0).
//! `--churn SECS` with `--follow`, rank 0 calls next after SECS in a round even when nothing
//!               changed (as an agent does when a worker fails), so that rounds keep forming.

use rdzv::{BlockingRendezvous, BlockingStore, CancelToken, Error, ErrorKind, Params, RoundInfo};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: rdzv-node URL [--rounds N|forever] [--follow] [--exchange] [--close] \
                     [--history FILE] [--keep-going] [--churn SECS]";

struct Options {
    url: String,
    /// None: no limit.
    rounds: Option<u64>,
    follow: bool,
    exchange: bool,
    close: bool,
    history: Option<String>,
    keep_going: bool,
    churn: Option<Duration>,
}

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or(USAGE)?;
    let mut o = Options {
        url,
        rounds: Some(1),
        follow: false,
        exchange: false,
        close: false,
        history: None,
        keep_going: false,
        churn: None,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                o.rounds = match args.next().as_deref() {
                    Some("forever") => None,
                    n => Some(
                        n.and_then(|n| n.parse().ok())
                            .ok_or("--rounds: expected a whole number or `forever`")?,
                    ),
                }
            }
            "--follow" => o.follow = true,
            "--exchange" => o.exchange = true,
            "--close" => o.close = true,
            "--history" => o.history = Some(args.next().ok_or("--history: expected a file")?),
            "--keep-going" => o.keep_going = true,
            "--churn" => {
                let secs: f64 = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or("--churn: expected a positive number of seconds")?;
                o.churn = Some(Duration::from_secs_f64(secs));
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(o)
}

fn error_line(e: &Error) -> String {
    json!({ "error": format!("{:?}", e.kind()), "message": e.message() }).to_string()
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the machine.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Cannot fail for CLOCK_MONOTONIC with a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `--history` file (or nothing): one JSON line per event, written whole with O_APPEND.
struct History {
    node: String,
    file: Option<Mutex<std::fs::File>>,
}

impl History {
    fn open(path: Option<&str>, node: &str) -> std::io::Result<History> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            )),
            None => None,
        };
        Ok(History {
            node: node.to_string(),
            file,
        })
    }

    /// Records `event` with `fields`, stamped now (`t`) unless `fields` has its own `t`.
    fn record(&self, event: &str, mut fields: Value) {
        let Some(file) = &self.file else { return };
        let t = fields.get("t").cloned().unwrap_or(json!(monotonic_ns()));
        fields["t"] = t;
        fields["node"] = json!(self.node);
        fields["ev"] = json!(event);
        let mut line = fields.to_string();
        line.push('\n');
        let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
        // A history that cannot be written is a broken test setup: say so loudly.
        file.write_all(line.as_bytes())
            .expect("cannot append to the history file");
    }

    fn error(&self, op: &str, round: Option<u64>, e: &Error) {
        self.record(
            "error",
            json!({ "op": op, "round": round, "kind": format!("{:?}", e.kind()), "message": e.message() }),
        );
    }

    /// Runs one store call and records it: `event` with its result, or an error.
    fn store_call<T>(
        &self,
        event: &str,
        round: u64,
        key: &str,
        call: impl FnOnce() -> Result<T, Error>,
        value: impl FnOnce(&T) -> Value,
    ) -> Result<T, Error> {
        let t = monotonic_ns();
        let result = call();
        let t_end = monotonic_ns();
        match &result {
            Ok(v) => self.record(
                event,
                json!({ "t": t, "t_end": t_end, "round": round, "key": key, "value": value(v) }),
            ),
            Err(e) => self.error(event, Some(round), e),
        }
        result
    }
}

fn text(bytes: &[u8]) -> Value {
    json!(String::from_utf8_lossy(bytes))
}

/// The synchronous exchange of a node that does not follow: the fields of its round line.
fn exchange(
    rdzv: &BlockingRendezvous,
    info: &RoundInfo,
    store: &BlockingStore,
    h: &History,
) -> Result<Value, Error> {
    let (round, me) = (info.round, rdzv.node_id());
    let own = format!("node/{}", info.rank);
    let value = format!("{me}/{round}/0");
    h.store_call(
        "set",
        round,
        &own,
        || store.set(&own, value.as_bytes()),
        |_| json!(value),
    )?;
    let keys: Vec<String> = (0..info.world_size).map(|r| format!("node/{r}")).collect();
    let ids = read_all(
        store,
        round,
        &keys,
        Some(Duration::from_secs(60)),
        &CancelToken::new(),
        h,
    )?;
    let total = h.store_call(
        "add",
        round,
        "arrived",
        || store.add("arrived", 1),
        |v| json!(v),
    )?;
    let own_id_ok = ids[info.rank as usize] == value.as_bytes();
    Ok(json!({ "peers_read": ids.len(), "own_id_ok": own_id_ok, "add_result": total }))
}

/// `multi_get` of `keys`, recording each value read.
fn read_all(
    store: &BlockingStore,
    round: u64,
    keys: &[String],
    timeout: Option<Duration>,
    stop: &CancelToken,
    h: &History,
) -> Result<Vec<Vec<u8>>, Error> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let t = monotonic_ns();
    let result = store.multi_get_with(&refs, timeout, stop);
    let t_end = monotonic_ns();
    match &result {
        Ok(values) => {
            for (key, v) in keys.iter().zip(values) {
                h.record(
                    "read",
                    json!({ "t": t, "t_end": t_end, "round": round, "key": key, "value": text(v) }),
                );
            }
        }
        Err(e) => h.error("read", Some(round), e),
    }
    result
}

/// The work of one round beside the monitoring (with `--follow --exchange`): the exchange,
/// then a step every 200 ms, until stopped or a store call fails. Detached: a worker that
/// outlives its round (a call still running when the node moved on) ends on its own, and what
/// it does then is recorded too.
struct Worker {
    /// Ends the worker's store waits, and its loop: a token, so that a stop made just before a
    /// wait starts is not lost.
    stop: CancelToken,
}

impl Worker {
    fn spawn(node: &str, info: &RoundInfo, store: BlockingStore, h: Arc<History>) -> Worker {
        let stop = CancelToken::new();
        let (node, info, stop2) = (node.to_string(), info.clone(), stop.clone());
        std::thread::spawn(move || {
            let _ = work(&node, &info, &store, &stop2, &h);
        });
        Worker { stop }
    }

    fn stop(self) {
        self.stop.cancel();
    }
}

fn work(
    node: &str,
    info: &RoundInfo,
    store: &BlockingStore,
    stop: &CancelToken,
    h: &History,
) -> Result<(), Error> {
    let (round, rank, world) = (info.round, info.rank, info.world_size);
    let own = format!("node/{rank}");
    let value = format!("{node}/{round}/0");
    h.store_call(
        "set",
        round,
        &own,
        || store.set(&own, value.as_bytes()),
        |_| json!(value),
    )?;
    let keys: Vec<String> = (0..world).map(|r| format!("node/{r}")).collect();
    read_all(store, round, &keys, Some(Duration::from_secs(30)), stop, h)?;
    h.store_call(
        "add",
        round,
        "arrived",
        || store.add("arrived", 1),
        |v| json!(v),
    )?;
    let (mine, theirs) = (
        format!("step/{rank}"),
        format!("step/{}", (rank + 1) % world),
    );
    for step in 1u64.. {
        if stop.is_cancelled() {
            break;
        }
        let value = format!("{node}/{round}/{step}");
        h.store_call(
            "set",
            round,
            &mine,
            || store.set(&mine, value.as_bytes()),
            |_| json!(value),
        )?;
        let timeout = Some(Duration::from_secs(10));
        h.store_call(
            "read",
            round,
            &theirs,
            || store.get_with(&theirs, timeout, stop),
            |v| text(v),
        )?;
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// How an agent's monitoring of its round ended.
enum Monitor {
    /// The round must change (or monitoring failed): call next.
    Rejoin,
    /// The run was closed.
    Closed,
}

/// An elastic agent's monitor loop: stay until the round needs to change.
fn monitor(
    rdzv: &BlockingRendezvous,
    info: &RoundInfo,
    o: &Options,
    h: &History,
) -> Result<Monitor, Error> {
    let entered = Instant::now();
    let mut seen = (0, 0);
    for poll in 0u64.. {
        let counts = rdzv.num_waiting().and_then(|w| Ok((w, rdzv.num_lost()?)));
        let (waiting, lost) = match counts {
            Ok(c) => c,
            Err(e) if o.keep_going => {
                h.error("monitor", Some(info.round), &e);
                println!("{}", error_line(&e));
                return Ok(Monitor::Rejoin);
            }
            Err(e) => return Err(e),
        };
        if (waiting, lost) != seen {
            seen = (waiting, lost);
            h.record(
                "counts",
                json!({ "round": info.round, "waiting": waiting, "lost": lost }),
            );
        }
        if waiting > 0 || lost > 0 {
            println!(
                "{}",
                json!({ "event": "change", "waiting": waiting, "lost": lost })
            );
            return Ok(Monitor::Rejoin);
        }
        if info.rank == 0 && o.churn.is_some_and(|c| entered.elapsed() >= c) {
            h.record("churn", json!({ "round": info.round }));
            return Ok(Monitor::Rejoin);
        }
        if o.keep_going && poll % 10 == 9 {
            match rdzv.is_closed() {
                Ok(true) => return Ok(Monitor::Closed),
                Ok(false) => {}
                Err(e) => {
                    h.error("monitor", Some(info.round), &e);
                    return Ok(Monitor::Rejoin);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    unreachable!("the monitor loop only ends by returning")
}

/// True for the errors that end a node even with `--keep-going`: the run is over for it.
fn final_error(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Closed | ErrorKind::GracefulExit | ErrorKind::Shutdown
    )
}

fn take_part(rdzv: &BlockingRendezvous, o: &Options, h: &Arc<History>) -> Result<(), Error> {
    let mut done = 0u64;
    let mut worker: Option<Worker> = None;
    while o.rounds.is_none_or(|n| done < n) {
        // An agent stops its workers before it re-rendezvouses.
        if let Some(w) = worker.take() {
            w.stop();
        }
        h.record("next", json!({}));
        let (info, store) = match rdzv.next() {
            Ok(got) => got,
            Err(e) => {
                h.error("next", None, &e);
                if !o.keep_going || final_error(&e) {
                    return Err(e);
                }
                println!("{}", error_line(&e));
                // Pacing, so an error that comes back at once does not spin.
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        done += 1;
        // The whole member list is read only for the history (a node's `next` reads just its
        // own rank): the checker compares every member's view of the round.
        let members = match h.file.is_some() {
            true => rdzv
                .members()
                .map(|m| json!(&*m))
                .unwrap_or_else(|e| json!({"error": e.message()})),
            false => Value::Null,
        };
        h.record(
            "sealed",
            json!({
                "round": info.round,
                "rank": info.rank,
                "world_size": info.world_size,
                "members": members,
                "master": format!("{}:{}", info.master_addr, info.master_port),
            }),
        );
        let mut line = json!({
            "node": rdzv.node_id(),
            "pid": std::process::id(),
            "round": info.round,
            "rank": info.rank,
            "world_size": info.world_size,
            "master_addr": info.master_addr,
            "master_port": info.master_port,
        });
        let more = o.rounds.is_none_or(|n| done < n);
        if o.exchange && o.follow && more {
            worker = Some(Worker::spawn(rdzv.node_id(), &info, store, h.clone()));
        } else if o.exchange {
            match exchange(rdzv, &info, &store, h) {
                Ok(fields) => {
                    for (k, v) in fields.as_object().into_iter().flatten() {
                        line[k] = v.clone();
                    }
                }
                Err(e) if o.keep_going && !final_error(&e) => {
                    println!("{}", error_line(&e))
                }
                Err(e) => return Err(e),
            }
        }
        println!("{line}");
        if o.follow && more {
            if let Monitor::Closed = monitor(rdzv, &info, o, h)? {
                break;
            }
        }
    }
    if let Some(w) = worker.take() {
        w.stop();
    }
    if o.close {
        rdzv.set_closed()?;
    }
    rdzv.shutdown()
}

fn main() {
    // Records to stderr, filtered by RDZV_LOG (warnings only by default).
    rdzv::log::install_default();
    let options = match parse_args() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(64);
        }
    };
    let fail = |e: Error| -> ! {
        println!("{}", error_line(&e));
        std::process::exit(2);
    };
    let params = Params::from_url(&options.url).unwrap_or_else(|e| fail(e));
    let rdzv = BlockingRendezvous::new(params).unwrap_or_else(|e| fail(e));
    let history = match History::open(options.history.as_deref(), rdzv.node_id()) {
        Ok(h) => Arc::new(h),
        Err(e) => {
            eprintln!("--history: cannot open the file: {e}");
            std::process::exit(64);
        }
    };
    history.record("start", json!({ "pid": std::process::id() }));
    // Report a failure before shutting down: shutdown may take up to close_timeout when etcd
    // is unreachable, and whoever reads this output should not wait for that.
    let result = take_part(&rdzv, &options, &history);
    let code = match &result {
        Ok(()) => 0,
        Err(e)
            if options.keep_going
                && matches!(e.kind(), ErrorKind::Closed | ErrorKind::GracefulExit) =>
        {
            0
        }
        Err(_) => 2,
    };
    if let Err(e) = &result {
        println!("{}", error_line(e));
        let _ = std::io::stdout().flush();
    }
    history.record("exit", json!({ "code": code }));
    if result.is_err() {
        let _ = rdzv.shutdown();
    }
    std::process::exit(code);
}
