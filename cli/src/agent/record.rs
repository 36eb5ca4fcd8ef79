//! The job's events and metrics as the agent records them (`crate::events`, `--events-file`,
//! `--metrics-file`): torchelastic's metadata for a worker or the agent, each worker's end, the
//! run's end, a membership change.

use super::Agent;
use crate::events::Source as EventSource;
use crate::exit::Exit;
use crate::host::hostname;
use crate::settings::rendezvous::Venue;
use crate::workers::Group;

impl Agent {
    /// One of rdzv's own events (`rdzv.*`): `fields` with the run, and this node's host.
    pub(super) fn rdzv_event(&self, name: &str, mut fields: serde_json::Value) {
        fields["run_id"] = serde_json::json!(self.cfg.run_id);
        fields["hostname"] = serde_json::json!(hostname());
        self.record.event(name, EventSource::Agent, fields);
    }

    /// The rendezvous backend's name, as torch's events give it.
    pub(super) fn backend(&self) -> &str {
        match &self.cfg.rendezvous {
            Venue::Etcd(_) if self.cfg.c10d.is_some() => "c10d",
            Venue::Etcd(params) => params.backend(),
            Venue::Static(_) => "static",
        }
    }

    /// torchelastic's event metadata (`_construct_event`): for a worker, or for the agent.
    pub(super) fn metadata(
        &self,
        worker: Option<&crate::workers::Worker>,
        state: &str,
        raw_error: Option<String>,
    ) -> serde_json::Value {
        let (group_rank, group_world_size) = self.place;
        let mut md = serde_json::json!({
            "group_world_size": group_world_size,
            "entry_point": self.cfg.program.name(),
        });
        if let Some(w) = worker {
            md["local_rank"] = serde_json::json!([w.ranks.local_rank]);
            md["role_rank"] = serde_json::json!([w.ranks.role_rank]);
            md["role_world_size"] = serde_json::json!([w.ranks.role_world_size]);
        }
        serde_json::json!({
            "run_id": self.cfg.run_id,
            "global_rank": worker.map(|w| w.ranks.global_rank),
            "group_rank": group_rank,
            "worker_id": worker.map(|w| w.pid.to_string()),
            "role": self.cfg.role,
            "hostname": hostname(),
            "state": state,
            "total_run_time": self.started.elapsed().as_secs(),
            "rdzv_backend": self.backend(),
            "raw_error": raw_error,
            "metadata": md.to_string(),
            "agent_restarts": self.restarts.used,
        })
    }

    /// One `torchelastic.worker.status.STATE` event for each worker of `group` that has ended
    /// and is not recorded yet: SUCCEEDED, FAILED (with its error file as `raw_error`) or
    /// TERMINATED (stopped by the agent).
    pub(super) fn record_workers(&self, group: &mut Group) {
        let ended: Vec<usize> = (0..group.workers.len())
            .filter(|&i| group.workers[i].ended.is_some() && !group.workers[i].recorded)
            .collect();
        for i in ended {
            let w = &group.workers[i];
            let (how, _) = w.ended.expect("ended");
            let state = if w.stopped && !w.error_file.exists() {
                "TERMINATED"
            } else if how.success() {
                "SUCCEEDED"
            } else {
                "FAILED"
            };
            let raw_error = match state {
                "FAILED" => std::fs::read_to_string(&w.error_file).ok(),
                _ => None,
            };
            if let (Some(p), "FAILED") = (&self.prom, state) {
                p.worker_failures.inc();
            }
            let metadata = self.metadata(Some(w), state, raw_error);
            self.record.event(
                &format!("torchelastic.worker.status.{state}"),
                EventSource::Worker,
                metadata,
            );
            group.workers[i].recorded = true;
        }
    }

    /// The agent's event and torchelastic's run metrics (`_record_metrics`), when the
    /// launcher leaves.
    pub(super) fn record_the_end(&self, exit: Exit) {
        let failed = !matches!(exit, Exit::Success);
        let state = if failed { "FAILED" } else { "SUCCEEDED" };
        self.record.event(
            &format!("torchelastic.worker.status.{state}"),
            EventSource::Agent,
            self.metadata(None, state, None),
        );
        let role = &self.cfg.role;
        let retried = self.restarts.used > 0;
        let metric =
            |name: &str, value: i64| self.record.metric(&format!("workers.{role}.{name}"), value);
        metric("run_total", 1);
        metric("run_success_with_retries", i64::from(!failed && retried));
        metric("run_success_no_retries", i64::from(!failed && !retried));
        metric("run_failed_with_retries", i64::from(failed && retried));
        metric("run_failed_no_retries", i64::from(failed && !retried));
        let flakiness = match failed {
            true => 100.0,
            false => {
                let (left, max) = (self.restarts.max - self.restarts.used, self.restarts.max);
                100.0 - 100.0 * f64::from(left + 1) / f64::from(max + 1)
            }
        };
        metric("flakiness", flakiness as i64);
    }

    /// A membership change that ends the round: rdzv's event of it.
    pub(super) fn record_change(&self, why: &str, round: u64) {
        if let Some(p) = &self.prom {
            p.membership_changes.inc();
        }
        self.record.event(
            "rdzv.membership.changed",
            EventSource::Agent,
            serde_json::json!({"run_id": self.cfg.run_id, "round": round, "why": why,
                "hostname": hostname()}),
        );
    }
}
