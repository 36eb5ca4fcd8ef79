//! How a node leaves. A `next` that failed takes back its join request (and the round's
//! leadership) unless the round was sealed with it first, so no round waits on a node that
//! gave up. `shutdown` revokes the node's lease, and the last node out of a run deletes its
//! rounds and stores, so a finished job leaves only `closed` behind.

use super::{round, FinalRecord, Rendezvous, LOG_TARGET};
use crate::backend::ranges;
use crate::error::{Error, Result};
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

/// How long withdrawing a join request may take once `next` has failed. It must run even
/// after `join_timeout`, so `next` can return up to this much later than its deadline.
const WITHDRAW_GRACE: Duration = Duration::from_secs(1);

impl Rendezvous {
    /// After a failed `next`: waits for a round write still in flight, then takes back this
    /// node's join request (and the round's leadership, if it held it) unless the round was
    /// sealed first. Returns the sealed round and this node's rank if it is a member, since it
    /// must then run in that round. If etcd cannot confirm the withdrawal, the node lets its
    /// lease lapse, so that within `lease_ttl` no round counts on it.
    pub(super) async fn withdraw(&self, why: &Error) -> Option<(FinalRecord, u32)> {
        self.give_up.send_replace(true);
        let gate = self.writes.lock().await;
        self.give_up.send_replace(false);
        let (round, last) = {
            let state = self.state();
            (state.joined?, state.last.as_ref().map(|(f, _)| f.round))
        };
        // The key of a round this node already returned from is not a join request of this
        // call (a member keeps it until it joins again): nothing to withdraw.
        if last.is_some_and(|last| round <= last) {
            return None;
        }
        let join = self.keys.join(round, &self.node);
        let leader = self.keys.leader(round);
        let sealed = self.keys.final_(round);
        // With the run's shared keys: it goes with the round, or with the run.
        let gone = self
            .run_lease_id()
            .map(|id| PutOptions::new().with_lease(id));
        let txn = Txn::new()
            .when([
                Compare::create_revision(sealed.clone(), CompareOp::Equal, 0),
                Compare::version(join.clone(), CompareOp::Greater, 0),
            ])
            .and_then([
                TxnOp::delete(join.clone(), None),
                // Fails a seal computed before this withdrawal was seen (round/lead.rs, seal).
                TxnOp::put(self.keys.gone(round, &self.node), "1", gone.clone().ok()),
                // Last: etcd 3.4 drops the responses of operations after a nested transaction.
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(
                            leader.clone(),
                            CompareOp::Equal,
                            self.node.clone(),
                        )])
                        .and_then(round::unclaim_ops(self, round)),
                ),
            ])
            .or_else([
                TxnOp::get(sealed, None),
                TxnOp::get(join, Some(GetOptions::new().with_count_only())),
            ]);
        let deadline = Instant::now() + WITHDRAW_GRACE;
        let outcome = match gone {
            Ok(_) => self.etcd.txn(deadline, "withdraw", txn).await,
            Err(e) => Err(e),
        };
        drop(gate);
        let resp = match outcome {
            Ok(resp) => resp,
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, round, reason = ?why.kind(),
                    error = %e, "could not withdraw the join request: letting the lease lapse so no round waits on this node");
                if let Some(lease) = self.lease.lock().await.take() {
                    drop(lease); // stops the refresh: etcd expires it within lease_ttl
                }
                self.state().joined = None;
                return None;
            }
        };
        if resp.succeeded() {
            tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, round, reason = ?why.kind(),
                sealed_first = false, "withdrew the join request");
            self.state().joined = None;
            return None;
        }
        let got = ranges(&resp);
        if got.get(1).is_some_and(|g| g.count() == 0) {
            self.state().joined = None;
        }
        let kv = got.first()?.kvs().first()?;
        let sealed = FinalRecord::parse(kv.key(), kv.value()).ok()?;
        let rank = self.rank_in(&sealed).await.ok()?;
        tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, round, reason = ?why.kind(),
            sealed_first = true, member = rank.is_some(), "could not withdraw: the round was sealed first");
        Some((sealed, rank?))
    }

    /// Releases this node: wakes a blocked `next` on this handle (and store waits of its
    /// rounds), revokes the lease (which deletes the node's keys, so the others see it leave),
    /// stops refreshing the run's lease, and, if this was the last live node of the run,
    /// deletes the run's rounds and stores. If other nodes' keys are still there (nodes that
    /// died within their lease), the run's keys expire with the run's lease once no node
    /// refreshes it. Does not close the run. Idempotent.
    pub async fn shutdown(&self) -> Result<()> {
        if self.shutdown.send_replace(true) {
            return Ok(());
        }
        // Wait for a running next to notice and let go of the join key.
        let _next = self.next_running.lock().await;
        self.state().lost = None;
        self.state().peers = None;
        let deadline = Instant::now() + self.params.close_timeout();
        // Stops refreshing the run's lease first: once this node's `alive` key is gone, another
        // node leaving at the same moment may be the last one out and revoke it, and a refresh
        // still running here would report it lost.
        let run_lease = self.run_lease().take().map(|l| l.id);
        if let Some(lease) = self.lease.lock().await.take() {
            lease.revoke(&self.etcd, deadline).await?;
        }
        self.delete_finished_run(run_lease, deadline).await?;
        tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, "shut down");
        Ok(())
    }

    /// The last node out of a run deletes its rounds, stores (the rounds' and the run's), round
    /// counter and lease, so a finished job leaves nothing behind and a later job with the same id starts from round 0.
    /// `closed` stays until its retention lease expires. Guarded by "no live node": a node that
    /// is still there (even one that is only waiting, or one that died and whose lease has not
    /// expired yet) keeps the run as it is; the run's lease then removes it later.
    async fn delete_finished_run(&self, run_lease: Option<i64>, deadline: Instant) -> Result<()> {
        // The transaction's guard reads every live node's key; one read that stops at the
        // first of them is enough to know this is not the last node. Without it a job of N
        // nodes leaving costs etcd N²/2 key reads (22 s of shutdowns at 4096 nodes).
        let one_alive = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1);
        let alive = self
            .etcd
            .get(
                deadline,
                "any live node",
                self.keys.alive_prefix(),
                one_alive,
            )
            .await?;
        if !alive.kvs().is_empty() {
            return Ok(());
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.keys.alive_prefix(), CompareOp::Equal, 0)
                    .with_prefix(),
            ])
            .and_then([
                TxnOp::delete(
                    self.keys.rounds_prefix(),
                    Some(DeleteOptions::new().with_prefix()),
                ),
                TxnOp::delete(
                    self.keys.run_store_prefix(),
                    Some(DeleteOptions::new().with_prefix()),
                ),
                TxnOp::delete(
                    self.keys.add_receipts_prefix(),
                    Some(DeleteOptions::new().with_prefix()),
                ),
                TxnOp::delete(self.keys.current(), None),
                // Last: whether it deleted something says who revokes the lease (below).
                TxnOp::delete(self.keys.run_lease(), None),
            ]);
        let resp = self
            .etcd
            .txn(deadline, "clean up finished run", txn)
            .await?;
        let deleted_by_op: Vec<i64> = resp
            .op_responses()
            .iter()
            .map(|op| match op {
                etcd_client::TxnOpResponse::Delete(d) => d.deleted(),
                _ => 0,
            })
            .collect();
        // Nothing of the run is bound to it any more, and no node can have adopted it since
        // (a node reads the id in the transaction that writes its `alive` key): give it back.
        // Only the cleanup that deleted the lease key does: the last nodes of a job often
        // leave together and all run the cleanup, and each revoke is a write every member
        // applies (a soak's job ended with up to 8 of them).
        let deleted_lease_key = deleted_by_op.last().is_some_and(|n| *n > 0);
        if let (true, true, Some(id)) = (resp.succeeded(), deleted_lease_key, run_lease) {
            let _ = crate::backend::lease::revoke(&self.etcd, id, deadline).await;
        }
        // Logged by the node whose cleanup deleted something (two last nodes may both run it).
        let deleted: i64 = deleted_by_op.iter().sum();
        if resp.succeeded() && deleted > 0 {
            tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, keys = deleted,
                "no live node left: deleted the run's rounds, stores and round counter");
        }
        Ok(())
    }
}
