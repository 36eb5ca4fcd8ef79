//! `rdzv lighthouse`: torchft's Lighthouse (the gRPC `LighthouseService` its managers ask for
//! a quorum before each step) with no single point of failure. Any number of lighthouse
//! processes serve one job; they campaign for leadership on etcd (`rdzv::election`), the
//! leader keeps the quorum state in memory and writes to etcd only when `quorum_id` grows,
//! and the others forward to it. `docs/LIGHTHOUSE.md` has the rules and why they are safe.
//!
//! Modules, each using only those listed before it: `proto` (the generated gRPC code),
//! `rules` (torchft's quorum rules, pure), `leader` (the leader's state and what it writes to
//! etcd), `metrics` (the /metrics page's series), `service` (the gRPC service: answer or
//! forward), `status` (the /status and /metrics pages).

pub mod proto {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("torchft");
}

pub mod rules;

pub mod leader;

pub mod metrics;

pub mod service;

pub mod status;

use crate::args::lighthouse::LighthouseArgs;
use crate::exit::Exit;
use crate::output::{error, say};
use leader::Leader;
use rdzv::election::Election;
use service::{Lighthouse, Routing};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub async fn serve(args: LighthouseArgs) -> Exit {
    let url = match args.rdzv.url() {
        Ok(url) => url,
        Err(e) => {
            error(format_args!("{e} (see rdzv lighthouse --help)"));
            return Exit::Usage;
        }
    };
    let params = match rdzv::Params::from_url(&url) {
        Ok(p) => p,
        Err(e) => {
            error(format_args!("--rdzv-conf: {}", e.message()));
            return Exit::Usage;
        }
    };
    let listener = match tokio::net::TcpListener::bind(&args.bind).await {
        Ok(l) => l,
        Err(e) => {
            error(format_args!(
                "--bind: cannot listen on {:?}: {e}",
                args.bind
            ));
            return Exit::Failure;
        }
    };
    let bound = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            error(format_args!("--bind: {e}"));
            return Exit::Failure;
        }
    };
    let me = match &args.advertise_addr {
        Some(a) if a.contains("://") => a.clone(),
        Some(a) => format!("http://{a}"),
        None => advertised(bound),
    };
    let election = match Election::connect(&params, "lighthouse").await {
        Ok(e) => e,
        Err(e) => {
            error(format_args!(
                "etcd at {}: {}",
                params.endpoints().join(","),
                e.message()
            ));
            return Exit::Failure;
        }
    };
    let rules = rules::Rules {
        min_replicas: args.min_replicas,
        join_timeout: args.join_timeout_ms,
        heartbeat_timeout: args.heartbeat_timeout_ms,
    };
    let (routing, routes) = watch::channel(Routing::default());
    let routing = Arc::new(routing);
    let observe = tokio::spawn(follow_leader(election.clone(), routing.clone()));
    let lead = tokio::spawn(campaign(
        election.clone(),
        rules,
        args.quorum_tick_ms,
        me.clone(),
        routing.clone(),
    ));
    let lighthouse = Lighthouse::new(routes, me.clone(), election, params.run_id());
    let router = tonic::service::Routes::from(status::router(lighthouse.clone()))
        .add_service(proto::lighthouse_service_server::LighthouseServiceServer::new(lighthouse));
    say(format_args!(
        "lighthouse: serving on {me} (bound to {bound}), job {} on etcd {}",
        params.run_id(),
        params.endpoints().join(",")
    ));
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(router)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    let served = tokio::select! {
        served = &mut server => served,
        () = stop_signal() => {
            // Calls in flight (a manager's long poll) get a moment to finish, not more.
            let _ = stop.send(());
            tokio::time::timeout(STOP_GRACE, &mut server).await.unwrap_or(Ok(()))
        }
    };
    // Stopped (SIGTERM, SIGINT): a leader resigns so another one leads at once; with etcd
    // unreachable, its lease expires instead.
    lead.abort();
    observe.abort();
    let leading = routing.borrow().leading.clone();
    routing.send_modify(|r| r.leading = None);
    if let Some(leader) = leading {
        let _ = tokio::time::timeout(STOP_GRACE, leader.resign()).await;
    }
    match served {
        Ok(()) => Exit::Success,
        Err(e) => {
            error(format_args!("lighthouse: {e}"));
            Exit::Failure
        }
    }
}

/// How long a stopped lighthouse waits for calls in flight, and then for its resignation.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// The address others reach this lighthouse at: the bound one, or this host's name when
/// bound to every interface (as torchft's Lighthouse says of itself).
fn advertised(bound: SocketAddr) -> String {
    match bound.ip() {
        ip if ip.is_unspecified() => format!("http://{}:{}", crate::host::hostname(), bound.port()),
        std::net::IpAddr::V6(ip) => format!("http://[{ip}]:{}", bound.port()),
        std::net::IpAddr::V4(ip) => format!("http://{ip}:{}", bound.port()),
    }
}

async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Keeps `observed` at the leader's address as etcd publishes it.
async fn follow_leader(election: Election, routing: Arc<watch::Sender<Routing>>) {
    let mut leader = election.observe();
    loop {
        let now = leader.borrow_and_update().clone();
        routing.send_if_modified(|r| {
            let changed = r.observed != now;
            r.observed = now;
            changed
        });
        if leader.changed().await.is_err() {
            return;
        }
    }
}

/// Campaigns, leads until deposed, and campaigns again, for as long as the process runs.
async fn campaign(
    election: Election,
    rules: rules::Rules,
    tick: Duration,
    me: String,
    routing: Arc<watch::Sender<Routing>>,
) {
    loop {
        let leader = match election.campaign(&me).await {
            Ok(leadership) => {
                // Elected: calls that reach this process now wait for it to lead (a follower
                // that saw the election first forwards to it already).
                routing.send_modify(|r| r.taking_over = true);
                let taken = Leader::take_over(leadership, rules, me.clone()).await;
                if taken.is_err() {
                    routing.send_modify(|r| r.taking_over = false);
                }
                taken
            }
            Err(e) => Err(e),
        };
        let leader = match leader {
            Ok(l) => Arc::new(l),
            Err(e) => {
                say(format_args!(
                    "lighthouse: cannot lead yet ({}); trying again",
                    e.message()
                ));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        say(format_args!("lighthouse: leading ({me})"));
        routing.send_modify(|r| {
            r.leading = Some(leader.clone());
            r.taking_over = false;
        });
        let ticking = {
            let leader = leader.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(tick);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    leader.tick().await;
                }
            })
        };
        let why = leader.until_deposed().await;
        ticking.abort();
        routing.send_modify(|r| r.leading = None);
        say(format_args!(
            "lighthouse: no longer leading ({why}); following the new leader"
        ));
        leader.resign().await;
    }
}
