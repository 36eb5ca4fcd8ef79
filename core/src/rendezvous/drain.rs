//! Planned departures. A node that will go away (a preemption notice, maintenance, a
//! scheduler scaling the job down) is marked with `drain/{node}`, bound to the node's own
//! lease, so the mark lasts exactly as long as the node does. From then on:
//! - the other members count it in `num_lost` at once (their agents re-rendezvous as after a
//!   loss, without waiting for a lease to expire, and without spending restarts);
//! - leaders neither seal it into a round nor wait for it (it is treated as gone), and a seal
//!   is guarded by "no drain newer than the leader's view";
//! - its own `next` ends with a graceful exit, and it can no longer join.
//!
//! `mark` writes it, for the node itself (`Rendezvous::drain`, below) and for operators
//! (`Admin::drain`).

use super::{Rendezvous, LOG_TARGET};
use crate::backend::keys::Keys;
use crate::backend::Etcd;
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, TxnOp};
use tokio::time::Instant;

/// Writes `drain/{node}` with `reason`, bound to the node's lease: `lease` when the node
/// drains itself, else the lease of its `alive` key. Fails with an invalid argument naming the
/// node if it is not a live node of the run. Draining a draining node again only updates the
/// reason.
pub(crate) async fn mark(
    etcd: &Etcd,
    keys: &Keys,
    node: &str,
    reason: &str,
    lease: Option<i64>,
    deadline: Instant,
) -> Result<()> {
    if node.is_empty() || node.contains('/') {
        return Err(Error::invalid(format!(
            "drain: node id {node:?} is not a node id (rdzv status lists the run's nodes)"
        )));
    }
    let alive = keys.alive(node);
    let not_alive = || {
        Error::invalid(format!(
            "drain: node {node:?} is not a live node of this run (rdzv status lists them)"
        ))
    };
    let (lease, guard) = match lease {
        Some(lease) => (
            lease,
            Compare::version(alive.clone(), CompareOp::Greater, 0),
        ),
        None => {
            let resp = etcd
                .get(deadline, "drain", alive.clone(), GetOptions::new())
                .await?;
            let kv = resp.kvs().first().ok_or_else(not_alive)?;
            (
                kv.lease(),
                Compare::mod_revision(alive.clone(), CompareOp::Equal, kv.mod_revision()),
            )
        }
    };
    // The node may leave between the read and the write: the guard makes that an error
    // instead of a mark no lease will ever remove. The wake-up in the open round ends the
    // node's wait there at once, if it is waiting to join.
    let bound = || Some(PutOptions::new().with_lease(lease));
    let written =
        super::wake::in_open_round(etcd, keys, "drain", deadline, &[guard], |open, lanes| {
            let mut ops = vec![TxnOp::put(keys.drain(node), reason, bound())];
            if let Some(leader) = lanes {
                let lane = super::records::chunk_of(node, leader.lanes);
                ops.push(TxnOp::put(
                    keys.lane_drain(open, lane, node),
                    reason,
                    bound(),
                ));
            }
            ops
        })
        .await?;
    match written {
        true => Ok(()),
        false => Err(not_alive()),
    }
}

impl Rendezvous {
    /// Marks this node as leaving (a planned departure, such as a preemption notice): the
    /// other members count it in `num_lost` at once and re-form without it, and this node's
    /// `next` ends with a graceful exit from now on. Lasts as long as the node's lease.
    pub async fn drain(&self, reason: &str) -> Result<()> {
        self.check_not_shut_down()?;
        let lease = self.ensure_lease(self.quick_deadline()).await?;
        mark(
            &self.etcd,
            &self.keys,
            &self.node,
            reason,
            Some(lease),
            self.quick_deadline(),
        )
        .await?;
        tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, reason, "drained this node");
        Ok(())
    }

    /// True once this node was drained (by `drain`, an operator or a scheduler). One etcd read.
    pub async fn is_draining(&self) -> Result<bool> {
        self.check_not_shut_down()?;
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "is_draining",
                self.keys.drain(&self.node),
                GetOptions::new().with_count_only(),
            )
            .await?;
        Ok(resp.count() > 0)
    }

    /// The error a drained node's `next` ends with: a graceful exit, since its departure was
    /// planned (its agent stops its workers and leaves without failing the job).
    pub(crate) fn drained_err(&self, reason: &str) -> Error {
        let why = match reason.trim() {
            "" => String::new(),
            r => format!(": {r}"),
        };
        Error::new(
            ErrorKind::GracefulExit,
            format!(
                "node {} was drained{why} (a planned departure): it leaves run {:?}, whose other \
                 nodes form the next round without it",
                self.node,
                self.params.run_id()
            ),
        )
    }
}
