//! Reaching etcd at start: etcd often comes up after the nodes (Kubernetes, Slurm), so the
//! launcher waits for it, saying so, until `join_timeout`; a host name that does not resolve
//! fails at once. A handled signal ends the wait.

use super::signals::Signals;
use crate::exit::Exit;
use crate::output::say;
use rdzv::{ErrorKind, Rendezvous};
use std::time::Duration;
use tokio::time::Instant;

/// How often a launcher waiting for etcd to come up says so.
const CONNECT_NOTICE: Duration = Duration::from_secs(5);

/// Connects to the rendezvous. etcd often starts after the nodes (Kubernetes, Slurm), so a
/// refused or unanswered connection is retried until `join_timeout`, with a line every few
/// seconds naming the endpoint; a host name that does not resolve is a typo until proven
/// otherwise and fails at once. Err is the launcher's exit status.
pub async fn connect(params: rdzv::Params, signals: &mut Signals) -> Result<Rendezvous, Exit> {
    let endpoints = params.endpoints().join(",");
    let fail = |message: &str| {
        crate::output::error(format_args!("rendezvous on {endpoints}: {message}"));
        Exit::Failure
    };
    for endpoint in params.endpoints() {
        let host_port = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, rest)| rest)
            .trim_end_matches('/');
        let lookup = async {
            tokio::net::lookup_host(host_port)
                .await
                .map(|addrs| addrs.count())
        };
        let resolved = tokio::select! {
            r = tokio::time::timeout(params.connect_timeout(), lookup) => r,
            sig = signals.recv() => return Err(Exit::Signal(sig)),
        };
        match resolved {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) | Ok(Err(_)) => {
                let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
                return Err(fail(&format!(
                    "cannot resolve the host name {host:?} of endpoint {host_port} (a typo?)"
                )));
            }
            // A name server that does not answer is not a typo: the retries below wait for it.
            Err(_) => {}
        }
    }
    let started = Instant::now();
    let deadline = started + params.join_timeout();
    let mut next_notice = started;
    loop {
        let connected = tokio::select! {
            r = Rendezvous::new(params.clone()) => r,
            sig = signals.recv() => return Err(Exit::Signal(sig)),
        };
        let e = match connected {
            Ok(r) => {
                if next_notice > started {
                    say(format_args!(
                        "connected to etcd at {endpoints} after {:.1} s",
                        started.elapsed().as_secs_f64()
                    ));
                }
                return Ok(r);
            }
            Err(e) if e.kind() == ErrorKind::Connection && Instant::now() < deadline => e,
            Err(e) => return Err(fail(e.message())),
        };
        if Instant::now() >= next_notice {
            say(format_args!(
                "waiting for etcd at {endpoints} ({}); retrying until join_timeout, {:.0} s left",
                e.message(),
                deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64()
            ));
            next_notice = Instant::now() + CONNECT_NOTICE;
        }
        // A retry interval, not a wait for an event: nothing tells us when etcd comes up.
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(250))) => {}
            sig = signals.recv() => return Err(Exit::Signal(sig)),
        }
    }
}
