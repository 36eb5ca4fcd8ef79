//! The rendezvous: how nodes of one run agree on the members and ranks of each round.
//!
//! A node joins round `r` by writing one key, `r/{r}/join/{node}`, bound to its lease, in a
//! transaction guarded by `current == r` (one round trip, no retry loop under contention).
//! The first joiner also claims the round's `leader` key in that transaction; every other
//! joiner watches the `leader` key and its lane of the round, `lane/{k}/` with k a hash of its
//! id (where the seal and the wake-ups of a close or a drain reach it). The leader watches the
//! round's join keys and the `alive/` keys, and seals the round by writing `final` (O(1): its
//! size, rank 0, its lane count), each lane's `sealed` (`final` with the ranks of that lane's
//! members) and `current = r + 1` in one transaction guarded by "final absent".
//! So a round of N nodes costs N join writes plus one seal, and a sealed membership never
//! changes. `docs/DESIGN.md` has the state machine and the argument for its correctness.
//!
//! This file holds the handle and the join (`next`, the join transaction, the write gate, the
//! stores a node takes). Submodules, each using only those listed before it (and the handle):
//! `records` (what is written in etcd), `wake` (waking the open round's joiners), `ticket`
//! (release tickets), `lost` (counting lost members by one watch), `leases` (the node's and
//! the run's leases), `membership` (`members`, `num_waiting`, `num_lost`), `close` (closing
//! and failing the run), `drain` (planned departures), `round` (waiting, leading, sealing),
//! `leaving` (withdrawing a join, shutting down, the last node's cleanup).

pub(crate) mod records;

pub(crate) mod wake;

mod ticket;

mod lost;

mod leases;

mod membership;

mod close;

pub(crate) mod drain;

mod round;

mod leaving;
// Members watching each other directly, to find a dead machine before its lease expires.
mod peers;

pub use ticket::ReleaseTicket;

pub(crate) use records::{chunk_count, FinalRecord, JoinRecord};

use crate::backend::keys::Keys;
use crate::backend::{ranges, Etcd, Lease};
use crate::cancel::{cancelled_by_token, CancelToken, HandleCall, HandleCancel};
use crate::error::{Error, ErrorKind, Result};
use crate::params::Params;
use crate::store::Store;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnResponse};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

/// The target of this module's log records, which the rooms split out of it keep: hosts
/// filter and route records by target (`RDZV_LOG`, the log handler), so the split changes none.
const LOG_TARGET: &str = module_path!();

/// What `next` hands back: this node's place in a completed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundInfo {
    pub round: u64,
    pub rank: u32,
    pub world_size: u32,
    /// MASTER_ADDR: rank 0's advertised address.
    pub master_addr: String,
    /// MASTER_PORT: a port that was free on rank 0 when it joined (outside the ephemeral range).
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
    /// When etcd last answered a refresh of this node's lease: the membership watch's answers
    /// are trusted only while it is recent (`watch_trusted`).
    refreshed: Mutex<Option<crate::backend::lease::Refreshed>>,
    /// The run's lease, which this node refreshes while it lives (`backend::keys::run_lease`).
    run_lease: Mutex<Option<Lease>>,
    state: Mutex<NodeState>,
    next_running: tokio::sync::Mutex<()>,
    shutdown: watch::Sender<bool>,
    /// What `cancel` reaches: the `next` in progress, or else the next one to start.
    cancel: HandleCancel,
    /// Writes that change a round (join, leadership claim, seal) run in tasks of their own that
    /// hold this gate. A `next` abandoned in the middle of one (cancel, shutdown, timeout) thus
    /// never leaves a write of unknown outcome behind: withdrawing takes the gate first.
    writes: Arc<tokio::sync::Mutex<()>>,
    /// Turned on while a failed `next` withdraws: a write still retrying stops retrying.
    give_up: watch::Sender<bool>,
    /// The port this node's peers probe while it runs in a round (`peers`); None with
    /// `peer_timeout=0`.
    listener: Option<peers::Listener>,
    /// The receipts of this node's store adds not deleted yet (`Store::add`). The last one is
    /// left when the node leaves, for the run's end: deleting it then would cost every node
    /// one more revision of etcd's history (`scripts/bench.sh --history`).
    add_receipts: crate::store::Receipts,
}

#[derive(Default)]
struct NodeState {
    /// The last round this node completed, and its rank in it.
    last: Option<(FinalRecord, u32)>,
    /// The round whose join key this node may hold: set before the join is sent, so that a
    /// join whose response never arrived is withdrawn too.
    joined: Option<u64>,
    /// Tracks which members of `last` are gone.
    lost: Option<lost::LostTracker>,
    /// Probes the next member of `last` and answers suspicions of this node (`peers`).
    peers: Option<peers::PeerWatch>,
    /// The member list of `last`, once `members` has read it.
    members: Option<(u64, Arc<[String]>)>,
    /// The waiting and lost counts last logged (logged again only when they change).
    seen_waiting: u32,
    seen_lost: u32,
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
    ///
    /// ```no_run
    /// # async fn node() -> rdzv::Result<()> {
    /// use rdzv::{Params, Rendezvous};
    ///
    /// // Every node of the job uses the same URL (the run id is "job-42").
    /// let params = Params::from_url("etcd://127.0.0.1:2379/job-42?min_nodes=2&max_nodes=4")?;
    /// let node = Rendezvous::new(params).await?;
    /// println!("node {} of run {}", node.node_id(), node.params().run_id());
    /// node.shutdown().await // leaves the run, without closing it for the others
    /// # }
    /// ```
    pub async fn new(params: Params) -> Result<Rendezvous> {
        params.validate()?;
        // One deadline for connecting and registering, as rdzv_new promises.
        let deadline = Instant::now() + params.connect_timeout();
        let node = crate::util::new_node_id();
        let etcd = Etcd::connect(&params)
            .await?
            .for_node(params.run_id(), &node);
        tracing::info!(run = %params.run_id(), node = %node, endpoints = %etcd.endpoints(),
            etcd_version = %etcd.server_version(), "connected to etcd");
        let keys = Keys::new(params.key_prefix(), params.run_id());
        // Without a port (out of file descriptors, say) the node is watched by its lease
        // alone, as with peer_timeout=0: a warning, not a failure.
        let listener = match params.peer_timeout().is_zero() {
            true => None,
            false => peers::Listener::start()
                .inspect_err(|e| {
                    tracing::warn!(run = %params.run_id(), node = %node, error = %e,
                        "cannot listen for peer probes: this node's death is noticed by its lease alone")
                })
                .ok(),
        };
        let rdzv = Rendezvous {
            listener,
            addr: params.advertised_addr(),
            params,
            etcd,
            keys,
            node,
            lease: tokio::sync::Mutex::new(None),
            refreshed: Mutex::new(None),
            run_lease: Mutex::new(None),
            state: Mutex::new(NodeState::default()),
            next_running: tokio::sync::Mutex::new(()),
            shutdown: watch::channel(false).0,
            cancel: HandleCancel::default(),
            writes: Arc::new(tokio::sync::Mutex::new(())),
            give_up: watch::channel(false).0,
            add_receipts: Arc::default(),
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
        Instant::now() + self.params.connect_timeout()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run_lease(&self) -> std::sync::MutexGuard<'_, Option<Lease>> {
        self.run_lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until this node is a member of a completed round, `join_timeout` passes, the run
    /// is closed, or the handle is shut down or cancelled. A round is never left waiting on a
    /// node that gave up: a failed `next` withdraws its join request, and if the round was
    /// sealed with this node in it first, `next` returns that round instead of the error.
    ///
    /// `cancel` ends it: a cancel made once `next` is called, even before the returned future
    /// is first polled (a caller may race the future against a signal and cancel on the
    /// signal), and one made before, when no `next` was running (see `cancel`).
    ///
    /// A supervisor's loop: join, run the round's work while polling for a reason to form a
    /// new round, and join again.
    ///
    /// ```no_run
    /// # async fn supervise(node: rdzv::Rendezvous) -> rdzv::Result<()> {
    /// use std::time::Duration;
    ///
    /// loop {
    ///     let (round, store) = node.next().await?;
    ///     // MASTER_ADDR/MASTER_PORT for the workers, and a store to exchange what they need.
    ///     println!("rank {} of {}, master {}:{}", round.rank, round.world_size,
    ///              round.master_addr, round.master_port);
    ///     store.set(&format!("ready/{}", round.rank), b"1").await?;
    ///     // ... start this node's workers ...
    ///     while node.num_waiting().await? == 0 && node.num_lost().await? == 0 {
    ///         tokio::time::sleep(Duration::from_secs(1)).await; // the workers run
    ///     }
    ///     // A node arrived or a member was lost: stop the workers and form a new round.
    /// }
    /// # }
    /// ```
    pub fn next(&self) -> impl std::future::Future<Output = Result<(RoundInfo, Store)>> + '_ {
        self.next_with(&CancelToken::new())
    }

    /// `next`, which also ends (`Cancelled`, withdrawing as a cancel does) once `token` is
    /// cancelled: at once, joining nothing, if it already is.
    pub(crate) fn next_with(
        &self,
        token: &CancelToken,
    ) -> impl std::future::Future<Output = Result<(RoundInfo, Store)>> + '_ {
        // Entered here, not in the future's body, which runs only when first polled.
        let call = self.cancel.enter();
        let shutdown = self.shutdown.subscribe();
        let token = token.clone();
        async move {
            let result = self.next_entered(&call, shutdown, token).await;
            call.ended(&result);
            result
        }
    }

    async fn next_entered(
        &self,
        call: &HandleCall<'_>,
        mut shutdown: watch::Receiver<bool>,
        token: CancelToken,
    ) -> Result<(RoundInfo, Store)> {
        if self.is_shut_down() {
            return Err(Error::shutdown());
        }
        if call.token().is_cancelled() {
            return Err(cancelled_by_handle());
        }
        if token.is_cancelled() {
            return Err(cancelled_by_token("next"));
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
        let started = Instant::now();
        let deadline = started + self.params.join_timeout();
        let result = tokio::select! {
            r = self.join_until_member(deadline) => r,
            _ = shutdown.wait_for(|down| *down) => Err(Error::shutdown()),
            _ = call.token().cancelled() => Err(cancelled_by_handle()),
            _ = token.cancelled() => Err(cancelled_by_token("next")),
        };
        // The round a failed next was in, for the log (withdrawing forgets it). A join key of
        // the round this node last completed is not this call's.
        let tried = {
            let state = self.state();
            let last = state.last.as_ref().map(|(f, _)| f.round);
            state.joined.filter(|&r| last.is_none_or(|last| r > last))
        };
        let result = match result {
            Ok(done) => Ok(done),
            Err(err) => match self.withdraw(&err).await {
                // Sealed with this node before it could withdraw: it must run in that round.
                Some((sealed, rank)) if err.kind() != ErrorKind::Shutdown => {
                    tracing::info!(run = %self.params.run_id(), node = %self.node, round = sealed.round,
                        error = %err, "the round was sealed with this node before it could withdraw: running in it");
                    Ok(self.member_of(sealed, rank))
                }
                _ => Err(err),
            },
        };
        let waited_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok((info, _)) => tracing::info!(
                run = %self.params.run_id(), node = %self.node, round = info.round, rank = info.rank,
                world_size = info.world_size, master = %format!("{}:{}", info.master_addr, info.master_port),
                waited_ms, "round complete"),
            Err(err) => tracing::info!(
                run = %self.params.run_id(), node = %self.node, round = tried,
                kind = ?err.kind(), waited_ms, error = %err, "next failed"),
        }
        result
    }

    async fn join_until_member(&self, deadline: Instant) -> Result<(RoundInfo, Store)> {
        let mut left_out = false;
        let mut round_guess = self.state().last.as_ref().map_or(0, |(f, _)| f.round + 1);
        loop {
            let lease = self.ensure_lease(deadline).await?;
            // Watched before joining, so the join transaction is the read after the watch: a
            // follower waits for the seal without another round trip.
            let early_watch =
                round::follower_watch(self, round_guess, self.lanes(), deadline).await?;
            let joined = match self.join(round_guess, lease, deadline).await {
                // Cut off longer than lease_ttl: etcd dropped our lease (and our keys with it).
                // Take a new lease and join again, as a new arrival.
                Err(e) if e.kind() == ErrorKind::LeaseLost => {
                    tracing::warn!(run = %self.params.run_id(), node = %self.node,
                        "lease lost (cut off longer than lease_ttl): taking a new one and joining again");
                    self.forget_lease().await;
                    continue;
                }
                other => other?,
            };
            let (round, snapshot, first_join) = match joined {
                Joined::Round(r, snapshot) => {
                    // The leader key is claimed in the join only by the round's first joiner.
                    let first = snapshot.leader.as_deref() == Some(self.node.as_str());
                    let role = if first { "leader" } else { "follower" };
                    let leader = snapshot.leader.as_deref().filter(|_| !first);
                    tracing::info!(run = %self.params.run_id(), node = %self.node, round = r, role,
                        leader, "joined round");
                    (r, snapshot, first.then(Instant::now))
                }
                Joined::Moved(current) => {
                    round_guess = current;
                    continue;
                }
                Joined::Closed => return Err(self.closed_error(left_out)),
                Joined::Drained(reason) => return Err(self.drained_err(&reason)),
                // Our earlier attempt at this join landed and the round was sealed with us
                // before we heard back (a response lost in an etcd restart).
                Joined::Sealed(sealed, rank) => return Ok(self.member_of(sealed, rank)),
            };
            // A node that was not in the previous round is outside the running world: if the
            // run closes while it waits, that is a graceful exit, not a failure.
            let last_round = self.state().last.as_ref().map(|(f, _)| f.round);
            let outside = left_out || (round > 0 && last_round != Some(round - 1));
            let waiting = round::Waiting {
                round,
                deadline,
                left_out: outside,
                first_join,
                early_watch: Some(early_watch),
            };
            let outcome = match round::wait_for_seal(self, waiting, snapshot).await {
                Err(e) if e.kind() == ErrorKind::LeaseLost => {
                    tracing::warn!(run = %self.params.run_id(), node = %self.node, round,
                        "lease lost (cut off longer than lease_ttl): taking a new one and joining again");
                    self.forget_lease().await;
                    Outcome::Rejoin
                }
                other => other?,
            };
            match outcome {
                Outcome::Sealed(sealed) => match self.rank_in(&sealed).await? {
                    Some(rank) => return Ok(self.member_of(sealed, rank)),
                    None => {
                        // Left out (the round filled up first): wait for the next one.
                        tracing::info!(run = %self.params.run_id(), node = %self.node, round = sealed.round,
                            world_size = sealed.world_size, "left out of a full round: waiting as a spare");
                        left_out = true;
                        round_guess = sealed.round + 1;
                    }
                },
                Outcome::Rejoin => round_guess = round,
            }
        }
    }

    /// This node's rank in a sealed round, or None if the round left it out: from what the
    /// seal carries (the whole list in a round of one lane, or the ranks of this node's lane,
    /// which is how a waiting follower receives it), else one read of this node's lane (a
    /// member never reads the whole list). A lane that is gone (the round rotated out while
    /// this node was away) also means "not in it".
    async fn rank_in(&self, sealed: &FinalRecord) -> Result<Option<u32>> {
        if let Some(rank) = sealed.inline_rank(&self.node) {
            return Ok(rank);
        }
        let key = self
            .keys
            .lane_sealed(sealed.round, sealed.chunk_of(&self.node));
        let resp = self
            .etcd
            .get(self.quick_deadline(), "read rank", key, GetOptions::new())
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let chunk = records::parse_rank_chunk(kv.key(), kv.value())?;
        Ok(chunk
            .into_iter()
            .find_map(|(node, rank)| (node == self.node).then_some(rank)))
    }

    /// The run's store: the store of a round (`set`, `get`, `add`, `compare_set`, `wait`, ...,
    /// with the same semantics and limits) that lives as long as the run instead of two
    /// rounds, for what a job keeps across rounds: a restart budget (`add` is atomic across
    /// nodes), the last hang report, each node's last health check, why a node left. Keys
    /// under `notes/` are the run's notes, which `Admin::status` (and `rdzv status`) shows.
    ///
    /// Every value is bound to the run's lease, so the store goes with the run: deleted by the
    /// last node out and by a purge, and expired one `lease_ttl` after no node is left to
    /// refresh the lease. Every write is guarded by the run's `lease` key still naming the
    /// lease the store was made with, so a store whose run is gone (or started over under a
    /// new lease, after every node was cut off for longer than `lease_ttl`) fails with a state
    /// error and writes nothing; take it again then. Calls fail with *shutdown* once this node
    /// is shut down; waits end as a round store's do (closed run, shutdown, `Store::cancel`,
    /// a token). `Store::round` returns `u64::MAX` for it.
    ///
    /// Needs no round: a node may take it as soon as it is made. Asks etcd only when this
    /// node's leases have lapsed (it then registers again, as `next` would).
    ///
    /// ```no_run
    /// # async fn budget(node: &rdzv::Rendezvous) -> rdzv::Result<()> {
    /// let run = node.run_store().await?;
    /// if run.add("restarts", 1).await? > 3 {
    ///     run.set("notes/failed", b"restart budget spent").await?;
    ///     node.set_failed("restart budget spent").await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_store(&self) -> Result<Store> {
        self.check_not_shut_down()?;
        self.ensure_lease(self.quick_deadline()).await?;
        let lease = self.run_lease_id()?;
        Ok(Store::for_run(
            self.etcd.clone(),
            &self.keys,
            lease,
            self.params.store_timeout(),
            self.shutdown.subscribe(),
            self.add_receipts.clone(),
        ))
    }

    fn member_of(&self, mut sealed: FinalRecord, rank: u32) -> (RoundInfo, Store) {
        // The lane's ranks were for finding this node's own: not kept.
        sealed.lane = None;
        let info = RoundInfo {
            round: sealed.round,
            rank,
            world_size: sealed.world_size,
            master_addr: sealed.master_addr.clone(),
            master_port: sealed.master_port,
        };
        let store = Store::new(
            self.etcd.in_round(sealed.round),
            &self.keys,
            sealed.round,
            self.run_lease().as_ref().map(|l| l.id),
            self.params.store_timeout(),
            self.shutdown.subscribe(),
            self.add_receipts.clone(),
        );
        let mut state = self.state();
        state.last = Some((sealed, rank));
        // Started on the first num_lost, so forming a round does not pay for it.
        state.lost = None;
        state.peers = None;
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
            probe: self.listener.as_ref().map(peers::Listener::port),
        };
        let current = self.keys.current();
        let round_is_open = wake::is_open(&self.keys, round);
        let leader = self.keys.leader(round);
        let mut ops = vec![TxnOp::put(
            self.keys.join(round, &self.node),
            record.to_json(),
            Some(PutOptions::new().with_lease(lease)),
        )];
        // From here on the join may have landed, whatever happens to this call.
        let previous = self.state().joined.replace(round);
        // A member keeps its join key of the round it ran in until it leaves (its lease): the
        // others count that round's live members by those keys (`num_lost`). The key of a round
        // that left this node out is dropped.
        let member_of = last.map(|(r, _)| r);
        if let Some(prev) = previous.filter(|&p| p != round && Some(p) != member_of) {
            ops.push(TxnOp::delete(self.keys.join(prev, &self.node), None));
        }
        // The first joiner becomes the round's leader in the same round trip; the others read
        // who leads, and in how many lanes. (Last: etcd 3.4 drops the responses of operations
        // that follow a nested transaction.)
        ops.push(TxnOp::txn(
            Txn::new()
                .when([Compare::create_revision(
                    leader.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(round::claim_ops(self, round, lease))
                .or_else([
                    TxnOp::get(leader, None),
                    TxnOp::get(self.keys.lanes(round), None),
                ]),
        ));
        // A drained node never joins again: its departure is planned.
        let txn = Txn::new()
            .when([
                round_is_open,
                Compare::create_revision(self.keys.closed(), CompareOp::Equal, 0),
                Compare::create_revision(self.keys.drain(&self.node), CompareOp::Equal, 0),
            ])
            .and_then(ops)
            .or_else([
                TxnOp::get(current.clone(), None),
                TxnOp::get(self.keys.closed(), None),
                TxnOp::get(self.keys.final_(round), None),
                TxnOp::get(self.keys.drain(&self.node), None),
            ]);
        let resp = self.write(deadline, "join", txn).await?;
        if resp.succeeded() {
            return Ok(Joined::Round(round, self.joined_snapshot(&resp)?));
        }
        self.state().joined = previous;
        let got = ranges(&resp);
        // Sealed comes before closed: a round sealed with this node stands even if the run
        // was closed afterwards.
        if let Some(kv) = got.get(2).and_then(|g| g.kvs().first()) {
            let sealed = FinalRecord::parse(kv.key(), kv.value())?;
            if let Some(rank) = self.rank_in(&sealed).await? {
                self.state().joined = Some(round);
                return Ok(Joined::Sealed(sealed, rank));
            }
        }
        if let Some(kv) = got.get(3).and_then(|g| g.kvs().first()) {
            return Ok(Joined::Drained(
                String::from_utf8_lossy(kv.value()).into_owned(),
            ));
        }
        if got.get(1).is_some_and(|g| !g.kvs().is_empty()) {
            return Ok(Joined::Closed);
        }
        let now_open = match got.first().and_then(|g| g.kvs().first()) {
            Some(kv) => records::parse_round(kv.key(), kv.value())?,
            None => 0,
        };
        Ok(Joined::Moved(now_open))
    }

    /// What a successful join transaction tells about its round, without reading it: its
    /// guards say the run is not closed, this node is not drained and the round is still open
    /// (`current` names it, and the seal moves `current` in the transaction that writes
    /// `final`, so `final` is absent); the node's join key was just written. Only the leader
    /// is read, by the nested claim when it fails.
    fn joined_snapshot(&self, resp: &TxnResponse) -> Result<round::Snapshot> {
        let claim = resp.op_responses().into_iter().find_map(|op| match op {
            etcd_client::TxnOpResponse::Txn(t) => Some(t),
            _ => None,
        });
        let Some(claim) = claim else {
            return Err(Error::internal(format!(
                "join: expected the leader claim's response, got {:?}",
                resp.op_responses()
            )));
        };
        let (leader, lanes) = match claim.succeeded() {
            true => (Some(self.node.clone()), Some(self.lanes())),
            false => {
                let got = ranges(&claim);
                let first = |i: usize| got.get(i).and_then(|g| g.kvs().first());
                let leader = first(0).map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                (leader, first(1).map(records::parse_lanes).transpose()?)
            }
        };
        Ok(round::Snapshot {
            leader,
            lanes,
            sealed: None,
            closed: false,
            joined: true,
            drained: None,
            revision: resp.header().map_or(0, |h| h.revision()),
        })
    }

    /// Sends a transaction that changes a round (join, claim, seal) from a task of its own
    /// holding the write gate: if this call is abandoned, the write still completes (or stops
    /// retrying once `give_up` is set), and `withdraw` waits for it before undoing it.
    pub(crate) async fn write(
        &self,
        deadline: Instant,
        what: &'static str,
        txn: Txn,
    ) -> Result<TxnResponse> {
        let gate = self.writes.clone().lock_owned().await;
        let (etcd, give_up) = (self.etcd.clone(), self.give_up.subscribe());
        let write = tokio::spawn(async move {
            let _held = gate;
            etcd.txn_until(deadline, what, Some(give_up), txn).await
        });
        write
            .await
            .map_err(|e| Error::internal(format!("{what}: the write task failed: {e}")))?
    }

    /// Makes the `next` running on this handle return `Cancelled` (withdrawing its join
    /// request) or, if none is running, the next one to start: that one returns `Cancelled` at
    /// once, joining nothing. A cancel is never lost: it stays pending until a `next` has
    /// ended with `Cancelled` because of it (a `next` that returned its round just as the
    /// cancel came leaves it for the next call). Then it is used up and the handle stays
    /// usable: the `next` after that one runs normally. "Running" starts when `next` is called,
    /// not when its future is first polled. Reaches `next` only: the other calls end when
    /// their future is dropped (the blocking API's take a cancel token, since a blocked thread
    /// has no future to drop). Never blocks; needs no runtime.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    pub(crate) fn etcd(&self) -> &Etcd {
        &self.etcd
    }
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }
    /// How many lanes this node's rounds have when it leads, and which lanes it watches
    /// before it knows the leader's (`seal/lanes`): fixed by `max_nodes`, so that every node
    /// of a run configured alike agrees on it before joining.
    pub(crate) fn lanes(&self) -> u32 {
        chunk_count(self.params.max_nodes() as usize)
    }
    pub(crate) fn node(&self) -> &str {
        &self.node
    }
}

/// The error of a `next` ended by the handle's `cancel`.
fn cancelled_by_handle() -> Error {
    Error::new(
        ErrorKind::Cancelled,
        "next: cancelled by the handle's cancel (rdzv_cancel)",
    )
}

enum Joined {
    /// Joined this round; what the join transaction saw of it.
    Round(u64, round::Snapshot),
    Moved(u64),
    Closed,
    /// This node was drained (the reason): it may not join again.
    Drained(String),
    /// The round was sealed with this node in it (an earlier attempt of this join landed).
    Sealed(FinalRecord, u32),
}
