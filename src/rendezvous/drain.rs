//! Planned departures. A node that will go away (a preemption notice, maintenance, a
//! scheduler scaling the job down) is marked with `drain/{node}`, bound to the node's own
//! lease, so the mark lasts exactly as long as the node does. From then on:
//! - the other members count it in `num_lost` at once (their agents re-rendezvous as after a
//!   loss, without waiting for a lease to expire, and without spending restarts);
//! - leaders neither seal it into a round nor wait for it (it is treated as gone), and a seal
//!   is guarded by "no drain newer than the leader's view";
//! - its own `next` ends with a graceful exit, and it can no longer join.

use crate::backend::keys::Keys;
use crate::backend::Etcd;
use crate::error::{Error, Result};
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
