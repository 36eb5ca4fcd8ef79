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

pub(crate) mod drain;
mod lost;
pub(crate) mod records;
mod round;
mod ticket;
pub(crate) mod wake;

pub use ticket::ReleaseTicket;

pub(crate) use records::{chunk_count, FinalRecord, JoinRecord};

use crate::backend::keys::Keys;
use crate::backend::{ranges, Etcd, Lease};
use crate::cancel::{cancelled_by_token, CancelToken, HandleCall, HandleCancel};
use crate::error::{Error, ErrorKind, Result};
use crate::params::Params;
use crate::store::Store;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnResponse,
};
use std::sync::{Arc, Mutex};
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
    /// The receipts of this node's store adds not deleted yet (`Store::add`). The last one is
    /// left when the node leaves, for the run's end: deleting it then would cost every node
    /// one more revision of etcd's history (`scripts/bench.sh --history`).
    add_receipts: crate::store::Receipts,
}

/// How long withdrawing a join request may take once `next` has failed. It must run even
/// after `join_timeout`, so `next` can return up to this much later than its deadline.
const WITHDRAW_GRACE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct NodeState {
    /// The last round this node completed, and its rank in it.
    last: Option<(FinalRecord, u32)>,
    /// The round whose join key this node may hold: set before the join is sent, so that a
    /// join whose response never arrived is withdrawn too.
    joined: Option<u64>,
    /// Tracks which members of `last` are gone.
    lost: Option<lost::LostTracker>,
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
        let rdzv = Rendezvous {
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
    pub fn next_with(
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

    /// The members of this node's last round in rank order (the same list for every member).
    /// Read once, on first use, from the round's lanes: O(round size), which `next` never
    /// pays, since a member receives only its own lane. A round of one lane (`max_nodes` at
    /// most 64) has its list in `final` already, so this reads nothing.
    pub async fn members(&self) -> Result<Arc<[String]>> {
        self.check_not_shut_down()?;
        let sealed = {
            let state = self.state();
            let Some((sealed, _)) = state.last.as_ref() else {
                return Err(Error::invalid(
                    "members: this node has not completed a round yet",
                ));
            };
            if let Some((round, members)) =
                state.members.as_ref().filter(|(r, _)| *r == sealed.round)
            {
                debug_assert_eq!(*round, sealed.round);
                return Ok(members.clone());
            }
            if let Some(members) = &sealed.members {
                return Ok(members.clone());
            }
            sealed.clone()
        };
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "read members",
                self.keys.lanes_prefix(sealed.round),
                GetOptions::new().with_prefix(),
            )
            .await?;
        let chunks = resp.kvs().iter().map(|kv| (kv.key(), kv.value()));
        let members = records::members_from_chunks(&sealed, chunks)?;
        self.state().members = Some((sealed.round, members.clone()));
        Ok(members)
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

    /// `run_store`, ended by `token`.
    pub async fn run_store_with(&self, token: &CancelToken) -> Result<Store> {
        token.run("run_store", self.run_store()).await
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

    /// Grants a lease and writes the `alive` key when this node has none or lost it, and
    /// joins the run's lease (reading it, or creating it when no node holds one) when this
    /// node does not refresh it yet or it expired. Returns this node's own lease.
    ///
    /// The `alive` key is written in the transaction that reads the run's lease: the last node
    /// out deletes the run's lease key only when no `alive` key exists, so a node that read the
    /// id is always seen by that cleanup (`delete_finished_run`).
    async fn ensure_lease(&self, deadline: Instant) -> Result<i64> {
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
                tracing::info!(run = %self.params.run_id(), node = %self.node, lease = id,
                lost_lease = old, "lease re-acquired: registered alive under a new lease")
            }
            Some(None) => {
                tracing::debug!(run = %self.params.run_id(), node = %self.node, lease = id,
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
            tracing::debug!(run = %self.params.run_id(), node = %self.node, run_lease = run_id,
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
            tracing::info!(run = %self.params.run_id(), node = %self.node, run_lease = granted,
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

    /// After a failed `next`: waits for a round write still in flight, then takes back this
    /// node's join request (and the round's leadership, if it held it) unless the round was
    /// sealed first. Returns the sealed round and this node's rank if it is a member, since it
    /// must then run in that round. If etcd cannot confirm the withdrawal, the node lets its
    /// lease lapse, so that within `lease_ttl` no round counts on it.
    async fn withdraw(&self, why: &Error) -> Option<(FinalRecord, u32)> {
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
                // Fails a seal computed before this withdrawal was seen (round.rs, seal).
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
                tracing::warn!(run = %self.params.run_id(), node = %self.node, round, reason = ?why.kind(),
                    error = %e, "could not withdraw the join request: letting the lease lapse so no round waits on this node");
                if let Some(lease) = self.lease.lock().await.take() {
                    drop(lease); // stops the refresh: etcd expires it within lease_ttl
                }
                self.state().joined = None;
                return None;
            }
        };
        if resp.succeeded() {
            tracing::info!(run = %self.params.run_id(), node = %self.node, round, reason = ?why.kind(),
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
        tracing::info!(run = %self.params.run_id(), node = %self.node, round, reason = ?why.kind(),
            sealed_first = true, member = rank.is_some(), "could not withdraw: the round was sealed first");
        Some((sealed, rank?))
    }

    /// After etcd refused a lease: marks whichever of this node's leases etcd no longer knows
    /// as gone, so the next `ensure_lease` replaces it (the node's own lease, if that cannot
    /// be told).
    async fn forget_lease(&self) {
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

    fn closed_error(&self, left_out: bool) -> Error {
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

    /// Marks this node as leaving (a planned departure, such as a preemption notice): the
    /// other members count it in `num_lost` at once and re-form without it, and this node's
    /// `next` ends with a graceful exit from now on. Lasts as long as the node's lease.
    pub async fn drain(&self, reason: &str) -> Result<()> {
        self.check_not_shut_down()?;
        let lease = self.ensure_lease(self.quick_deadline()).await?;
        drain::mark(
            &self.etcd,
            &self.keys,
            &self.node,
            reason,
            Some(lease),
            self.quick_deadline(),
        )
        .await?;
        tracing::info!(run = %self.params.run_id(), node = %self.node, reason, "drained this node");
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

    /// Makes the `next` running on this handle return `Cancelled` (withdrawing its join
    /// request) or, if none is running, the next one to start: that one returns `Cancelled` at
    /// once, joining nothing. A cancel is never lost: it stays pending until a `next` has
    /// ended with `Cancelled` because of it (a `next` that returned its round just as the
    /// cancel came leaves it for the next call). Then it is used up and the handle stays
    /// usable: the `next` after that one runs normally. "Running" starts when `next` is called,
    /// not when its future is first polled. Reaches `next` only (with or without a token of
    /// the caller's); the other calls take a token. Never blocks; needs no runtime.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

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
        tracing::info!(run = %self.params.run_id(), node = %self.node, failure = ?failure, "closed the run");
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

    /// Nodes waiting to join the round after this node's last round that a new round could
    /// admit. Non-zero means the members should call `next`. While a re-rendezvous is under
    /// way (a member of the last round already joined the next one) every joiner counts.
    /// Otherwise only as many newcomers as there is room for: `max_nodes` minus the surviving
    /// members. Spare nodes beyond `max_nodes` wait without being counted, so a full round is
    /// not torn down again and again for nodes it cannot take. Zero before the first round.
    /// Answered from the membership watch while it is in sync (no etcd request: a joiner is
    /// counted within the watch's delivery); read from etcd while the watch is broken or
    /// after a member was lost.
    pub async fn num_waiting(&self) -> Result<u32> {
        let n = self.count_waiting().await?;
        self.report_change(
            n,
            |s| &mut s.seen_waiting,
            "nodes waiting for the next round",
        );
        Ok(n)
    }

    /// Members of this node's last round whose lease has expired (dead or cut off) or that are
    /// leaving (drained), counting this node itself if its own lease is gone or it is drained.
    /// Non-zero means the round is broken and the survivors should call `next` to form a new
    /// one (a drained node's own `next` then ends with a graceful exit).
    pub async fn num_lost(&self) -> Result<u32> {
        let n = self.count_lost().await?;
        self.report_change(n, |s| &mut s.seen_lost, "members of the round lost");
        Ok(n)
    }

    // The calls above with a cancel token of the caller's: each returns `Cancelled` once the
    // token is cancelled (at once, without touching etcd, if it already is), whatever etcd is
    // doing. A write cancelled while it was on its way (`set_closed`, `set_failed`, `drain`)
    // may or may not have been applied, as one that times out; calling it again is safe.

    /// `is_closed`, ended by `token`.
    pub async fn is_closed_with(&self, token: &CancelToken) -> Result<bool> {
        token.run("is_closed", self.is_closed()).await
    }
    /// `set_closed`, ended by `token` (the close may still have been applied).
    pub async fn set_closed_with(&self, token: &CancelToken) -> Result<()> {
        token.run("set_closed", self.set_closed()).await
    }
    /// `set_failed`, ended by `token` (the close may still have been applied).
    pub async fn set_failed_with(&self, reason: &str, token: &CancelToken) -> Result<()> {
        token.run("set_failed", self.set_failed(reason)).await
    }
    /// `failure`, ended by `token`.
    pub async fn failure_with(&self, token: &CancelToken) -> Result<Option<String>> {
        token.run("failure", self.failure()).await
    }
    /// `num_waiting`, ended by `token`.
    pub async fn num_waiting_with(&self, token: &CancelToken) -> Result<u32> {
        token.run("num_waiting", self.num_waiting()).await
    }
    /// `num_lost`, ended by `token`.
    pub async fn num_lost_with(&self, token: &CancelToken) -> Result<u32> {
        token.run("num_lost", self.num_lost()).await
    }
    /// `members`, ended by `token`.
    pub async fn members_with(&self, token: &CancelToken) -> Result<Arc<[String]>> {
        token.run("members", self.members()).await
    }
    /// `drain`, ended by `token` (the mark may still have been written).
    pub async fn drain_with(&self, reason: &str, token: &CancelToken) -> Result<()> {
        token.run("drain", self.drain(reason)).await
    }
    /// `is_draining`, ended by `token`.
    pub async fn is_draining_with(&self, token: &CancelToken) -> Result<bool> {
        token.run("is_draining", self.is_draining()).await
    }

    /// Logs a count that supervisors poll, once each time it changes.
    fn report_change(&self, now: u32, seen: fn(&mut NodeState) -> &mut u32, what: &str) {
        let mut state = self.state();
        let round = state.last.as_ref().map(|(f, _)| f.round);
        let before = std::mem::replace(seen(&mut state), now);
        drop(state);
        if before != now {
            tracing::info!(run = %self.params.run_id(), node = %self.node, round, count = now, "{what}");
        }
    }

    async fn count_waiting(&self) -> Result<u32> {
        self.check_not_shut_down()?;
        let Some(sealed) = self.tracked_round() else {
            return Ok(0);
        };
        let (round, world) = (sealed.round, sealed.world_size);
        let clamp = |n: usize| n.min(u32::MAX as usize) as u32;
        // From the tracker's watch while it is in sync (no member lost: all survive).
        if let Some(w) = self.watched(lost::LostTracker::waiting) {
            if w.rejoining {
                return Ok(clamp(w.joined));
            }
            let room = (self.params.max_nodes() as usize).saturating_sub(world as usize);
            return Ok(clamp(w.joined.min(room)));
        }
        let prefix = self.keys.join_prefix(round + 1);
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "num_waiting",
                prefix,
                GetOptions::new().with_prefix(),
            )
            .await?;
        if resp.kvs().is_empty() {
            return Ok(0);
        }
        // A joiner's record names the round it last completed: a member of ours means a
        // re-rendezvous is under way.
        let joined = resp.kvs().len();
        for kv in resp.kvs() {
            let record = JoinRecord::parse(kv.key(), kv.value())?;
            if record.last.is_some_and(|(r, _)| r == round) {
                return Ok(clamp(joined));
            }
        }
        let survivors = (world as usize).saturating_sub(self.count_lost().await? as usize);
        let room = (self.params.max_nodes() as usize).saturating_sub(survivors);
        Ok(clamp(joined.min(room)))
    }

    /// Whether the membership watch's answers can be trusted: etcd answered a refresh of this
    /// node's lease within two refresh periods (two thirds of `lease_ttl`). A watch alone cannot
    /// tell a quiet etcd from one this node is cut off from; without recent refreshes the
    /// counts are read, and a node cut off gets its error, as before.
    fn watch_trusted(&self) -> bool {
        let window = self.params.lease_ttl() * 2 / 3;
        self.refreshed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|r| r.within(window))
    }

    /// What the membership watch answers (`what`), when it is in sync and trusted.
    fn watched<T>(&self, what: impl Fn(&lost::LostTracker) -> Option<T>) -> Option<T> {
        if !self.watch_trusted() {
            return None;
        }
        self.state().lost.as_ref().and_then(what)
    }

    /// The round whose membership the tracker follows (this node's last), starting the
    /// tracker on first use; None before this node's first round.
    fn tracked_round(&self) -> Option<FinalRecord> {
        let mut state = self.state();
        let (sealed, _) = state.last.as_ref()?;
        let sealed = sealed.clone();
        if state.lost.is_none() {
            let etcd = self.etcd.in_round(sealed.round);
            let tracker = lost::LostTracker::start(etcd, self.keys.clone(), sealed.clone());
            state.lost = Some(tracker);
        }
        Some(sealed)
    }

    async fn count_lost(&self) -> Result<u32> {
        self.check_not_shut_down()?;
        let Some(sealed) = self.tracked_round() else {
            return Ok(0);
        };
        if let Some(count) = self.watched(lost::LostTracker::count) {
            return Ok(count);
        }
        // The tracker is not in sync (just started, or its watch broke), or a member is lost
        // and its watch ended: read etcd.
        let n = lost::read_lost(&self.etcd, &self.keys, &sealed, self.quick_deadline()).await?;
        if let Some(tracker) = self.state().lost.as_ref() {
            tracker.read(n);
        }
        Ok(n)
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
        let deadline = Instant::now() + self.params.close_timeout();
        // Stops refreshing the run's lease first: once this node's `alive` key is gone, another
        // node leaving at the same moment may be the last one out and revoke it, and a refresh
        // still running here would report it lost.
        let run_lease = self.run_lease().take().map(|l| l.id);
        if let Some(lease) = self.lease.lock().await.take() {
            lease.revoke(&self.etcd, deadline).await?;
        }
        self.delete_finished_run(run_lease, deadline).await?;
        tracing::info!(run = %self.params.run_id(), node = %self.node, "shut down");
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
            tracing::info!(run = %self.params.run_id(), node = %self.node, keys = deleted,
                "no live node left: deleted the run's rounds, stores and round counter");
        }
        Ok(())
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
    pub(crate) fn closed_err(&self, left_out: bool) -> Error {
        self.closed_error(left_out)
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
