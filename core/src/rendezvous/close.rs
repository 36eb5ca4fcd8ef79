//! Closing the run for every node, with or without a failure recorded (`closed` holds the
//! reason): the close wakes the open round's joiners (`wake.rs`), and the marker stays for
//! `retention`. Whether the run is closed is answered from the membership watch when it can
//! be, since supervisors poll it.

use super::{lost, wake, Rendezvous, LOG_TARGET};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::GetOptions;
use tokio::time::Instant;

impl Rendezvous {
    /// True once any node has called `set_closed`. After this node's first round it answers
    /// from the membership watch (`num_lost`'s), without asking etcd: a close is seen within
    /// the watch's delivery (milliseconds); before the first round, or while the watch is
    /// broken, it reads etcd.
    pub async fn is_closed(&self) -> Result<bool> {
        self.check_not_shut_down()?;
        // From the membership watch while it is in sync (after this node's first round).
        if self.tracked_round().is_some() {
            if let Some(closed) = self.watched(lost::LostTracker::closed) {
                return Ok(closed);
            }
        }
        let options = GetOptions::new().with_count_only();
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "is_closed",
                self.keys.closed(),
                options,
            )
            .await?;
        Ok(resp.count() > 0)
    }

    /// Closes the run for every node: blocked `next` calls return closed, later ones fail fast.
    /// The marker expires after `retention`, so the run id can be used again later.
    pub async fn set_closed(&self) -> Result<()> {
        self.close_run(None).await
    }

    /// Closes the run as `set_closed` does and records that the job failed, with `reason`
    /// (what failed, where): every node and operator can then tell a failed job from one that
    /// ended (`failure`, `Admin::status`), so a supervisor whose own workers were healthy
    /// still reports the job's failure. A later close of either kind replaces the record.
    pub async fn set_failed(&self, reason: &str) -> Result<()> {
        self.close_run(Some(reason)).await
    }

    async fn close_run(&self, failure: Option<&str>) -> Result<()> {
        self.check_not_shut_down()?;
        let deadline = Instant::now() + self.params.close_timeout();
        let what = match failure {
            None => "set_closed",
            Some(_) => "set_failed",
        };
        let value = wake::closed_value(failure);
        wake::close(
            &self.etcd,
            &self.keys,
            self.params.retention(),
            what,
            deadline,
            value,
        )
        .await?;
        tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, failure = ?failure, "closed the run");
        Ok(())
    }

    /// Why the job failed, when the run was closed with `set_failed`; `None` while it is open
    /// or when it was closed with `set_closed`.
    pub async fn failure(&self) -> Result<Option<String>> {
        self.check_not_shut_down()?;
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "failure",
                self.keys.closed(),
                GetOptions::new(),
            )
            .await?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| wake::closed_failure(kv.value())))
    }

    pub(super) fn closed_error(&self, left_out: bool) -> Error {
        if left_out {
            Error::new(
                ErrorKind::GracefulExit,
                "the run was closed while this node waited outside the running round (late or surplus)",
            )
        } else {
            Error::closed(format!(
                "rendezvous {:?} is closed (a closed run id stays closed for retention={} s; \
                 use a new run id or purge the run)",
                self.params.run_id(),
                self.params.retention().as_secs()
            ))
        }
    }

    pub(crate) fn closed_err(&self, left_out: bool) -> Error {
        self.closed_error(left_out)
    }
}
