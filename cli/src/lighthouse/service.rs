//! torchft's `LighthouseService` as every lighthouse process serves it: the leader answers
//! from its state (`leader.rs`); any other lighthouse forwards the call to the leader whose
//! address etcd publishes, and when the leader goes away mid-call (killed, deposed), asks the
//! next one, so a manager's long poll survives a failover without seeing it.

use super::leader::{Deposed, Leader};
use super::proto::lighthouse_service_client::LighthouseServiceClient;
use super::proto::lighthouse_service_server::LighthouseService;
use super::proto::{
    LighthouseHeartbeatRequest, LighthouseHeartbeatResponse, LighthouseQuorumRequest,
    LighthouseQuorumResponse,
};
use std::collections::HashMap;
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

/// How long a heartbeat waits for a leader before it fails.
const HEARTBEAT_PATIENCE: Duration = Duration::from_secs(2);

/// Where calls go: this process's own state while it leads, else the address etcd publishes.
#[derive(Clone, Default)]
pub struct Routing {
    pub leading: Option<Arc<Leader>>,
    pub observed: Option<String>,
}

#[derive(Clone)]
pub struct Lighthouse {
    pub routing: watch::Receiver<Routing>,
    /// This process's own advertised address (never forwarded to).
    pub me: String,
    clients: Arc<std::sync::Mutex<HashMap<String, LighthouseServiceClient<Channel>>>>,
}

enum Route {
    Local(Arc<Leader>),
    Remote(LighthouseServiceClient<Channel>),
    Nowhere,
}

impl Lighthouse {
    pub fn new(routing: watch::Receiver<Routing>, me: String) -> Lighthouse {
        Lighthouse {
            routing,
            me,
            clients: Arc::default(),
        }
    }

    fn route(&self, forwarded: bool) -> Result<Route, Status> {
        let routing = self.routing.borrow().clone();
        if let Some(leader) = routing.leading {
            return Ok(Route::Local(leader));
        }
        if forwarded {
            return Err(Status::unavailable("this lighthouse does not lead"));
        }
        match routing.observed {
            Some(addr) if addr != self.me => self.client(&addr).map(Route::Remote),
            _ => Ok(Route::Nowhere),
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

    /// Waits until the routing changes, or `RETRY` passes (a leader that refused may still be
    /// the one etcd names until its lease expires).
    async fn next_route(&self) {
        let mut routing = self.routing.clone();
        let _ = tokio::time::timeout(RETRY, routing.changed()).await;
    }
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
        // Ends when the caller's deadline (grpc-timeout) does: tonic drops this future.
        loop {
            match self.route(was_forwarded)? {
                Route::Local(leader) => match leader.quorum(member.clone()).await {
                    Ok(quorum) => {
                        return Ok(Response::new(LighthouseQuorumResponse {
                            quorum: Some(quorum),
                        }))
                    }
                    Err(Deposed) if was_forwarded => {
                        return Err(Status::unavailable("this lighthouse stopped leading"))
                    }
                    Err(Deposed) => {}
                },
                Route::Remote(mut client) => match client.quorum(marked(req.clone())).await {
                    Ok(resp) => return Ok(resp),
                    Err(s) if transient(&s) => self.next_route().await,
                    Err(s) => return Err(s),
                },
                Route::Nowhere => self.next_route().await,
            }
        }
    }

    async fn heartbeat(
        &self,
        request: Request<LighthouseHeartbeatRequest>,
    ) -> Result<Response<LighthouseHeartbeatResponse>, Status> {
        let was_forwarded = forwarded(&request);
        let req = request.into_inner();
        // Waits for a leader (this lighthouse just started, or a failover is under way) as
        // long as a heartbeat is worth anything; the next one comes within its period anyway.
        let give_up = tokio::time::Instant::now() + HEARTBEAT_PATIENCE;
        loop {
            let failed = match self.route(was_forwarded)? {
                Route::Local(leader) => {
                    leader.heartbeat(&req.replica_id).await;
                    return Ok(Response::new(LighthouseHeartbeatResponse {}));
                }
                Route::Remote(mut client) => match client.heartbeat(marked(req.clone())).await {
                    Err(s) if transient(&s) => s,
                    other => return other,
                },
                Route::Nowhere => Status::unavailable("no lighthouse leads yet"),
            };
            if tokio::time::Instant::now() >= give_up {
                return Err(failed);
            }
            self.next_route().await;
        }
    }
}
