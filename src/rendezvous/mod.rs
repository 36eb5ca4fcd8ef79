//! The rendezvous: how nodes of one run agree on the members and ranks of each round.
//!
//! A node joins round `r` by writing one key, `r/{r}/join/{node}`, bound to its lease, in a
//! transaction guarded by `current == r` (one round trip, no retry loop under contention).
//! The first joiner also claims the round's `leader` key in that transaction; every other
//! joiner watches only single keys (leader, final, closed, its own). The leader watches
//! the round's join keys and the `alive/` keys, and seals the round by writing `final` (the
//! members in rank order) and `current = r + 1` in one transaction guarded by "final absent".
//! So a round of N nodes costs N join writes plus one seal, and a sealed membership never
//! changes. `docs/DESIGN.md` has the state machine and the argument for its correctness.

mod lost;
mod records;
mod round;

pub use records::{FinalRecord, JoinRecord};

use crate::backend::keys::Keys;
use crate::backend::{Etcd, Lease};
use crate::error::{Error, ErrorKind, Result};
use crate::params::Params;
use crate::store::Store;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What `next` hands back: this node's place in a completed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundInfo {
    pub round: u64,
    pub rank: u32,
    pub world_size: u32,
    /// MASTER_ADDR: rank 0's advertised address.
    pub master_addr: String,
    /// MASTER_PORT: a port that was free on rank 0 when it joined.
    pub master_port: u16,
}

/// One node's handle on one run. All methods take `&self` and may run concurrently, except
/// that only one `next` runs at a time per handle.
pub struct Rendezvous {
    params: Params,
    etcd: Etcd,
    keys: Keys,
    node: String,
    addr: String,
    lease: tokio::sync::Mutex<Option<Lease>>,
    state: Mutex<NodeState>,
    next_running: tokio::sync::Mutex<()>,
    shutdown: watch::Sender<bool>,
    /// Bumped by `cancel`; a running `next` returns when it changes.
    cancel: watch::Sender<u64>,
}

#[derive(Default)]
struct NodeState {
    /// The last round this node completed, and its rank in it.
    last: Option<(FinalRecord, u32)>,
    /// The round whose join key this node holds now.
    joined: Option<u64>,
    /// Tracks which members of `last` are gone.
    lost: Option<lost::LostTracker>,
}

/// How waiting for a round ended, short of an error.
pub(crate) enum Outcome {
    /// The round was sealed; this node may or may not be in it.
    Sealed(FinalRecord),
    /// This node's join key vanished (its lease expired): join again.
    Rejoin,
}

impl Rendezvous {
    /// Connects to etcd (within `connect_timeout`) and registers this node as alive. Does not
    /// join a round yet.
    pub async fn new(params: Params) -> Result<Rendezvous> {
        params.validate()?;
        // One deadline for connecting and registering, as rdzv_new promises.
        let deadline = Instant::now() + params.connect_timeout;
        let etcd = Etcd::connect(&params).await?;
        let keys = Keys::new(&params.key_prefix, &params.run_id);
        let rdzv = Rendezvous {
            addr: params.advertised_addr(),
            params,
            etcd,
            keys,
            node: crate::util::new_node_id(),
            lease: tokio::sync::Mutex::new(None),
            state: Mutex::new(NodeState::default()),
            next_running: tokio::sync::Mutex::new(()),
            shutdown: watch::channel(false).0,
            cancel: watch::channel(0).0,
        };
        rdzv.ensure_lease(deadline).await?;
        Ok(rdzv)
    }

    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn node_id(&self) -> &str {
        &self.node
    }
    pub fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn check_not_shut_down(&self) -> Result<()> {
        match self.is_shut_down() {
            true => Err(Error::shutdown()),
            false => Ok(()),
        }
    }

    /// Deadline for a short request: etcd gets `connect_timeout` to answer.
    fn quick_deadline(&self) -> Instant {
        Instant::now() + self.params.connect_timeout
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until this node is a member of a completed round, `join_timeout` passes, the run
    /// is closed, or the handle is shut down.
    pub async fn next(&self) -> Result<(RoundInfo, Store)> {
        if self.is_shut_down() {
            return Err(Error::shutdown());
        }
        // shutdown() also takes this lock, to wait for a running next to let go.
        let _only_one = self
            .next_running
            .try_lock()
            .map_err(|_| match self.is_shut_down() {
                true => Error::shutdown(),
                false => {
                    Error::invalid("next: another call to next is already running on this handle")
                }
            })?;
        let deadline = Instant::now() + self.params.join_timeout;
        let mut shutdown = self.shutdown.subscribe();
        let mut cancel = self.cancel.subscribe();
        cancel.mark_unchanged();
        let result = tokio::select! {
            r = self.join_until_member(deadline) => r,
            _ = shutdown.wait_for(|down| *down) => Err(Error::shutdown()),
            _ = cancel.changed() => Err(Error::new(ErrorKind::Cancelled, "next: cancelled by rdzv_cancel")),
        };
        if result.is_err() {
            self.leave_joined_round().await;
        }
        result
    }

    async fn join_until_member(&self, deadline: Instant) -> Result<(RoundInfo, Store)> {
        let mut left_out = false;
        let mut round_guess = self.state().last.as_ref().map_or(0, |(f, _)| f.round + 1);
        loop {
            let lease = self.ensure_lease(deadline).await?;
            let joined = match self.join(round_guess, lease, deadline).await {
                // Cut off longer than lease_ttl: etcd dropped our lease (and our keys with it).
                // Take a new lease and join again, as a new arrival.
                Err(e) if e.kind() == ErrorKind::LeaseLost => {
                    self.forget_lease().await;
                    continue;
                }
                other => other?,
            };
            let (round, snapshot) = match joined {
                Joined::Round(r, snapshot) => (r, snapshot),
                Joined::Moved(current) => {
                    round_guess = current;
                    continue;
                }
                Joined::Closed => return Err(self.closed_error(left_out)),
            };
            // A node that was not in the previous round is outside the running world: if the
            // run closes while it waits, that is a graceful exit, not a failure.
            let last_round = self.state().last.as_ref().map(|(f, _)| f.round);
            let outside = left_out || (round > 0 && last_round != Some(round - 1));
            let outcome = match round::wait_for_seal(self, round, snapshot, deadline, outside).await
            {
                Err(e) if e.kind() == ErrorKind::LeaseLost => {
                    self.forget_lease().await;
                    Outcome::Rejoin
                }
                other => other?,
            };
            match outcome {
                Outcome::Sealed(sealed) => match sealed.rank_of(&self.node) {
                    Some(rank) => return Ok(self.member_of(sealed, rank)),
                    None => {
                        // Left out (the round filled up first): wait for the next one.
                        left_out = true;
                        round_guess = sealed.round + 1;
                    }
                },
                Outcome::Rejoin => round_guess = round,
            }
        }
    }

    fn member_of(&self, sealed: FinalRecord, rank: u32) -> (RoundInfo, Store) {
        let info = RoundInfo {
            round: sealed.round,
            rank,
            world_size: sealed.members.len() as u32,
            master_addr: sealed.master_addr.clone(),
            master_port: sealed.master_port,
        };
        let store = Store::new(
            self.etcd.clone(),
            self.keys.store_prefix(sealed.round),
            self.params.store_timeout,
        );
        let mut state = self.state();
        state.last = Some((sealed, rank));
        // Started on the first num_lost, so forming a round does not pay for it.
        state.lost = None;
        drop(state);
        (info, store)
    }

    /// Writes this node's join key into round `round` if that round is still open, removing
    /// its key from the round it held before.
    async fn join(&self, round: u64, lease: i64, deadline: Instant) -> Result<Joined> {
        let last = self.state().last.as_ref().map(|(f, rank)| (f.round, *rank));
        let record = JoinRecord {
            addr: self.addr.clone(),
            port: crate::util::free_port(),
            last,
        };
        let current = self.keys.current();
        let round_is_open = if round == 0 {
            Compare::create_revision(current.clone(), CompareOp::Equal, 0)
        } else {
            Compare::value(current.clone(), CompareOp::Equal, round.to_string())
        };
        let leader = self.keys.leader(round);
        let mut ops = vec![TxnOp::put(
            self.keys.join(round, &self.node),
            record.to_json(),
            Some(PutOptions::new().with_lease(lease)),
        )];
        let previous = self.state().joined;
        if let Some(prev) = previous.filter(|&p| p != round) {
            ops.push(TxnOp::delete(self.keys.join(prev, &self.node), None));
        }
        ops.extend(round::snapshot_reads(self, round));
        // The first joiner becomes the round's leader in the same round trip. (Last: etcd 3.4
        // drops the responses of operations that follow a nested transaction.)
        ops.push(TxnOp::txn(
            Txn::new()
                .when([Compare::create_revision(
                    leader.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(
                    leader,
                    self.node.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )]),
        ));
        let txn = Txn::new()
            .when([
                round_is_open,
                Compare::create_revision(self.keys.closed(), CompareOp::Equal, 0),
            ])
            .and_then(ops)
            .or_else([
                TxnOp::get(current.clone(), None),
                TxnOp::get(self.keys.closed(), None),
            ]);
        let resp = self.etcd.txn(deadline, "join", txn).await?;
        if resp.succeeded() {
            self.state().joined = Some(round);
            let mut snapshot = round::parse_snapshot(&resp)?;
            let claimed = resp
                .op_responses()
                .iter()
                .any(|op| matches!(op, etcd_client::TxnOpResponse::Txn(t) if t.succeeded()));
            if claimed {
                snapshot.leader = Some(self.node.clone());
            }
            return Ok(Joined::Round(round, snapshot));
        }
        let got = crate::backend::ranges(&resp);
        if got.get(1).is_some_and(|g| !g.kvs().is_empty()) {
            return Ok(Joined::Closed);
        }
        let now_open = match got.first().and_then(|g| g.kvs().first()) {
            Some(kv) => records::parse_round(kv.key(), kv.value())?,
            None => 0,
        };
        Ok(Joined::Moved(now_open))
    }

    /// Grants a lease and writes the `alive` key when this node has none or lost it.
    async fn ensure_lease(&self, deadline: Instant) -> Result<i64> {
        let mut slot = self.lease.lock().await;
        if let Some(lease) = slot.as_ref().filter(|l| !l.is_lost()) {
            return Ok(lease.id);
        }
        if let Some(old) = slot.take() {
            let _ = old.revoke(&self.etcd, self.quick_deadline()).await;
        }
        let lease = Lease::grant(&self.etcd, self.params.lease_ttl, deadline).await?;
        let id = lease.id;
        let alive = self.keys.alive(&self.node);
        let addr = self.addr.clone();
        self.etcd
            .call(deadline, "register alive", move |mut c| {
                let (alive, addr) = (alive.clone(), addr.clone());
                async move {
                    c.put(alive, addr, Some(PutOptions::new().with_lease(id)))
                        .await
                }
            })
            .await?;
        *slot = Some(lease);
        // A new lease means the old join key is gone with the old lease.
        self.state().joined = None;
        Ok(id)
    }

    /// Best effort: take back this node's join request (and the round's leadership, if this
    /// node held it) after a failed `next`.
    async fn leave_joined_round(&self) {
        let joined = self.state().joined.take();
        if let Some(round) = joined {
            let (join, leader) = (self.keys.join(round, &self.node), self.keys.leader(round));
            let txn = Txn::new()
                .when([Compare::value(
                    leader.clone(),
                    CompareOp::Equal,
                    self.node.clone(),
                )])
                .and_then([
                    TxnOp::delete(join.clone(), None),
                    TxnOp::delete(leader, None),
                ])
                .or_else([TxnOp::delete(join, None)]);
            let deadline = Instant::now() + Duration::from_secs(2);
            let _ = self.etcd.txn(deadline, "leave", txn).await;
        }
    }

    /// Marks the lease as gone, so the next `ensure_lease` grants a new one.
    async fn forget_lease(&self) {
        if let Some(lease) = self.lease.lock().await.as_ref() {
            lease.mark_lost();
        }
    }

    /// The id of this node's current lease (0 if it has none).
    pub(crate) async fn lease_id(&self) -> i64 {
        self.lease.lock().await.as_ref().map_or(0, |l| l.id)
    }

    fn closed_error(&self, left_out: bool) -> Error {
        if left_out {
            Error::new(
                ErrorKind::GracefulExit,
                "the run was closed while this node waited outside the running round (late or surplus)",
            )
        } else {
            Error::closed(format!("rendezvous {:?} is closed", self.params.run_id))
        }
    }

    /// Makes a `next` running on this handle return `Cancelled` and withdraw its join request;
    /// the handle stays usable. No effect when no `next` is running.
    pub fn cancel(&self) {
        self.cancel.send_modify(|generation| *generation += 1);
    }

    /// True once any node has called `set_closed`.
    pub async fn is_closed(&self) -> Result<bool> {
        self.check_not_shut_down()?;
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
        self.check_not_shut_down()?;
        let deadline = Instant::now() + self.params.close_timeout;
        let ttl = self.params.retention.as_secs().max(1) as i64;
        let lease = self
            .etcd
            .call(deadline, "set_closed", move |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?
            .id();
        let key = self.keys.closed();
        self.etcd
            .call(deadline, "set_closed", move |mut c| {
                let key = key.clone();
                async move {
                    c.put(key, "1", Some(PutOptions::new().with_lease(lease)))
                        .await
                }
            })
            .await?;
        Ok(())
    }

    /// Nodes waiting to join the round after this node's last round: late arrivals, and
    /// members that already called `next` again. Zero before the first round completes.
    pub async fn num_waiting(&self) -> Result<u32> {
        self.check_not_shut_down()?;
        let Some(round) = self.state().last.as_ref().map(|(f, _)| f.round) else {
            return Ok(0);
        };
        let prefix = self.keys.join_prefix(round + 1);
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "num_waiting",
                prefix,
                GetOptions::new().with_prefix().with_count_only(),
            )
            .await?;
        Ok(resp.count().clamp(0, u32::MAX as i64) as u32)
    }

    /// Members of this node's last round whose lease has expired (dead or cut off), counting
    /// this node itself if its own lease is gone. Non-zero means the round is broken and the
    /// survivors should call `next` to form a new one.
    pub async fn num_lost(&self) -> Result<u32> {
        self.check_not_shut_down()?;
        let members = {
            let mut state = self.state();
            if let Some(count) = state.lost.as_ref().and_then(lost::LostTracker::count) {
                return Ok(count);
            }
            let Some((sealed, _)) = state.last.as_ref() else {
                return Ok(0);
            };
            let members = sealed.members.clone();
            if state.lost.is_none() {
                let prefix = self.keys.alive_prefix();
                let tracker = lost::LostTracker::start(self.etcd.clone(), prefix, members.clone());
                state.lost = Some(tracker);
            }
            members
        };
        // The tracker is not in sync (just started, or its watch broke): read etcd.
        let prefix = self.keys.alive_prefix();
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "num_lost",
                prefix,
                GetOptions::new().with_prefix().with_keys_only(),
            )
            .await?;
        let alive: std::collections::HashSet<&str> = resp
            .kvs()
            .iter()
            .filter_map(|kv| Keys::node_of(kv.key()))
            .collect();
        Ok(members
            .iter()
            .filter(|m| !alive.contains(m.as_str()))
            .count() as u32)
    }

    /// Releases this node: wakes a blocked `next` on this handle, revokes the lease (which
    /// deletes the node's keys, so the others see it leave), and, if the run is closed and this
    /// was the last node, deletes the run's rounds. Does not close the run. Idempotent.
    pub async fn shutdown(&self) -> Result<()> {
        if self.shutdown.send_replace(true) {
            return Ok(());
        }
        // Wait for a running next to notice and let go of the join key.
        let _next = self.next_running.lock().await;
        self.state().lost = None;
        let deadline = Instant::now() + self.params.close_timeout;
        if let Some(lease) = self.lease.lock().await.take() {
            lease.revoke(&self.etcd, deadline).await?;
        }
        self.delete_closed_run(deadline).await
    }

    /// The last node out of a closed run deletes its rounds and stores; `closed` itself stays
    /// until its retention lease expires.
    async fn delete_closed_run(&self, deadline: Instant) -> Result<()> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.keys.closed(), CompareOp::Greater, 0),
                Compare::create_revision(self.keys.alive_prefix(), CompareOp::Equal, 0)
                    .with_prefix(),
            ])
            .and_then([
                TxnOp::delete(
                    self.keys.rounds_prefix(),
                    Some(DeleteOptions::new().with_prefix()),
                ),
                TxnOp::delete(self.keys.current(), None),
            ]);
        self.etcd.txn(deadline, "clean up closed run", txn).await?;
        Ok(())
    }

    pub(crate) fn etcd(&self) -> &Etcd {
        &self.etcd
    }
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }
    pub(crate) fn node(&self) -> &str {
        &self.node
    }
    pub(crate) fn closed_err(&self, left_out: bool) -> Error {
        self.closed_error(left_out)
    }
}

enum Joined {
    /// Joined this round; what the join transaction saw of it.
    Round(u64, round::Snapshot),
    Moved(u64),
    Closed,
}
