//! `--metrics-port PORT`: this node's metrics as OpenMetrics text (what Prometheus scrapes) on
//! `GET /metrics`, encoded by the `prometheus-client` crate. Every series carries the labels
//! `run_id`, `role` and `node` (the host's name), so a dashboard sums or splits by job and by
//! machine; names and meanings are in `docs/EVENTS.md`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::sync::Arc;

/// The content type of the pages (this one and `rdzv lighthouse`'s /metrics).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The node's series (each a cheap handle on the registry's value).
pub struct Metrics {
    pub rounds_formed: Counter,
    pub membership_changes: Counter,
    pub worker_failures: Counter,
    pub restarts: Counter,
    pub remaining_restarts: Gauge,
    pub world_size: Gauge,
    pub nodes: Gauge,
    pub workers_running: Gauge,
    pub round_formation: Histogram,
    pub recovery: Histogram,
}

/// Seconds from 1 ms to about 2 minutes, doubling.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

impl Metrics {
    fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            rounds_formed: Counter::default(),
            membership_changes: Counter::default(),
            worker_failures: Counter::default(),
            restarts: Counter::default(),
            remaining_restarts: Gauge::default(),
            world_size: Gauge::default(),
            nodes: Gauge::default(),
            workers_running: Gauge::default(),
            round_formation: seconds(),
            recovery: seconds(),
        };
        let r = registry;
        r.register(
            "rdzv_rounds_formed",
            "Rounds this node formed (joined and saw sealed)",
            m.rounds_formed.clone(),
        );
        r.register(
            "rdzv_membership_changes",
            "Rounds ended by a membership change (nodes waiting, a member lost or drained)",
            m.membership_changes.clone(),
        );
        r.register(
            "rdzv_worker_failures",
            "Workers of this node that failed on their own",
            m.worker_failures.clone(),
        );
        r.register(
            "rdzv_restarts",
            "Restarts of the job's budget this node spent",
            m.restarts.clone(),
        );
        r.register(
            "rdzv_remaining_restarts",
            "Restarts left in the job's budget",
            m.remaining_restarts.clone(),
        );
        r.register(
            "rdzv_world_size",
            "Workers in the current round, on every node",
            m.world_size.clone(),
        );
        r.register("rdzv_nodes", "Nodes in the current round", m.nodes.clone());
        r.register(
            "rdzv_workers_running",
            "Workers of this node running now",
            m.workers_running.clone(),
        );
        r.register(
            "rdzv_round_formation_seconds",
            "From asking for a round to its forming",
            m.round_formation.clone(),
        );
        r.register("rdzv_recovery_seconds", "From a round's end (a failure, a membership change) to the next round's workers running", m.recovery.clone());
        m
    }
}

/// Starts serving on `port` (every address) and returns the series to update. Fails, saying
/// which port, when it cannot listen.
pub async fn serve(
    port: u16,
    run_id: &str,
    role: &str,
    node: &str,
) -> std::io::Result<Arc<Metrics>> {
    let labels = [("run_id", run_id), ("role", role), ("node", node)]
        .map(|(k, v)| (Cow::Borrowed(k), Cow::Owned(v.to_string())));
    let mut registry = Registry::with_labels(labels.into_iter());
    let metrics = Arc::new(Metrics::register(&mut registry));
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("--metrics-port {port}: {e}")))?;
    let registry = Arc::new(registry);
    let page = move || {
        let registry = registry.clone();
        async move {
            let mut text = String::new();
            // Writing to a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
            ([("content-type", CONTENT_TYPE)], text)
        }
    };
    let router = axum::Router::new().route("/metrics", axum::routing::get(page));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(metrics)
}
