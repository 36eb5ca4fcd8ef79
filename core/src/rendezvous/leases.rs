//! This node's two leases: its own (its `alive` key and join keys are bound to it) and the
//! run's, shared by every node and refreshed by each while it lives (`current`, the seals and
//! the run's store are bound to it, so a run whose nodes all vanished expires). Replacing a
//! lease etcd dropped happens here, one call at a time, and so does the registration that
//! ties the two: the `alive` key is written in the transaction that reads the run's lease.

use super::{records, ReleaseTicket, Rendezvous, LOG_TARGET};
use crate::backend::{ranges, Lease};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

impl Rendezvous {
    /// Grants a lease and writes the `alive` key when this node has none or lost it, and
    /// joins the run's lease (reading it, or creating it when no node holds one) when this
    /// node does not refresh it yet or it expired. Returns this node's own lease.
    ///
    /// The `alive` key is written in the transaction that reads the run's lease: the last node
    /// out deletes the run's lease key only when no `alive` key exists, so a node that read the
    /// id is always seen by that cleanup (`delete_finished_run`).
    pub(super) async fn ensure_lease(&self, deadline: Instant) -> Result<i64> {
        // Held throughout: one node's leases are replaced by one call at a time.
        let mut slot = self.lease.lock().await;
        let own = slot.as_ref().filter(|l| !l.is_lost()).map(|l| l.id);
        let run_ok = self.run_lease_id().is_ok();
        if let (Some(id), true) = (own, run_ok) {
            return Ok(id);
        }
        let mut ops = Vec::new();
        let (id, lost) = match own {
            Some(id) => (id, None),
            None => {
                // A lost lease is gone from etcd already: nothing to revoke (and no time to
                // spend on it inside next's deadline). Dropping it stops its refresh task.
                let lost = slot.take().map(|old| old.id);
                let lease = Lease::grant(&self.etcd, self.params.lease_ttl(), deadline).await?;
                let id = lease.id;
                *self.refreshed.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease.refreshed());
                *slot = Some(lease);
                let alive = self.keys.alive(&self.node);
                let bound = PutOptions::new().with_lease(id);
                ops.push(TxnOp::put(alive, self.addr.clone(), Some(bound)));
                (id, Some(lost))
            }
        };
        if !run_ok {
            ops.push(TxnOp::get(self.keys.run_lease(), None));
        }
        let resp = self
            .etcd
            .txn(deadline, "register alive", Txn::new().and_then(ops))
            .await?;
        match lost {
            Some(Some(old)) => {
                tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, lease = id,
                lost_lease = old, "lease re-acquired: registered alive under a new lease")
            }
            Some(None) => {
                tracing::debug!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, lease = id,
                "registered alive under a lease")
            }
            None => {}
        }
        if lost.is_some() {
            // A new lease means the old join key is gone with the old lease.
            self.state().joined = None;
        }
        if !run_ok {
            let held = ranges(&resp).pop().and_then(|g| g.kvs().first().cloned());
            let run_id = match held {
                Some(kv) => records::parse_lease_id(kv.key(), kv.value())?,
                None => self.create_run_lease(deadline).await?,
            };
            tracing::debug!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, run_lease = run_id,
                "refreshing the run's lease");
            let adopted = Lease::adopt(&self.etcd, run_id, self.params.lease_ttl());
            *self.run_lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(adopted);
        }
        Ok(id)
    }

    /// Grants the run's lease and publishes its id, unless another node published one first
    /// (then that one is the run's, and this grant is revoked). Returns the run's lease id.
    async fn create_run_lease(&self, deadline: Instant) -> Result<i64> {
        let granted = Lease::grant_id(&self.etcd, self.params.lease_ttl(), deadline).await?;
        let key = self.keys.run_lease();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                granted.to_string(),
                Some(PutOptions::new().with_lease(granted)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .etcd
            .txn(deadline, "create the run's lease", txn)
            .await?;
        let published = match ranges(&resp).first().and_then(|g| g.kvs().first()) {
            Some(kv) => Some(records::parse_lease_id(kv.key(), kv.value())?),
            None => None,
        };
        // Our own grant already published: an attempt of this transaction landed but its
        // answer was lost (a leader change, a timed-out attempt) and it was sent again.
        // Revoking it would delete the run's lease and every round bound to it.
        if resp.succeeded() || published == Some(granted) {
            tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, run_lease = granted,
                "created the run's lease");
            return Ok(granted);
        }
        let etcd = self.etcd.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            let _ = crate::backend::lease::revoke(&etcd, granted, deadline).await;
        });
        match published {
            Some(id) => Ok(id),
            // Published and expired in between: ours is being revoked; the caller starts over.
            None => Err(Error::new(
                ErrorKind::LeaseLost,
                "the run's lease expired while this node was joining it",
            )),
        }
    }

    /// After etcd refused a lease: marks whichever of this node's leases etcd no longer knows
    /// as gone, so the next `ensure_lease` replaces it (the node's own lease, if that cannot
    /// be told).
    pub(super) async fn forget_lease(&self) {
        let deadline = self.quick_deadline();
        let own = self.lease.lock().await.as_ref().map(|l| l.id);
        let run = self.run_lease_id().ok();
        for (id, is_own) in [(own, true), (run, false)] {
            let Some(id) = id else { continue };
            let ttl = self
                .etcd
                .call(deadline, "lease time to live", move |mut c| async move {
                    c.lease_time_to_live(id, None).await
                })
                .await;
            let gone = match ttl {
                Ok(resp) => resp.ttl() <= 0,
                Err(e) => e.kind() == ErrorKind::LeaseLost || is_own,
            };
            if !gone {
                continue;
            }
            if is_own {
                if let Some(lease) = self.lease.lock().await.as_ref() {
                    lease.mark_lost();
                }
            } else if let Some(lease) = self.run_lease().as_ref() {
                lease.mark_lost();
            }
        }
    }

    /// What another process needs to end this node's membership at once if this process
    /// dies without shutting down (SIGKILL, the OOM killer): this node's id and its current
    /// lease, for `Admin::release`. `None` after `shutdown`, or while the node holds no live
    /// lease. The lease changes when etcd dropped the old one (the node was cut off longer
    /// than `lease_ttl`; `next` then takes a new one), so a holder should ask again after
    /// each `next`; an outdated ticket releases nothing.
    pub async fn release_ticket(&self) -> Option<ReleaseTicket> {
        if self.is_shut_down() {
            return None;
        }
        let lease = self
            .lease
            .lock()
            .await
            .as_ref()
            .filter(|l| !l.is_lost())?
            .id;
        Some(ReleaseTicket {
            node: self.node.clone(),
            lease,
        })
    }

    /// The id of this node's current lease (0 if it has none).
    pub(crate) async fn lease_id(&self) -> i64 {
        self.lease.lock().await.as_ref().map_or(0, |l| l.id)
    }

    /// The id of the run's lease, to which this node binds the run's shared keys. A node that
    /// holds none (it expired, or the node is shutting down) must not write them unbound.
    pub(crate) fn run_lease_id(&self) -> Result<i64> {
        match self.run_lease().as_ref() {
            Some(lease) if !lease.is_lost() => Ok(lease.id),
            _ => Err(Error::new(
                ErrorKind::LeaseLost,
                "the run's lease expired: no node refreshed it within its TTL",
            )),
        }
    }

    /// Turns true once etcd has said this node's current lease is gone (never, if it has none).
    pub(crate) async fn lease_lost(&self) -> watch::Receiver<bool> {
        match self.lease.lock().await.as_ref() {
            Some(lease) => lease.lost(),
            None => watch::Sender::new(false).subscribe(),
        }
    }
}
