//! `rdzv exporter`: every run on one etcd as Prometheus series, the scheduler's view of all its
//! jobs beside each node's own (`--metrics-port`). Each scrape of `GET /metrics` lists the runs
//! under the key prefix (`Admin::runs`) and reads each one's status as `rdzv status` does, on
//! one connection; the series carry the label `run_id`. Names and meanings are in
//! `docs/EVENTS.md` ("Every job on one etcd").

use crate::args::ops::ExporterArgs;
use crate::exit::Exit;
use crate::incidents::{wall_ms, Summary};
use crate::output::{error, say};
use crate::prometheus::CONTENT_TYPE;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rdzv::admin::{Admin, RunStatus};
use rdzv::Params;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Job {
    run_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Incident {
    run_id: String,
    kind: String,
}

type Ratio = Gauge<f64, AtomicU64>;

/// One scrape's series.
#[derive(Default)]
struct Series {
    closed: Family<Job, Gauge>,
    failed: Family<Job, Gauge>,
    round: Family<Job, Gauge>,
    members: Family<Job, Gauge>,
    alive: Family<Job, Gauge>,
    waiting: Family<Job, Gauge>,
    lost: Family<Job, Gauge>,
    incidents: Family<Job, Gauge>,
    effective: Family<Job, Ratio>,
    last_first_step: Family<Incident, Ratio>,
    runs: Gauge,
    unreadable: Gauge,
}

impl Series {
    fn add(&self, s: &RunStatus) {
        let job = Job {
            run_id: s.run_id.clone(),
        };
        let set = |family: &Family<Job, Gauge>, value: usize| {
            family.get_or_create(&job).set(value as i64);
        };
        set(&self.closed, usize::from(s.closed));
        set(&self.failed, usize::from(s.failure.is_some()));
        if let Some(sealed) = &s.sealed {
            set(&self.round, sealed.round as usize);
            set(&self.members, sealed.members.len());
            set(
                &self.alive,
                sealed.members.iter().filter(|m| m.alive).count(),
            );
        }
        set(&self.waiting, s.waiting.len());
        set(&self.lost, s.lost().len());
        let summary = Summary::read(&s.notes, s.sealed.as_ref().map(|r| r.round), wall_ms());
        set(&self.incidents, summary.count as usize);
        if let Some((share, _)) = summary.effective {
            self.effective.get_or_create(&job).set(share);
        }
        if let Some(last) = summary.records.last() {
            if let Some(ms) = last["first_step_ms"].as_u64() {
                let incident = Incident {
                    run_id: s.run_id.clone(),
                    kind: last["kind"].as_str().unwrap_or("?").to_string(),
                };
                let step = self.last_first_step.get_or_create(&incident);
                step.set(ms as f64 / 1000.0);
            }
        }
    }

    fn registry(self) -> Registry {
        let mut r = Registry::default();
        r.register(
            "rdzv_job_closed",
            "1 once the run is closed (its job ended, or an operator closed it)",
            self.closed,
        );
        r.register(
            "rdzv_job_failed",
            "1 once the run was closed as failed",
            self.failed,
        );
        r.register("rdzv_job_round", "The run's last sealed round", self.round);
        r.register(
            "rdzv_job_members",
            "Members of the last sealed round",
            self.members,
        );
        r.register(
            "rdzv_job_members_alive",
            "Members of the last sealed round still alive",
            self.alive,
        );
        r.register(
            "rdzv_job_nodes_waiting",
            "Nodes waiting to be admitted",
            self.waiting,
        );
        r.register(
            "rdzv_job_nodes_lost",
            "Members of the last sealed round lost",
            self.lost,
        );
        r.register(
            "rdzv_job_incidents",
            "Incidents since the job began (rounds ended by a failure or a membership change)",
            self.incidents,
        );
        r.register(
            "rdzv_job_effective_training_ratio",
            "Share of the wall time since the job began in which every rank was stepping",
            self.effective,
        );
        r.register(
            "rdzv_job_last_incident_first_step_seconds",
            "From the newest incident's fault to every rank stepping again, by the incident's kind",
            self.last_first_step,
        );
        r.register("rdzv_exporter_runs", "Runs read in this scrape", self.runs);
        r.register(
            "rdzv_exporter_unreadable_runs",
            "Runs listed whose status could not be read in this scrape",
            self.unreadable,
        );
        r
    }
}

/// Every run's series, read now.
async fn scrape(admin: &Admin, max_runs: usize) -> Result<String, rdzv::Error> {
    let series = Series::default();
    for run in admin.runs(max_runs).await? {
        let status = match admin.for_run(&run) {
            Ok(one) => one.status().await,
            Err(e) => Err(e),
        };
        match status {
            Ok(s) if s.exists => {
                series.runs.inc();
                series.add(&s);
            }
            Ok(_) => {}
            Err(_) => {
                series.unreadable.inc();
            }
        }
    }
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &series.registry());
    Ok(text)
}

pub async fn serve(a: ExporterArgs) -> Exit {
    let params = Params::new("etcd-v3", &a.etcd, "rdzv-exporter", 1, 1)
        .and_then(|mut p| p.set("key_prefix", &a.key_prefix).map(|()| p));
    let admin = match params {
        Ok(params) => Admin::connect(params).await,
        Err(e) => Err(e),
    };
    let admin = match admin {
        Ok(admin) => Arc::new(admin),
        Err(e) => {
            error(format_args!("exporter: {}", e.message()));
            return Exit::Failure;
        }
    };
    let listener = match tokio::net::TcpListener::bind(("0.0.0.0", a.port)).await {
        Ok(l) => l,
        Err(e) => {
            error(format_args!("--port {}: {e}", a.port));
            return Exit::Failure;
        }
    };
    let port = listener.local_addr().map_or(a.port, |addr| addr.port());
    say(format_args!(
        "serving every run on {} under {} at http://0.0.0.0:{port}/metrics",
        a.etcd, a.key_prefix
    ));
    let max_runs = a.max_runs as usize;
    let page = move || {
        let admin = admin.clone();
        async move {
            match scrape(&admin, max_runs).await {
                Ok(text) => (
                    axum::http::StatusCode::OK,
                    [("content-type", CONTENT_TYPE)],
                    text,
                ),
                // Prometheus marks the target down: etcd did not answer the listing.
                Err(e) => (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("content-type", "text/plain; charset=utf-8")],
                    format!("cannot list the runs: {}\n", e.message()),
                ),
            }
        }
    };
    let router = axum::Router::new().route("/metrics", axum::routing::get(page));
    match axum::serve(listener, router).await {
        Ok(()) => Exit::Success,
        Err(e) => {
            error(format_args!("exporter: {e}"));
            Exit::Failure
        }
    }
}
