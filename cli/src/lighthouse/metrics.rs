//! The lighthouse's `/metrics` (on its gRPC port, beside `/status`): OpenMetrics text for
//! Prometheus, labelled `run_id` (the job) and `node` (this lighthouse's address). Calls
//! served here or forwarded to the leader are counted as they end; whether this lighthouse
//! leads, the last quorum's id and size and the replica groups that sent heartbeats are read
//! from its state when scraped.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::borrow::Cow;

pub struct Metrics {
    pub registry: Registry,
    /// Quorums this lighthouse answered as the leader.
    pub quorums: Counter,
    /// Quorum calls it forwarded to the leader and relayed the answer of.
    pub forwarded_quorums: Counter,
    pub heartbeats: Counter,
    pub forwarded_heartbeats: Counter,
    pub leading: Gauge,
    pub quorum_id: Gauge,
    pub participants: Gauge,
    pub replica_groups: Gauge,
}

impl Metrics {
    pub fn new(run_id: &str, node: &str) -> Metrics {
        let labels = [("run_id", run_id), ("node", node)]
            .map(|(k, v)| (Cow::Borrowed(k), Cow::Owned(v.to_string())));
        let mut registry = Registry::with_labels(labels.into_iter());
        let m = Metrics {
            registry: Registry::default(),
            quorums: Counter::default(),
            forwarded_quorums: Counter::default(),
            heartbeats: Counter::default(),
            forwarded_heartbeats: Counter::default(),
            leading: Gauge::default(),
            quorum_id: Gauge::default(),
            participants: Gauge::default(),
            replica_groups: Gauge::default(),
        };
        let r = &mut registry;
        r.register(
            "rdzv_lighthouse_quorums",
            "Quorums answered by this lighthouse as the leader",
            m.quorums.clone(),
        );
        r.register(
            "rdzv_lighthouse_forwarded_quorums",
            "Quorum calls this lighthouse forwarded to the leader",
            m.forwarded_quorums.clone(),
        );
        r.register(
            "rdzv_lighthouse_heartbeats",
            "Heartbeats taken by this lighthouse as the leader",
            m.heartbeats.clone(),
        );
        r.register(
            "rdzv_lighthouse_forwarded_heartbeats",
            "Heartbeats this lighthouse forwarded to the leader",
            m.forwarded_heartbeats.clone(),
        );
        r.register(
            "rdzv_lighthouse_leading",
            "1 while this lighthouse leads the job, else 0",
            m.leading.clone(),
        );
        r.register(
            "rdzv_lighthouse_quorum_id",
            "The id of the last quorum (the leader's)",
            m.quorum_id.clone(),
        );
        r.register(
            "rdzv_lighthouse_participants",
            "Replica groups in the last quorum (the leader's)",
            m.participants.clone(),
        );
        r.register(
            "rdzv_lighthouse_replica_groups",
            "Replica groups that sent the leader a heartbeat",
            m.replica_groups.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The page: the registry's text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
