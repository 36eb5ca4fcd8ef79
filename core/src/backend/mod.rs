//! The etcd v3 backend: one shared connection per process and endpoint set, every request
//! bounded by a deadline, transient failures (leader change, dropped connection, etcd
//! restarting) retried with backoff, and failures classified into rdzv's error family.
//!
//! This file holds the connection's handle and its requests (`call` and its retries, reads,
//! transactions, watches). Submodules, each using only those listed before it (and the
//! handle): `keys` (the key layout), `failure` (what an etcd failure means), `term` (the
//! dead-leader probe), `lease` (leases and their refresh streams), `watch` (watches over
//! shared streams), `connect` (opening the shared connection), `election` (the election's
//! transactions).

pub mod keys;

mod failure;

mod term;

pub(crate) mod lease;

pub(crate) mod watch;

mod connect;

pub(crate) mod election;

pub(crate) use failure::is_compacted;
pub use failure::to_error;
pub use lease::Lease;
pub use term::RaftTerm;
pub use watch::Watch;

use failure::{classify, Failure};

use crate::error::{Error, Result};
use etcd_client::Client;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The target of this module's log records, which the rooms split out of it keep: hosts
/// filter and route records by target (`RDZV_LOG`, the log handler), so the split changes none.
const LOG_TARGET: &str = module_path!();

/// etcd's default `--max-request-bytes` is 1.5 MiB; keep headroom for keys and framing.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024 + 512 * 1024 - 4096;

/// Retrying is routine (an etcd leader change, a restart); retrying for longer than this is
/// logged as a warning.
const RETRY_WARNING: Duration = Duration::from_secs(1);

/// A connection to one etcd cluster, shared by every handle of this process that names the
/// same endpoints and credentials (HTTP/2 multiplexes them), so a thousand nodes in one
/// process do not open a thousand sockets.
#[derive(Clone)]
pub struct Etcd {
    shared: Arc<Connection>,
    attempt_timeout: Duration,
    /// Whether an attempt outstanding across an etcd leader change is abandoned and sent
    /// again (see `call_until`). Only for requests a repeat cannot harm: a node's rendezvous
    /// writes are all guarded, while a store's `add` repeated after it landed would count
    /// twice.
    restart_on_new_term: bool,
    who: Who,
}

/// Whom requests are made for: named in the log records of retries.
#[derive(Clone, Default)]
pub struct Who {
    pub run: Option<Arc<str>>,
    pub node: Option<Arc<str>>,
    pub round: Option<u64>,
}

struct Connection {
    client: Client,
    endpoints: String,
    /// The server's version, as its status call reported it when connecting.
    version: String,
    /// The highest raft term a response has carried. etcd's term grows with every leader
    /// election, so a higher one means the cluster changed leader.
    term: tokio::sync::watch::Sender<u64>,
    /// When a stuck request may next ask etcd for its term: one probe at a time per
    /// connection, however many requests are stuck.
    next_term_probe: Mutex<Instant>,
    /// A key these credentials may read (the first run's `current`): the term probe reads it.
    term_probe_key: String,
    /// The leases this process holds on this connection, refreshed over streams of 32.
    keep_alives: lease::KeepAlives,
    /// The watches of this process on this connection, over four streams.
    watches: watch::Watches,
}

impl Etcd {
    pub fn endpoints(&self) -> &str {
        &self.shared.endpoints
    }

    /// The etcd server's version ("3.5.17"), or "unknown" if its status call failed.
    pub fn server_version(&self) -> &str {
        &self.shared.version
    }

    /// This connection for a node's rendezvous, with its requests' log records naming `run`
    /// and `node`. Its requests are sent again when they were outstanding across an etcd
    /// leader change (all of them are guarded, so a repeat of one that landed is harmless).
    pub fn for_node(&self, run: &str, node: &str) -> Etcd {
        let mut etcd = self.clone();
        etcd.restart_on_new_term = true;
        etcd.who = Who {
            run: Some(run.into()),
            node: Some(node.into()),
            round: None,
        };
        etcd
    }

    /// This connection for a round's store, with its requests' log records naming `round`
    /// too. A store request outstanding across a leader change is awaited, not repeated.
    pub fn in_round(&self, round: u64) -> Etcd {
        let mut etcd = self.clone();
        etcd.restart_on_new_term = false;
        etcd.who.round = Some(round);
        etcd
    }

    pub fn who(&self) -> &Who {
        &self.who
    }

    pub(crate) fn keep_alives(&self) -> &lease::KeepAlives {
        &self.shared.keep_alives
    }

    pub fn client(&self) -> Client {
        self.shared.client.clone()
    }

    /// Runs `op` until it succeeds, fails for good, or `deadline` passes. Transient failures are
    /// retried with exponential backoff; each attempt is bounded so a silent etcd cannot hang
    /// the caller. `what` names the operation in error messages.
    pub async fn call<T, F, Fut>(&self, deadline: Instant, what: &str, op: F) -> Result<T>
    where
        T: RaftTerm,
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call_until(deadline, what, None, op).await
    }

    /// As `call`, but stops retrying (never in the middle of an attempt) once `give_up` turns
    /// true. Writes whose outcome must be known use this: an attempt in flight is always
    /// awaited, so its effect is never in doubt unless etcd itself did not answer.
    ///
    /// etcd does not answer a request whose proposal was lost with a dead leader until its
    /// own request timeout (5 s plus two election timeouts, 7 s by default). With
    /// `restart_on_new_term`, an attempt still unanswered once etcd reports a new leader
    /// (a higher raft term) is abandoned and sent again, so a round goes on about a second
    /// after the election instead.
    pub async fn call_until<T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        give_up: Option<tokio::sync::watch::Receiver<bool>>,
        op: F,
    ) -> Result<T>
    where
        T: RaftTerm,
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call_on(deadline, what, give_up, Client::clone, op)
            .await
    }

    /// As `call_until`, with `op` given only the part of the client it uses (`part`, such as
    /// `Client::kv_client`): a whole client clones a channel for each of etcd's services, on
    /// every attempt of every request.
    async fn call_on<C, T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        mut give_up: Option<tokio::sync::watch::Receiver<bool>>,
        part: fn(&Client) -> C,
        mut op: F,
    ) -> Result<T>
    where
        T: RaftTerm,
        F: FnMut(C) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let mut attempt = 0u32;
        let started = Instant::now();
        let mut warned = false;
        loop {
            let attempt_deadline = deadline.min(Instant::now() + self.attempt_timeout);
            let term = *self.shared.term.borrow();
            let answered = tokio::select! {
                answered = tokio::time::timeout_at(attempt_deadline, op(part(&self.shared.client))) => Some(answered),
                _ = self.new_leader_since(term), if self.restart_on_new_term => None,
            };
            let last = match answered {
                // Retried like any transient failure (the first backoff is 25 ms).
                None => Error::connection(format!(
                    "etcd at {} changed leader while {what} was unanswered; sending it again",
                    self.endpoints()
                )),
                Some(Ok(Ok(value))) => {
                    if let Some(term) = value.raft_term() {
                        self.saw_term(term);
                    }
                    if warned {
                        tracing::warn!(
                            run = self.who.run.as_deref(),
                            node = self.who.node.as_deref(),
                            round = self.who.round,
                            what,
                            attempts = attempt + 1,
                            failing_ms = started.elapsed().as_millis() as u64,
                            "etcd answered again"
                        );
                    }
                    return Ok(value);
                }
                Some(Ok(Err(err))) => match classify(&err) {
                    Failure::Transient => to_error(self.endpoints(), what, &err),
                    _ => return Err(to_error(self.endpoints(), what, &err)),
                },
                Some(Err(_)) => Error::connection(format!(
                    "etcd at {} did not answer {what} in time",
                    self.endpoints()
                )),
            };
            if Instant::now() >= deadline {
                return Err(last);
            }
            // Retries are routine (leader change, restart); one that lasts is worth a warning.
            let who = &self.who;
            if !warned && started.elapsed() > RETRY_WARNING {
                warned = true;
                tracing::warn!(run = who.run.as_deref(), node = who.node.as_deref(), round = who.round,
                    what, attempts = attempt + 1, failing_ms = started.elapsed().as_millis() as u64,
                    error = %last, "etcd keeps failing; still retrying");
            } else {
                tracing::debug!(run = who.run.as_deref(), node = who.node.as_deref(), round = who.round,
                    what, attempt = attempt + 1, error = %last, "etcd request failed; retrying");
            }
            match give_up.as_mut() {
                Some(stop) => tokio::select! {
                    _ = backoff(&mut attempt, deadline) => {}
                    _ = stop.wait_for(|stop| *stop) => return Err(last),
                },
                None => backoff(&mut attempt, deadline).await,
            }
        }
    }
}

/// Sleeps until `at`, or forever when there is none: a `select!` branch for an optional
/// deadline (a stream's stuck or idle time).
pub async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sleeps 25 ms, doubling up to 800 ms, plus up to half again of jitter so retrying nodes
/// spread out; never past `deadline`.
pub async fn backoff(attempt: &mut u32, deadline: Instant) {
    let delay = backoff_delay(attempt);
    tokio::time::sleep_until(deadline.min(Instant::now() + delay)).await;
}

/// `backoff`'s delay for this attempt (counted).
pub fn backoff_delay(attempt: &mut u32) -> Duration {
    let base = Duration::from_millis(25u64 << (*attempt).min(5));
    *attempt += 1;
    base + base.mul_f64(crate::util::random_unit() * 0.5)
}

impl Etcd {
    /// One range read (a key, or a prefix/count/keys-only read per `options`), retried on
    /// transient failure.
    pub async fn get(
        &self,
        deadline: Instant,
        what: &str,
        key: String,
        options: etcd_client::GetOptions,
    ) -> Result<etcd_client::GetResponse> {
        self.call_on(deadline, what, None, Client::kv_client, move |mut kv| {
            let (key, options) = (key.clone(), options.clone());
            async move { kv.get(key, Some(options)).await }
        })
        .await
    }

    /// One transaction, retried as a whole on transient failure. Every transaction rdzv sends
    /// is guarded by compares, so a retry after an ambiguous failure cannot apply twice.
    pub async fn txn(
        &self,
        deadline: Instant,
        what: &str,
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse> {
        self.txn_until(deadline, what, None, txn).await
    }

    /// One transaction that stops retrying once `give_up` turns true (see `call_until`).
    pub async fn txn_until(
        &self,
        deadline: Instant,
        what: &str,
        give_up: Option<tokio::sync::watch::Receiver<bool>>,
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse> {
        self.call_on(deadline, what, give_up, Client::kv_client, move |mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Opens one watch stream over several keys or prefixes, starting now, and returns once
    /// etcd has confirmed every watcher. Callers read their snapshot *after* this call: every
    /// change after the read is then delivered, and events between the watch's start and the
    /// read only repeat what the read shows (whole-key puts and deletes, harmless to replay).
    /// Watching from the current revision rather than a past one keeps the watcher in etcd's
    /// synced group, which is notified at once; a watcher that starts in the past waits for
    /// etcd's 100 ms catch-up loop, which made small rounds slow.
    pub async fn watch(&self, targets: &[Target], deadline: Instant) -> Result<Watch> {
        self.shared
            .watches
            .watch(self, targets, None, deadline)
            .await
    }

    /// As `watch`, ending after the first batch with an event `until` matches (see
    /// `watch::Watches::watch`).
    pub async fn watch_until(
        &self,
        targets: &[Target],
        until: watch::Until,
        deadline: Instant,
    ) -> Result<Watch> {
        self.shared
            .watches
            .watch(self, targets, Some(until), deadline)
            .await
    }
}

/// Hands `pending` requests to a stream's queue, in order, for as long as it has room now;
/// the rest wait for room. Returns how many went. The lease refresh and watch streams queue
/// their requests so, while reading answers all along: etcd answers a stream's requests one
/// by one, so a writer blocked on a full stream that stopped reading would stall both sides.
pub(crate) fn hand_over<T, R>(
    queue: &tokio::sync::mpsc::Sender<T>,
    pending: &mut std::collections::VecDeque<R>,
    into: impl Fn(R) -> T,
) -> usize {
    let mut handed = 0;
    while let Some(request) = pending.pop_front() {
        match queue.try_reserve() {
            Ok(permit) => {
                permit.send(into(request));
                handed += 1;
            }
            Err(_) => {
                pending.push_front(request);
                break;
            }
        }
    }
    handed
}

/// Something to watch: one key, or every key under a prefix.
#[derive(Clone, Debug)]
pub enum Target {
    Key(String),
    Prefix(String),
}

impl Target {
    fn options(&self) -> (String, etcd_client::WatchOptions) {
        let options = etcd_client::WatchOptions::new();
        match self {
            Target::Key(k) => (k.clone(), options),
            Target::Prefix(p) => (p.clone(), options.with_prefix()),
        }
    }
}

/// The range results of a transaction, in the order the gets were listed.
pub fn ranges(resp: &etcd_client::TxnResponse) -> Vec<etcd_client::GetResponse> {
    resp.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect()
}
