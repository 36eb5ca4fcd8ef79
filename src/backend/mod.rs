//! The etcd v3 backend: one shared connection per process and endpoint set, every request
//! bounded by a deadline, transient failures (leader change, dropped connection, etcd
//! restarting) retried with backoff, and failures classified into rdzv's error family.

pub(crate) mod election;
pub mod keys;
pub(crate) mod lease;
pub(crate) mod watch;

pub use lease::Lease;
pub use watch::Watch;

use crate::error::{Error, ErrorKind, Result};
use crate::params::{Params, Security};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// etcd's default `--max-request-bytes` is 1.5 MiB; keep headroom for keys and framing.
pub const RDZV_MAX_VALUE_BYTES: usize = 1024 * 1024 + 512 * 1024 - 4096;

/// Retrying is routine (an etcd leader change, a restart); retrying for longer than this is
/// logged as a warning.
const RETRY_WARNING: Duration = Duration::from_secs(1);

/// A request outstanding this long may have been lost with a dead etcd leader: from then on
/// its connection asks etcd for its raft term (once per `TERM_PROBE_EVERY`, whoever asks).
const STUCK_AFTER: Duration = Duration::from_secs(1);
const TERM_PROBE_EVERY: Duration = Duration::from_millis(500);
/// After a new term is seen, entries the old leader had replicated are committed by the new
/// one at once; a request still unanswered this long after is taken as lost.
const NEW_TERM_GRACE: Duration = Duration::from_millis(300);

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

#[derive(Clone, PartialEq, Eq, Hash)]
struct ConnectionKey {
    pid: u32,
    endpoints: Vec<String>,
    https: bool,
    cacert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

static CONNECTIONS: Lazy<Mutex<HashMap<ConnectionKey, Weak<Connection>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

/// One connect at a time per connection key: handles created at once in one process wait for
/// the first one's connection instead of each opening their own.
static CONNECTING: Lazy<Mutex<HashMap<ConnectionKey, Arc<tokio::sync::Mutex<()>>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

impl Etcd {
    /// Connects (or reuses this process's connection) and checks that etcd answers, retrying
    /// until `connect_timeout`.
    pub async fn connect(params: &Params) -> Result<Etcd> {
        let key = connection_key(params);
        let attempt_timeout = params.connect_timeout();
        let reuse = |key: &ConnectionKey| {
            let cached = CONNECTIONS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(key)
                .and_then(Weak::upgrade);
            cached.map(|shared| Etcd {
                shared,
                attempt_timeout,
                restart_on_new_term: false,
                who: Who::default(),
            })
        };
        if let Some(etcd) = reuse(&key) {
            return Ok(etcd);
        }
        let endpoints = params.endpoints().join(",");
        let deadline = Instant::now() + params.connect_timeout();
        let gate = CONNECTING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        // Waiting counts against this caller's own connect_timeout: if the connect ahead of it
        // hangs until its own timeout, this one fails at its deadline instead of queueing.
        let Ok(_one_at_a_time) = tokio::time::timeout_at(deadline, gate.lock()).await else {
            return Err(unreachable(&endpoints, params.connect_timeout()));
        };
        if let Some(etcd) = reuse(&key) {
            return Ok(etcd);
        }
        let options = connect_options(params)?;
        let urls: Vec<String> = params
            .endpoints()
            .iter()
            .map(|e| match (e.contains("://"), params.security().https) {
                (true, _) => e.clone(),
                (false, true) => format!("https://{e}"),
                (false, false) => format!("http://{e}"),
            })
            .collect();
        refuse_fast(params.endpoints(), deadline).await?;
        let mut attempt = 0u32;
        let client = loop {
            let try_connect = Client::connect(urls.clone(), Some(options.clone()));
            let err = match tokio::time::timeout_at(deadline, try_connect).await {
                Ok(Ok(client)) => break client,
                Ok(Err(e)) => e,
                Err(_) => return Err(unreachable(&endpoints, params.connect_timeout())),
            };
            match classify(&err) {
                Failure::Transient if Instant::now() < deadline => {
                    backoff(&mut attempt, deadline).await;
                }
                _ => return Err(to_error(&endpoints, "connect", &err)),
            }
        };
        // Best effort and bounded: the version is for the log only.
        let version = match tokio::time::timeout_at(deadline, client.clone().status()).await {
            Ok(Ok(status)) => status.version().to_string(),
            _ => "unknown".to_string(),
        };
        // Lazily-connecting channels report nothing until used: ask for a key to be sure. The
        // key is inside the run's namespace, so a user whose role covers only that prefix
        // passes.
        let probe = keys::Keys::new(params.key_prefix(), params.run_id()).current();
        let shared = Arc::new(Connection {
            client,
            endpoints,
            version,
            term: tokio::sync::watch::Sender::new(0),
            next_term_probe: Mutex::new(Instant::now()),
            term_probe_key: probe.clone(),
            keep_alives: lease::KeepAlives::default(),
            watches: watch::Watches::default(),
        });
        // The node has no id yet; the run names whose connection this is in retry records.
        let etcd = Etcd {
            shared: shared.clone(),
            attempt_timeout,
            restart_on_new_term: false,
            who: Who {
                run: Some(params.run_id().into()),
                ..Who::default()
            },
        };
        let probed = etcd
            .get(
                deadline,
                "connect",
                probe,
                etcd_client::GetOptions::new().with_count_only(),
            )
            .await;
        if let Err(err) = probed {
            let tls_cause = match params.security().https && err.kind() == ErrorKind::Connection {
                true => tls_diagnosis(params).await,
                false => None,
            };
            return Err(match tls_cause {
                Some(cause) => Error::connection(format!("{} (TLS: {cause})", err.message())),
                None => err,
            });
        }
        tracing::debug!(endpoints = %etcd.endpoints(), etcd_version = %etcd.server_version(),
            "opened a connection to etcd");
        let mut connections = CONNECTIONS.lock().unwrap_or_else(|e| e.into_inner());
        connections.retain(|_, w| w.strong_count() > 0);
        connections.insert(key, Arc::downgrade(&shared));
        Ok(etcd)
    }

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

impl Etcd {
    /// Records a raft term a response carried.
    pub(crate) fn saw_term(&self, term: u64) {
        self.shared.term.send_if_modified(|seen| {
            let higher = term > *seen;
            if higher {
                *seen = term;
            }
            higher
        });
    }

    /// Completes once etcd has a leader of a higher term than `term` (the one known when a
    /// request was sent), and the request could have been answered since. Waits forever
    /// while the term stays the same: a slow etcd is not a reason to send a request twice.
    async fn new_leader_since(&self, term: u64) {
        tokio::time::sleep(STUCK_AFTER).await;
        let mut seen = self.shared.term.subscribe();
        // Nothing was known when the request was sent: the first term seen is the baseline.
        let mut base = term;
        loop {
            let now = *seen.borrow_and_update();
            if base == 0 {
                base = now;
            } else if now > base {
                break;
            }
            self.probe_term().await;
            tokio::select! {
                _ = seen.changed() => {}
                _ = tokio::time::sleep(TERM_PROBE_EVERY) => {}
            }
        }
        tokio::time::sleep(NEW_TERM_GRACE).await;
    }

    /// Asks one member for its raft term, unless another request of this connection asked
    /// within `TERM_PROBE_EVERY`. A serializable read is answered by the member itself,
    /// without consensus, so it answers while the cluster elects; it reads a key these
    /// credentials may read (some etcd versions refuse the status call to a role without
    /// more rights).
    async fn probe_term(&self) {
        {
            let mut next = self
                .shared
                .next_term_probe
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if now < *next {
                return;
            }
            *next = now + TERM_PROBE_EVERY;
        }
        let local = etcd_client::GetOptions::new()
            .with_count_only()
            .with_serializable();
        let key = self.shared.term_probe_key.clone();
        let mut client = self.client();
        let read = tokio::time::timeout(TERM_PROBE_EVERY, client.get(key, Some(local)));
        if let Ok(Ok(Some(term))) = read.await.map(|r| r.map(|got| got.raft_term())) {
            self.saw_term(term);
        }
    }
}

/// The raft term etcd's response carries in its header, if it has one.
pub trait RaftTerm {
    fn raft_term(&self) -> Option<u64>;
}

macro_rules! raft_term_from_header {
    ($($response:ty),*) => {$(
        impl RaftTerm for $response {
            fn raft_term(&self) -> Option<u64> {
                self.header().map(|h| h.raft_term())
            }
        }
    )*};
}

raft_term_from_header!(
    etcd_client::GetResponse,
    etcd_client::PutResponse,
    etcd_client::TxnResponse,
    etcd_client::LeaseGrantResponse,
    etcd_client::LeaseRevokeResponse,
    etcd_client::LeaseTimeToLiveResponse,
    etcd_client::AlarmResponse
);

/// Fails at once, with a message that says what to check, when every endpoint refuses TCP
/// connections: nothing listens there, and waiting out `connect_timeout` would only hide that.
/// Anything else (an endpoint that accepts, a timeout, a name that does not resolve yet) is
/// left to the normal retries. The endpoints are probed at once, each until `deadline`: a
/// refusal comes back at once from the kernel, so no shorter timer is needed, and one that
/// fired on a loaded machine before the refusal arrived turned it into a 10 s timeout.
async fn refuse_fast(endpoints: &[String], deadline: Instant) -> Result<()> {
    let mut probes = tokio::task::JoinSet::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let host_port = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, rest)| rest)
            .trim_end_matches('/')
            .to_string();
        probes.spawn(async move {
            let refused = matches!(
                tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(&host_port)).await,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
            );
            (index, host_port, refused)
        });
    }
    let mut refused = Vec::new();
    while let Some(probe) = probes.join_next().await {
        match probe {
            Ok((index, host_port, true)) => refused.push((index, host_port)),
            // One endpoint answered (or may yet): the normal path takes over.
            _ => return Ok(()),
        }
    }
    refused.sort(); // in the order the endpoints were given
    let refused: Vec<String> = refused
        .into_iter()
        .map(|(_, host_port)| host_port)
        .collect();
    Err(Error::connection(format!(
        "connection refused at {}: is etcd running there? (check the endpoint's host and port)",
        refused.join(", ")
    )))
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

enum Failure {
    Transient,
    Permanent,
}

fn classify(err: &etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    use tonic::Code;
    match err {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Failure::Transient
        }
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled => {
                Failure::Transient
            }
            // A learner (a member being added) refuses all but serializable reads, as
            // Unavailable up to etcd 3.5 but FailedPrecondition from 3.6: another endpoint, or
            // the member once promoted, can answer.
            Code::FailedPrecondition if status.message().contains("not supported for learner") => {
                Failure::Transient
            }
            Code::Unknown | Code::Internal | Code::ResourceExhausted => {
                let m = status.message();
                if m.contains("leader")
                    || m.contains("timed out")
                    || m.contains("too many requests")
                    || m.contains("transport")
                    || m.contains("connection")
                {
                    Failure::Transient
                } else {
                    Failure::Permanent
                }
            }
            _ => Failure::Permanent,
        },
        _ => Failure::Permanent,
    }
}

/// Maps an etcd failure onto rdzv's family, naming the endpoints and never the credentials.
pub fn to_error(endpoints: &str, what: &str, err: &etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    if let E::GRpcStatus(status) = err {
        let m = status.message();
        match status.code() {
            Code::NotFound if m.contains("lease not found") => {
                return Error::new(
                    ErrorKind::LeaseLost,
                    "an etcd lease of this node (its own, or the run's) expired: etcd did not hear from it within the lease's TTL",
                )
            }
            Code::InvalidArgument if m.contains("too large") => {
                return Error::invalid(format!("{what}: request too large for etcd ({m})"))
            }
            // The answer is larger than the client decodes: rdzv writes nothing that large, so
            // the run's keys hold data that something else wrote. Corrupt state, not a
            // connection that retrying or reconnecting would mend.
            Code::OutOfRange if m.contains("decoded message length too large") => {
                return Error::state(format!(
                    "{what}: etcd's answer is larger than rdzv reads ({m}): a key of the run holds data rdzv did not write"
                ))
            }
            // Not retried: nothing frees space but an operator, so every write fails at once
            // until the alarm is cleared.
            Code::ResourceExhausted if m.contains("database space exceeded") => {
                return Error::connection(format!(
                    "etcd at {endpoints} refused {what}: {m}: its database reached its quota \
                     (NOSPACE alarm) and it takes no writes until an operator compacts its \
                     history, defragments every member and disarms the alarm (etcdctl compact, \
                     etcdctl defrag, etcdctl alarm disarm; see OPERATIONS.md in rdzv's docs)"
                ))
            }
            Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::InvalidArgument
                if m.contains("permission") || m.contains("auth") || m.contains("user") || m.contains("password") || m.contains("token") =>
            {
                return Error::connection(format!(
                    "etcd at {endpoints} refused {what}: {m} (check username/password and role permissions)"
                ))
            }
            _ => {}
        }
    }
    // A gRPC status prints as a debug dump (metadata, details); its message is what matters.
    let cause = match err {
        E::GRpcStatus(status) => format!("{} ({:?})", status.message(), status.code()),
        other => error_chain(other),
    };
    Error::connection(format!("etcd at {endpoints} failed {what}: {cause}"))
}

/// etcd's message for a read at a revision its history no longer holds (`ErrCompacted`).
const COMPACTED: &str = "required revision has been compacted";

/// True when `err` is etcd refusing a read at a revision it has compacted away: reading again
/// at a fresh revision succeeds.
pub(crate) fn is_compacted(err: &Error) -> bool {
    err.kind() == ErrorKind::Connection && err.message().contains(COMPACTED)
}

fn unreachable(endpoints: &str, connect_timeout: Duration) -> Error {
    Error::connection(format!(
        "etcd at {endpoints} unreachable: no connection within {:.1} s",
        connect_timeout.as_secs_f64()
    ))
}

fn connection_key(params: &Params) -> ConnectionKey {
    let s = params.security();
    ConnectionKey {
        pid: std::process::id(),
        endpoints: params.endpoints().to_vec(),
        https: s.https,
        cacert: s.cacert.clone(),
        cert: s.cert.clone(),
        key: s.key.clone(),
        username: s.username.clone(),
        password: s.password.clone(),
    }
}

fn connect_options(params: &Params) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(params.connect_timeout())
        // HTTP/2 pings notice a dead etcd or a cut network on idle watch streams.
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
        .with_keep_alive_while_idle(true);
    let Security {
        https,
        username,
        password,
        ..
    } = params.security();
    if *https {
        options = options.with_tls(tls_options(params)?);
    }
    if let Some(user) = username {
        options = options.with_user(user.clone(), password.clone().unwrap_or_default());
    }
    Ok(options)
}

fn tls_options(params: &Params) -> Result<TlsOptions> {
    let Security {
        cacert, cert, key, ..
    } = params.security();
    let mut tls = TlsOptions::new();
    if let Some(path) = cacert {
        tls = tls.ca_certificate(Certificate::from_pem(read_pem(
            "cacert",
            path,
            "CERTIFICATE",
        )?));
    }
    if let (Some(cert), Some(key)) = (cert, key) {
        let cert = read_pem("cert", cert, "CERTIFICATE")?;
        let key = read_pem("key", key, "PRIVATE KEY")?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// Why a TLS endpoint refuses us, learnt from one direct connection. The client's balanced
/// channel retries failed handshakes silently, so without this a wrong CA or a missing client
/// certificate would look like a plain timeout.
async fn tls_diagnosis(params: &Params) -> Option<String> {
    let first = params.endpoints().first()?;
    let url = match first.contains("://") {
        true => first.clone(),
        false => format!("https://{first}"),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .tls_config(tls_options(params).ok()?)
        .ok()?
        .connect_timeout(Duration::from_secs(3));
    match tokio::time::timeout(Duration::from_secs(5), endpoint.connect()).await {
        Ok(Err(e)) => Some(error_chain(&e)),
        // The handshake passed (or hung): the server likely wants a client certificate.
        _ if params.security().cert.is_none() => {
            Some("no client certificate was given; set cert and key if etcd requires one".into())
        }
        _ => None,
    }
}

/// An error with all its causes, which is what a person needs to see ("connection refused",
/// "invalid peer certificate") rather than the outer wrapper alone.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

/// Reads a PEM file and checks it holds what the option expects (a swapped cert and key
/// otherwise surfaces as an opaque "transport error"). Errors never show the contents.
fn read_pem(option: &str, path: &str, kind: &str) -> Result<Vec<u8>> {
    let pem = read_file(option, path)?;
    let begin = format!("-----BEGIN {kind}-----");
    // Keys come as "BEGIN PRIVATE KEY", "BEGIN RSA PRIVATE KEY", "BEGIN EC PRIVATE KEY".
    let end_marker = format!("{kind}-----");
    let text = String::from_utf8_lossy(&pem);
    let holds = text.lines().any(|l| {
        l.starts_with("-----BEGIN ")
            && (l == begin || (kind == "PRIVATE KEY" && l.ends_with(&end_marker)))
    });
    if !holds {
        return Err(Error::invalid(format!(
            "option {option}: {path:?} does not hold a PEM {}",
            kind.to_lowercase()
        )));
    }
    Ok(pem)
}

/// Reads a TLS file; the error names the option and path, never the contents.
fn read_file(option: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid(format!("option {option}: cannot read {path:?}: {e}")))
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
