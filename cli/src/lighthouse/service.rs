//! torchft's `LighthouseService` as every lighthouse process serves it: the leader answers
//! from its state (`leader.rs`); any other lighthouse forwards the call to the leader whose
//! address etcd publishes, and when the leader goes away mid-call (killed, deposed), asks the
//! next one, so a manager's long poll survives a failover without seeing it.
//!
//! A call waits on one view of the routing for its whole life: every change after its last look
//! (a leader gone, a new one elected, this process leading) wakes it at once. A call must reach
//! the next leader as soon as the others do: the groups already stepping form fast quorums
//! that never wait for a newcomer, so a request held back for 100 ms missed five to ten of
//! them, and was left out for good once they stopped stepping.

use super::leader::{Deposed, Leader};
use super::proto::lighthouse_service_client::LighthouseServiceClient;
use super::proto::lighthouse_service_server::LighthouseService;
use super::proto::{
    LighthouseHeartbeatRequest, LighthouseHeartbeatResponse, LighthouseQuorumRequest,
    LighthouseQuorumResponse, Quorum,
};
use rdzv::election::Election;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

/// Set on a forwarded call: a lighthouse that receives one and does not lead says so instead
/// of forwarding again (the first one then waits for the leader to change).
const FORWARDED: &str = "x-rdzv-forwarded";

/// A retry against a leader that does not answer waits at most this for news of a new one.
const RETRY: Duration = Duration::from_millis(100);

/// The first wait after a lighthouse that this one takes for the leader says it does not lead
/// (the two see the election at different moments); doubled up to `RETRY` on each refusal.
const FIRST_PAUSE: Duration = Duration::from_millis(5);

/// A leader address evicted is not evicted again for this long (at least etcd's shortest
/// lease: a new leader has been elected by then, at another address or the same one).
const EVICT_AGAIN: Duration = Duration::from_secs(2);

/// How long a heartbeat waits for a leader before it fails.
const HEARTBEAT_PATIENCE: Duration = Duration::from_secs(2);

/// How many of the leaders' answers a forwarding lighthouse remembers (see `Answers`).
const ANSWERS_KEPT: usize = 64;

/// Where calls go: this process's own state while it leads, else the address etcd publishes.
#[derive(Clone, Default)]
pub struct Routing {
    pub leading: Option<Arc<Leader>>,
    pub observed: Option<String>,
    /// Elected, and reading the record before it leads: calls wait for it, forwarded ones too
    /// (the lighthouse that forwarded one saw the election before this one could serve).
    pub taking_over: bool,
}

#[derive(Clone)]
pub struct Lighthouse {
    pub routing: watch::Receiver<Routing>,
    /// This process's own advertised address (never forwarded to).
    pub me: String,
    election: Election,
    clients: Arc<std::sync::Mutex<HashMap<String, LighthouseServiceClient<Channel>>>>,
    /// The last leader address evicted, and when: one eviction per dead leader, however many
    /// calls found it gone.
    evicted: Arc<std::sync::Mutex<Option<(String, tokio::time::Instant)>>>,
    answers: Arc<std::sync::Mutex<Answers>>,
    /// What `/metrics` shows.
    pub metrics: Arc<super::metrics::Metrics>,
}

enum Route {
    Local(Arc<Leader>),
    Remote(LighthouseServiceClient<Channel>, String),
    /// No leader to ask yet (an election under way, or this process taking over): wait for
    /// the routing to change.
    Wait,
}

impl Lighthouse {
    pub fn new(
        routing: watch::Receiver<Routing>,
        me: String,
        election: Election,
        run_id: &str,
    ) -> Lighthouse {
        Lighthouse {
            metrics: Arc::new(super::metrics::Metrics::new(run_id, &me)),
            routing,
            me,
            election,
            clients: Arc::default(),
            evicted: Arc::default(),
            answers: Arc::default(),
        }
    }

    /// A call to the leader at `addr` failed with `status`; returns how long to wait for the
    /// routing to change before asking again. When its address refuses connections, its
    /// process is gone: its lease is revoked so that a new leader is elected now rather than
    /// when etcd expires the lease (a silent leader, whose host or network is gone, still waits
    /// for that), and the deletion wakes the wait. A lighthouse that answers but does not lead
    /// sees the election before or after this one: asked again soon, then less often (`pause`).
    async fn leader_failed(&self, addr: &str, status: &Status, pause: &mut Duration) -> Duration {
        if !refused(status) {
            let wait = *pause;
            *pause = (*pause * 2).min(RETRY);
            return wait;
        }
        {
            let mut evicted = self.evicted.lock().unwrap_or_else(|e| e.into_inner());
            let now = tokio::time::Instant::now();
            if matches!(&*evicted, Some((a, at)) if a == addr && now < *at + EVICT_AGAIN) {
                return RETRY;
            }
            *evicted = Some((addr.to_string(), now));
        }
        if let Ok(true) = self.election.evict(addr).await {
            crate::output::say(format_args!(
                "lighthouse: the leader at {addr} refuses connections (its process is gone); \
                 its lease revoked, electing another"
            ));
        }
        RETRY
    }

    fn route(&self, routing: &Routing, forwarded: bool) -> Result<Route, Status> {
        if let Some(leader) = routing.leading.as_ref().filter(|l| !l.is_deposed()) {
            return Ok(Route::Local(leader.clone()));
        }
        // Elected, or named as the leader in etcd (taking over, or just deposed and resigning):
        // this process is the one to wait for.
        if routing.taking_over || routing.observed.as_deref() == Some(self.me.as_str()) {
            return Ok(Route::Wait);
        }
        if forwarded {
            return Err(Status::unavailable(NOT_LEADING));
        }
        match &routing.observed {
            Some(addr) => Ok(Route::Remote(self.client(addr)?, addr.clone())),
            None => Ok(Route::Wait),
        }
    }

    fn client(&self, addr: &str) -> Result<LighthouseServiceClient<Channel>, Status> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(addr.to_string())
            .map_err(|e| Status::internal(format!("leader address {addr:?}: {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            // A leader's host gone silent is noticed in seconds, not at TCP's timeout.
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        let client = LighthouseServiceClient::new(endpoint.connect_lazy());
        clients.retain(|a, _| a == addr);
        clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer to a call whose quorum a leader handed out before it died (`Answers`).
    fn answered_before(&self, quorum: Quorum) -> Response<LighthouseQuorumResponse> {
        self.metrics.forwarded_quorums.inc();
        crate::output::say(format_args!(
            "lighthouse: quorum {} was handed out by a leader that died before answering \
             every member: given to the rest as it was",
            quorum.quorum_id
        ));
        Response::new(LighthouseQuorumResponse {
            quorum: Some(quorum),
        })
    }

    /// One call's view of the routing: what it sees now is marked seen, so the waits below
    /// return on the next change (a clone has seen only what the original saw: nothing since
    /// this service was made).
    fn routes(&self) -> watch::Receiver<Routing> {
        let mut routes = self.routing.clone();
        routes.borrow_and_update();
        routes
    }
}

/// The quorums the leaders handed out through this lighthouse, newest last. A leader hands a
/// quorum to every member at once, but its answers leave one by one: killed between two, it
/// answered one member and not another, and a new leader asked again knows nothing of a
/// quorum whose members did not change (it is not written to etcd). A member whose call
/// failed is given the quorum it was in, if another call forwarded here brought it back from
/// that leader after this call was sent; otherwise the two would train in different quorums
/// for a step (one with the old members, one without the member that was already answered).
#[derive(Default)]
struct Answers(VecDeque<(String, tokio::time::Instant, Quorum)>);

impl Answers {
    fn keep(&mut self, leader: &str, quorum: Quorum) {
        if self.0.len() == ANSWERS_KEPT {
            self.0.pop_front();
        }
        self.0
            .push_back((leader.to_string(), tokio::time::Instant::now(), quorum));
    }

    /// The newest quorum one of `leaders` handed out after `since` that has `replica_id` in it.
    fn for_member(
        &self,
        leaders: &[String],
        since: tokio::time::Instant,
        replica_id: &str,
    ) -> Option<Quorum> {
        self.0
            .iter()
            .rev()
            .take_while(|(_, at, _)| *at >= since)
            .find(|(from, _, q)| {
                leaders.contains(from) && q.participants.iter().any(|p| p.replica_id == replica_id)
            })
            .map(|(_, _, q)| q.clone())
    }
}

/// What a lighthouse that does not lead answers a forwarded call.
pub const NOT_LEADING: &str = "this lighthouse does not lead";

/// Returns the routing to look at: the present one marked seen, so that a change after this
/// look wakes `wait_change`.
fn look(routes: &mut watch::Receiver<Routing>) -> Routing {
    routes.borrow_and_update().clone()
}

/// Waits until the routing changes after the last `look`, or `at_most` passes (a leader that
/// refused may still be the one etcd names until its lease expires).
async fn wait_change(routes: &mut watch::Receiver<Routing>, at_most: Duration) {
    let _ = tokio::time::timeout(at_most, routes.changed()).await;
}

fn forwarded<T>(r: &Request<T>) -> bool {
    r.metadata().contains_key(FORWARDED)
}

fn marked<T>(message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    r
}

/// Whether a call failed because nothing listens at the address (the process is gone).
fn refused(status: &Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

/// Errors that mean "ask again, maybe elsewhere" rather than an answer for the caller.
fn transient(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal | Code::Aborted
    )
}

#[tonic::async_trait]
impl LighthouseService for Lighthouse {
    async fn quorum(
        &self,
        request: Request<LighthouseQuorumRequest>,
    ) -> Result<Response<LighthouseQuorumResponse>, Status> {
        let was_forwarded = forwarded(&request);
        let req = request.into_inner();
        let member = req
            .requester
            .clone()
            .ok_or_else(|| Status::invalid_argument("missing requester"))?;
        if member.replica_id.is_empty() {
            return Err(Status::invalid_argument(
                "requester.replica_id: expected a replica group's id, got an empty one",
            ));
        }
        // Ends when the caller's deadline (grpc-timeout) does: tonic drops this future.
        let mut routes = self.routes();
        let mut pause = FIRST_PAUSE;
        let id = member.replica_id.as_str();
        // The leaders this call was forwarded to, and when it first was (see `Answers`).
        let mut asked: Vec<String> = vec![];
        let mut first_sent = None;
        loop {
            // Looked at again before each new ask: another call's answer from a leader that
            // died may be read only after this call saw the connection fail.
            if let Some(since) = first_sent {
                if let Some(q) = self.answers().for_member(&asked, since, id) {
                    return Ok(self.answered_before(q));
                }
            }
            let routing = look(&mut routes);
            match self.route(&routing, was_forwarded)? {
                Route::Local(leader) => match leader.quorum(member.clone()).await {
                    Ok(quorum) => {
                        self.metrics.quorums.inc();
                        return Ok(Response::new(LighthouseQuorumResponse {
                            quorum: Some(quorum),
                        }));
                    }
                    Err(Deposed) if was_forwarded => {
                        return Err(Status::unavailable("this lighthouse stopped leading"))
                    }
                    // Deposed, this process is not asked again (`route`); the campaign's
                    // change of the routing wakes the wait.
                    Err(Deposed) => {}
                },
                Route::Remote(mut client, addr) => {
                    // A leader that changes under the call (the old one paused or cut off,
                    // its lease expired) leaves the call hanging: ask the new one instead. A
                    // repeated ask is harmless (the same member asks again).
                    let since = *first_sent.get_or_insert_with(tokio::time::Instant::now);
                    if !asked.contains(&addr) {
                        asked.push(addr.clone());
                    }
                    tokio::select! {
                        answer = client.quorum(marked(req.clone())) => match answer {
                            Ok(resp) => {
                                self.metrics.forwarded_quorums.inc();
                                if let Some(q) = &resp.get_ref().quorum {
                                    self.answers().keep(&addr, q.clone());
                                }
                                return Ok(resp);
                            }
                            Err(s) if transient(&s) => {
                                if let Some(q) = self.answers().for_member(&asked, since, id) {
                                    return Ok(self.answered_before(q));
                                }
                                let wait = self.leader_failed(&addr, &s, &mut pause).await;
                                wait_change(&mut routes, wait).await;
                            }
                            Err(s) => return Err(s),
                        },
                        _ = routes.changed() => {}
                    }
                }
                Route::Wait => wait_change(&mut routes, RETRY).await,
            }
        }
    }

    async fn heartbeat(
        &self,
        request: Request<LighthouseHeartbeatRequest>,
    ) -> Result<Response<LighthouseHeartbeatResponse>, Status> {
        let was_forwarded = forwarded(&request);
        let req = request.into_inner();
        // An empty id names no replica group: a quorum could never be made with it.
        if req.replica_id.is_empty() {
            return Err(Status::invalid_argument(
                "replica_id: expected a replica group's id, got an empty one",
            ));
        }
        // Waits for a leader (this lighthouse just started, or a failover is under way) as
        // long as a heartbeat is worth anything; the next one comes within its period anyway.
        let give_up = tokio::time::Instant::now() + HEARTBEAT_PATIENCE;
        let mut routes = self.routes();
        let mut pause = FIRST_PAUSE;
        loop {
            let routing = look(&mut routes);
            let (failed, wait) = match self.route(&routing, was_forwarded)? {
                Route::Local(leader) => {
                    leader.heartbeat(&req.replica_id).await;
                    self.metrics.heartbeats.inc();
                    return Ok(Response::new(LighthouseHeartbeatResponse {}));
                }
                Route::Remote(mut client, addr) => {
                    match client.heartbeat(marked(req.clone())).await {
                        Ok(resp) => {
                            self.metrics.forwarded_heartbeats.inc();
                            return Ok(resp);
                        }
                        Err(s) if transient(&s) => {
                            let wait = self.leader_failed(&addr, &s, &mut pause).await;
                            (s, wait)
                        }
                        other => return other,
                    }
                }
                Route::Wait => (Status::unavailable("no lighthouse leads yet"), RETRY),
            };
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(failed);
            }
            wait_change(&mut routes, wait.min(left)).await;
        }
    }
}
