//! Waiting for a round to be sealed, and sealing it when this node leads.
//!
//! Followers watch the round's leader key and their lane of the round (the seal with their
//! lane's ranks, and the wake-ups of a close or a drain), so an arrival wakes only the leader
//! and the seal hands each follower its rank; the end of a follower's lease wakes it from its
//! own lease keeper. The first watch is made before the join, so the join
//! transaction is the read after the watch. The leader (the node holding the
//! round's `leader` key) keeps the round's joiners and the run's live nodes in memory, fed by
//! one watch, and seals when the round is activated and full, or its last call is over. Any
//! doubt about a watch (etcd restarted, history compacted) sends the node back to
//! watch-then-read, which is always safe because every decision is re-read from etcd and every
//! write is guarded by compares.

use super::records::{chunk_of, inline_members, lane_values, members_from_chunks, parse_lanes};
use super::{FinalRecord, JoinRecord, Outcome, Rendezvous};
use crate::backend::keys::Keys;
use crate::backend::{ranges, Target, Watch};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use tokio::time::Instant;

/// What a node knows about its round at one etcd revision.
pub(crate) struct Snapshot {
    /// The node holding the round's `leader` key, if any.
    pub leader: Option<String>,
    /// The leader's lane count (`seal/lanes`), if the round has a leader.
    pub lanes: Option<u32>,
    pub sealed: Option<FinalRecord>,
    pub closed: bool,
    /// Whether this node's join key still exists.
    pub joined: bool,
    /// Why this node was drained (a planned departure), if it was.
    pub drained: Option<String>,
    /// The etcd revision this snapshot was read at: watch events up to it are already in it.
    pub revision: i64,
}

/// A node's wait for one round.
pub(crate) struct Waiting {
    pub round: u64,
    pub deadline: Instant,
    /// The node is outside the running world (a closed run is a graceful exit for it).
    pub left_out: bool,
    /// When the node joined, if it was the round's first joiner (for the seal's log record).
    pub first_join: Option<Instant>,
    /// The follower watch on this round, made before the join: every snapshot of the wait is
    /// read after it existed, so the first follower wait needs no read of its own.
    pub early_watch: Option<Watch>,
}

/// How long a leader waits between two log records saying why its round is still open.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits until the round is sealed (by this node or another), the run closes, or the
/// deadline passes. `snap` is what the join transaction saw.
pub(crate) async fn wait_for_seal(
    rdzv: &Rendezvous,
    waiting: Waiting,
    mut snap: Snapshot,
) -> Result<Outcome> {
    let Waiting {
        round,
        deadline,
        left_out,
        first_join,
        mut early_watch,
    } = waiting;
    // When this node started leading: its join if it was the first joiner, else its takeover.
    let mut leading_since = first_join;
    let keys = rdzv.keys();
    let leader_key = keys.leader(round);
    // When the leader's last call ends. Kept across re-reads: a flapping connection must not
    // postpone the seal forever.
    let mut last_call: Option<Instant> = None;
    loop {
        // Sealed before closed: a round sealed with this node stands even if the run was
        // closed right after (the other members run in it).
        if let Some(sealed) = snap.sealed {
            return Ok(Outcome::Sealed(sealed));
        }
        if snap.closed {
            return Err(rdzv.closed_err(left_out));
        }
        if let Some(reason) = snap.drained {
            return Err(rdzv.drained_err(&reason));
        }
        if !snap.joined {
            return Ok(Outcome::Rejoin);
        }
        match snap.leader.as_deref() {
            None => {
                snap = claim_leadership(rdzv, round, deadline).await?;
                continue;
            }
            Some(leader) if leader == rdzv.node() => {
                // The leader watches the whole round instead.
                early_watch = None;
                let since = Since {
                    at: *leading_since.get_or_insert_with(Instant::now),
                    first_join: first_join.is_some(),
                };
                match lead(rdzv, round, deadline, left_out, &mut last_call, since).await? {
                    Some(outcome) => return Ok(outcome),
                    // No longer the leader, or the view went stale: start from a fresh read.
                    None => {
                        snap = read_snapshot(rdzv, round, deadline).await?;
                        continue;
                    }
                }
            }
            Some(leader) => {
                tracing::debug!(run = %rdzv.params().run_id(), node = %rdzv.node(), round, leader,
                    "waiting for the leader to seal the round");
            }
        }
        // The lanes are the leader's: a node whose max_nodes differs from the leader's watches
        // the lane the leader writes to, not its own idea of it.
        let lanes = snap.lanes.unwrap_or_else(|| rdzv.lanes());
        let lane = chunk_of(rdzv.node(), lanes);
        let (lane_sealed, closed_wake, my_drain_wake) = (
            keys.lane_sealed(round, lane),
            keys.lane_closed(round, lane),
            keys.lane_drain(round, lane, rdzv.node()),
        );
        if lanes != rdzv.lanes() {
            early_watch = None;
        }
        // The node's join key goes only with its lease, by its own hand, or in a forced purge
        // (which deletes `leader` too): the lease's end wakes the wait instead of a watcher on
        // the key.
        let mut lease_lost = rdzv.lease_lost().await;
        let (mut watch, seen) = match early_watch.take() {
            // Made before the join: the snapshot in hand was read after it existed, and it was
            // checked above (sealed, closed, drained, joined, another node leads).
            Some(watch) => (watch, snap.revision),
            None => {
                let watch = follower_watch(rdzv, round, lanes, deadline).await?;
                // Read after the watch exists, so nothing between the two is missed.
                let fresh = read_snapshot(rdzv, round, deadline).await?;
                let other_leader =
                    fresh.leader.is_some() && fresh.leader != Some(rdzv.node().to_string());
                // A new leader with another lane count took over meanwhile: its seal goes to
                // another lane than the one just watched.
                let lane_moved = fresh.lanes.unwrap_or_else(|| rdzv.lanes()) != lanes;
                if fresh.closed
                    || fresh.sealed.is_some()
                    || fresh.drained.is_some()
                    || !fresh.joined
                    || !other_leader
                    || lane_moved
                {
                    snap = fresh;
                    continue;
                }
                (watch, fresh.revision)
            }
        };
        snap = 'watching: loop {
            let events = tokio::select! {
                e = watch.events() => e,
                _ = lease_gone(&mut lease_lost) => return Err(Error::new(ErrorKind::LeaseLost,
                    "this node's etcd lease expired while it waited for its round to be sealed")),
                _ = tokio::time::sleep_until(deadline) => return Err(timeout(rdzv, None)),
            };
            let Some(events) = events else {
                // The watch broke (etcd restart, compaction): start again from a fresh read.
                break 'watching read_snapshot(rdzv, round, deadline).await?;
            };
            let mut reread = false;
            for ev in events {
                let Some(kv) = ev.kv() else { continue };
                if kv.mod_revision() <= seen {
                    continue; // already in the snapshot
                }
                let key = kv.key();
                let deleted = ev.event_type() == EventType::Delete;
                if key == lane_sealed.as_bytes() && !deleted {
                    return Ok(Outcome::Sealed(FinalRecord::parse(key, kv.value())?));
                } else if (key == closed_wake.as_bytes() || key == my_drain_wake.as_bytes())
                    && !deleted
                {
                    // Re-read rather than fail at once: the round may have been sealed just
                    // before the run was closed, and the read says why this node was drained.
                    reread = true;
                } else if key == leader_key.as_bytes() && deleted {
                    break 'watching claim_leadership(rdzv, round, deadline).await?;
                }
            }
            if reread {
                break 'watching read_snapshot(rdzv, round, deadline).await?;
            }
        };
    }
}

/// Resolves once `lost` turns true; never if its lease is dropped first (shut down, replaced).
async fn lease_gone(lost: &mut tokio::sync::watch::Receiver<bool>) {
    if lost.wait_for(|lost| *lost).await.is_err() {
        std::future::pending::<()>().await
    }
}

/// A follower's watch on round `round` of `lanes` lanes, on one stream: the round's `leader`
/// key (to take over if the leader dies) and the keys of this node's lane, which hold the seal
/// with the lane's ranks and the wake-ups of a close or a drain (`wake.rs`). Arrivals of other
/// nodes wake nobody but the leader, and the seal of other lanes wakes nobody here.
///
/// The leader key is watched where it is rather than copied into every lane: the copies would
/// have to be written by the claim, which rides in every join transaction (as the branch taken
/// only by the first joiner), and etcd logs a transaction whole, branches not taken included.
/// Copies in 64 lanes made every join ~6 KB and a round of 4096 half again slower.
pub(crate) async fn follower_watch(
    rdzv: &Rendezvous,
    round: u64,
    lanes: u32,
    deadline: Instant,
) -> Result<Watch> {
    let keys = rdzv.keys();
    let lane = keys.lane_prefix(round, chunk_of(rdzv.node(), lanes));
    let targets = [Target::Key(keys.leader(round)), Target::Prefix(lane)];
    rdzv.etcd().watch(&targets, deadline).await
}

/// The writes that make this node the leader of `round`: `leader` and the lane count, bound to
/// its lease so they go together when it dies.
pub(crate) fn claim_ops(rdzv: &Rendezvous, round: u64, lease: i64) -> [TxnOp; 2] {
    let keys = rdzv.keys();
    let bound = || Some(etcd_client::PutOptions::new().with_lease(lease));
    [
        TxnOp::put(keys.leader(round), rdzv.node(), bound()),
        TxnOp::put(keys.lanes(round), rdzv.lanes().to_string(), bound()),
    ]
}

/// The deletions that undo `claim_ops` (a leader withdrawing).
pub(crate) fn unclaim_ops(rdzv: &Rendezvous, round: u64) -> [TxnOp; 2] {
    let keys = rdzv.keys();
    [
        TxnOp::delete(keys.leader(round), None),
        TxnOp::delete(keys.lanes(round), None),
    ]
}

/// How many reads a snapshot takes (`snapshot_reads`).
const SNAPSHOT_READS: usize = 6;

/// The reads every snapshot carries, in this order: leader, final, closed, own join key, own
/// drain key, the leader's lane count.
pub(crate) fn snapshot_reads(rdzv: &Rendezvous, round: u64) -> [TxnOp; SNAPSHOT_READS] {
    let keys = rdzv.keys();
    [
        TxnOp::get(keys.leader(round), None),
        TxnOp::get(keys.final_(round), None),
        TxnOp::get(keys.closed(), Some(GetOptions::new().with_count_only())),
        TxnOp::get(
            keys.join(round, rdzv.node()),
            Some(GetOptions::new().with_count_only()),
        ),
        TxnOp::get(keys.drain(rdzv.node()), None),
        TxnOp::get(keys.lanes(round), None),
    ]
}

pub(crate) fn parse_snapshot(resp: &etcd_client::TxnResponse) -> Result<Snapshot> {
    let got = ranges(resp);
    if got.len() < SNAPSHOT_READS {
        return Err(Error::internal(format!(
            "snapshot: expected {SNAPSHOT_READS} reads, got {:?}",
            resp.op_responses()
        )));
    }
    let got = &got[got.len() - SNAPSHOT_READS..];
    Ok(Snapshot {
        leader: got[0]
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        sealed: match got[1].kvs().first() {
            Some(kv) => Some(FinalRecord::parse(kv.key(), kv.value())?),
            None => None,
        },
        closed: got[2].count() > 0,
        joined: got[3].count() > 0,
        drained: got[4]
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        lanes: got[5].kvs().first().map(parse_lanes).transpose()?,
        revision: resp.header().map_or(0, |h| h.revision()),
    })
}

async fn read_snapshot(rdzv: &Rendezvous, round: u64, deadline: Instant) -> Result<Snapshot> {
    let txn = Txn::new().and_then(snapshot_reads(rdzv, round));
    parse_snapshot(&rdzv.etcd().txn(deadline, "read round", txn).await?)
}

/// Tries to become the round's leader (the leader died or none was chosen): one transaction,
/// won by exactly one node; everyone gets a fresh snapshot back either way.
async fn claim_leadership(rdzv: &Rendezvous, round: u64, deadline: Instant) -> Result<Snapshot> {
    let keys = rdzv.keys();
    let lease = rdzv.lease_id().await;
    let txn = Txn::new()
        .when([
            Compare::create_revision(keys.leader(round), CompareOp::Equal, 0),
            Compare::version(keys.join(round, rdzv.node()), CompareOp::Greater, 0),
        ])
        .and_then(
            claim_ops(rdzv, round, lease)
                .into_iter()
                .chain(snapshot_reads(rdzv, round))
                .collect::<Vec<_>>(),
        )
        .or_else(snapshot_reads(rdzv, round));
    parse_snapshot(&rdzv.write(deadline, "claim leadership", txn).await?)
}

/// What the leader knows about its round, kept current by one watch.
struct RoundView {
    round: u64,
    /// Joiners by create revision (arrival order), and the reverse index.
    joiners: BTreeMap<i64, (String, JoinRecord)>,
    revision_of: HashMap<String, i64>,
    /// Nodes that withdrew from this round, with the revision of their withdrawal.
    gone: HashMap<String, i64>,
    /// The newest withdrawal this view knows of; the seal is guarded by "none newer".
    newest_gone: i64,
    /// Members of the previous round, if it exists.
    previous: Option<std::sync::Arc<[String]>>,
    /// Nodes whose `alive` key exists.
    alive: HashSet<String>,
    /// Nodes that are leaving (drained): alive, but never sealed in and never waited for.
    draining: HashSet<String>,
    /// The newest drain this view knows of; the seal is guarded by "none newer".
    newest_drain: i64,
    /// Whether this node still holds the round's `leader` key.
    leading: bool,
    /// Since when this node leads (the seal's log record says how long the round took).
    since: Since,
}

/// When a leader started leading: at its join, when it was the round's first joiner, or when
/// it took over from a leader that died.
#[derive(Clone, Copy)]
struct Since {
    at: Instant,
    first_join: bool,
}

impl RoundView {
    fn add_joiner(&mut self, create_rev: i64, key: &[u8], value: &[u8]) -> Result<()> {
        let node = Keys::node_of(key).unwrap_or_default().to_string();
        let record = JoinRecord::parse(key, value)?;
        if let Some(old) = self.revision_of.insert(node.clone(), create_rev) {
            self.joiners.remove(&old);
        }
        self.joiners.insert(create_rev, (node, record));
        Ok(())
    }

    fn remove_joiner(&mut self, node: &str) {
        if let Some(rev) = self.revision_of.remove(node) {
            self.joiners.remove(&rev);
        }
    }

    fn add_gone(&mut self, key: &[u8], mod_rev: i64) {
        let node = Keys::node_of(key).unwrap_or_default().to_string();
        self.gone.insert(node, mod_rev);
        self.newest_gone = self.newest_gone.max(mod_rev);
    }

    /// Joiners that still stand: a withdrawal after a node's join key was written removes it
    /// even if the deletion of the join key has not reached this view yet (events of several
    /// watchers are not ordered with each other); a drained node never stands.
    fn standing(&self) -> impl Iterator<Item = (&i64, &(String, JoinRecord))> {
        self.joiners
            .iter()
            .filter(|(rev, (node, _))| self.stands(node, **rev))
    }

    fn stands(&self, node: &str, joined_at: i64) -> bool {
        self.gone.get(node).is_none_or(|gone| *gone < joined_at) && !self.draining.contains(node)
    }

    /// Alive and not leaving: a node the round may wait for.
    fn live(&self, node: &str) -> bool {
        self.alive.contains(node) && !self.draining.contains(node)
    }

    fn count(&self) -> usize {
        self.standing().count()
    }

    fn has_joined(&self, node: &str) -> bool {
        self.revision_of
            .get(node)
            .is_some_and(|rev| self.stands(node, *rev))
    }

    /// A round may seal only once the previous round is being abandoned: one of its members
    /// has joined this round, or one has died or is leaving (drained), or there is no previous
    /// round. Otherwise the
    /// joiners are *waiting* nodes and must not form a second world beside a running one.
    fn activated(&self) -> bool {
        match &self.previous {
            None => true,
            Some(prev) => prev.iter().any(|m| self.has_joined(m) || !self.live(m)),
        }
    }

    /// Live members of the previous round that have not joined yet. While any remain, reaching
    /// max_nodes does not seal at once, so new arrivals cannot push out a returning member.
    fn pending_previous(&self) -> usize {
        self.previous.as_ref().map_or(0, |prev| {
            prev.iter()
                .filter(|m| self.live(m) && !self.has_joined(m))
                .count()
        })
    }

    /// The seal rule (DESIGN.md, "Leading"): seal now, and by which part of it, or wait.
    /// `last_call` is when the last call ends: it starts here when the round is activated with
    /// `min` joiners, and is cleared when the round stops qualifying.
    fn decide(&self, rule: &SealRule, last_call: &mut Option<Instant>, now: Instant) -> Decision {
        let n = self.count();
        if !self.activated() || n < rule.min {
            *last_call = None;
            return Decision::Wait {
                until: None,
                held: false,
            };
        }
        if n >= rule.max && self.pending_previous() == 0 {
            return Decision::Seal("max_nodes");
        }
        if self.everyone_joined() {
            return Decision::Seal("everyone_joined");
        }
        let end = *last_call.get_or_insert(now + rule.last_call);
        if now < end {
            return Decision::Wait {
                until: Some(end),
                held: false,
            };
        }
        // A live member of the previous round that is not back yet keeps its place past the
        // last call, for at most `member_wait` more: no spare or newcomer takes it meanwhile.
        if !self.would_displace_a_member(rule.max) {
            return Decision::Seal("last_call");
        }
        let member_wait_end = end + rule.member_wait;
        if now >= member_wait_end {
            return Decision::Seal("member_wait_over");
        }
        Decision::Wait {
            until: Some(member_wait_end),
            held: true,
        }
    }

    /// Whether a seal now would give away the place of a live member of the previous round
    /// that has not joined yet: the rank it would get if it joined now (after the members of
    /// the previous round ranked before it that have joined) would go to another node, or the
    /// round would be full without it. Checking the first such member is enough: a later one's
    /// place is no lower.
    fn would_displace_a_member(&self, max: usize) -> bool {
        let Some(prev) = &self.previous else {
            return false;
        };
        let mut place = 0;
        for m in prev.iter() {
            if self.has_joined(m) {
                place += 1;
            } else if self.live(m) {
                return self.count().min(max) > place;
            }
        }
        false
    }

    /// Nobody is left to wait for: the round re-forms a running world (there is a previous
    /// round), every live member of it has joined, and so has every other live node of the run.
    /// The last call exists for nodes that may still arrive; here only a process that has not
    /// started yet could, and it would be counted in `num_waiting` and admitted by the next
    /// round, as any late arrival is. So a re-rendezvous after a loss, a departure or an
    /// arrival seals as soon as the survivors are in, not a last call later.
    fn everyone_joined(&self) -> bool {
        self.previous.is_some()
            && self.pending_previous() == 0
            && self
                .alive
                .iter()
                .all(|node| self.has_joined(node) || self.draining.contains(node))
    }

    /// Logs why the round is still open: how many joined, whether it is activated, and which
    /// live members of the previous round have not joined yet (the ones the round waits for
    /// before sealing at max_nodes, and the first thing to look at in a hung round).
    fn report_progress(
        &self,
        rdzv: &Rendezvous,
        min: usize,
        max: usize,
        last_call: Option<Instant>,
    ) {
        const SHOWN: usize = 8;
        let missing: Vec<&str> = self.previous.as_ref().map_or(Vec::new(), |prev| {
            prev.iter()
                .filter(|m| self.live(m) && !self.has_joined(m))
                .map(String::as_str)
                .collect()
        });
        let mut named = missing
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(",");
        if missing.len() > SHOWN {
            named.push_str(",...");
        }
        let last_call_in_ms =
            last_call.map(|t| t.saturating_duration_since(Instant::now()).as_millis() as u64);
        let activated = self.activated();
        macro_rules! report {
            ($level:expr) => {
                tracing::event!($level, run = %rdzv.params().run_id(), node = %rdzv.node(),
                    round = self.round, joined = self.count(), min, max, activated, last_call_in_ms,
                    missing_members = missing.len(),
                    missing = (!named.is_empty()).then_some(named.as_str()), "round still open")
            };
        }
        // Nodes waiting while a round runs (late arrivals, spares) are normal: debug only.
        match activated {
            true => report!(tracing::Level::INFO),
            false => report!(tracing::Level::DEBUG),
        }
    }

    /// The sealed record and its members in rank order: survivors of the previous round first,
    /// in their old order (so rank 0 stays rank 0), then newcomers by arrival; at most `max`.
    fn seal_record(&self, max: usize, lanes: u32) -> (FinalRecord, Vec<String>) {
        let mut ordered: Vec<(&i64, &(String, JoinRecord))> = self.standing().collect();
        let prev_round = self.round.checked_sub(1);
        ordered.sort_by_key(|(rev, (_, rec))| match rec.last {
            Some((r, rank)) if Some(r) == prev_round => (0, rank as i64, **rev),
            _ => (1, 0, **rev),
        });
        ordered.truncate(max);
        let rank0 = &ordered[0].1 .1;
        let members: Vec<String> = ordered.iter().map(|(_, (node, _))| node.clone()).collect();
        let sealed = FinalRecord {
            round: self.round,
            world_size: members.len() as u32,
            master_addr: rank0.addr.clone(),
            master_port: rank0.port,
            chunks: lanes,
            members: inline_members(&members, lanes),
            lane: None,
        };
        (sealed, members)
    }

    /// Applies one watch event; returns what ends the wait, if it does.
    fn apply(&mut self, keys: &Keys, me: &str, ev: &etcd_client::Event) -> Result<Option<Step>> {
        let Some(kv) = ev.kv() else { return Ok(None) };
        let key = kv.key();
        let deleted = ev.event_type() == EventType::Delete;
        let round = self.round;
        if key.starts_with(keys.join_prefix(round).as_bytes()) {
            let node = Keys::node_of(key).unwrap_or_default();
            match (deleted, node == me) {
                (true, true) => return Ok(Some(Step::Done(Outcome::Rejoin))),
                (true, false) => self.remove_joiner(node),
                (false, _) => self.add_joiner(kv.create_revision(), key, kv.value())?,
            }
        } else if key.starts_with(keys.gone_prefix(round).as_bytes()) && !deleted {
            self.add_gone(key, kv.mod_revision());
        } else if key == keys.leader(round).as_bytes() {
            self.leading = !deleted && kv.value() == me.as_bytes();
        } else if key.starts_with(keys.drain_prefix().as_bytes()) {
            let node = Keys::node_of(key).unwrap_or_default();
            if deleted {
                self.draining.remove(node);
            } else if node == me {
                return Ok(Some(Step::Drained(
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )));
            } else {
                self.draining.insert(node.to_string());
                self.newest_drain = self.newest_drain.max(kv.mod_revision());
            }
        } else if key.starts_with(keys.alive_prefix().as_bytes()) {
            let node = Keys::node_of(key).unwrap_or_default().to_string();
            if deleted {
                self.alive.remove(&node);
            } else {
                self.alive.insert(node);
            }
        } else if key == keys.final_(round).as_bytes() && !deleted {
            let sealed = FinalRecord::parse(key, kv.value())?;
            return Ok(Some(Step::Done(Outcome::Sealed(sealed))));
        } else if key == keys.closed().as_bytes() && !deleted {
            return Ok(Some(Step::Reread));
        }
        Ok(None)
    }
}

/// The leader's limits: the round's size, its last call, and how long past the last call a
/// live member of the previous round keeps its place (`lease_ttl`).
struct SealRule {
    min: usize,
    max: usize,
    last_call: std::time::Duration,
    member_wait: std::time::Duration,
}

/// What the leader does next (`RoundView::decide`).
#[derive(Debug, PartialEq)]
enum Decision {
    /// Seal now; the part of the rule that allows it (named in the seal's log record).
    Seal(&'static str),
    /// Wait for events, and wake at `until` at the latest. `held`: the last call is over, and
    /// the round waits for a live member of the previous round.
    Wait { until: Option<Instant>, held: bool },
}

/// What makes the leader stop applying events.
enum Step {
    Done(Outcome),
    /// Something that needs a fresh read of the whole round (the run was closed: it may have
    /// been sealed just before).
    Reread,
    /// This node was drained (the reason): it leaves instead of sealing.
    Drained(String),
}

/// Leads round `round` until it is sealed. `Ok(None)` means this node no longer leads or its
/// view went stale; the caller reads the round again. `last_call` (when the last call ends)
/// outlives this call and is cleared only when the round stops qualifying for one.
async fn lead(
    rdzv: &Rendezvous,
    round: u64,
    deadline: Instant,
    left_out: bool,
    last_call: &mut Option<Instant>,
    since: Since,
) -> Result<Option<Outcome>> {
    let keys = rdzv.keys();
    let params = rdzv.params();
    let (min, max) = (params.min_nodes() as usize, params.max_nodes() as usize);
    // Watch first, then read: the view starts from the read and the events after it (events
    // at or before the read's revision are already in it and are skipped).
    let targets = [
        Target::Prefix(keys.round_prefix(round)),
        Target::Prefix(keys.alive_prefix()),
        Target::Prefix(keys.drain_prefix()),
        Target::Key(keys.closed()),
    ];
    let mut watch = rdzv.etcd().watch(&targets, deadline).await?;
    let mut reads = vec![
        TxnOp::get(
            keys.join_prefix(round),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        ),
        TxnOp::get(keys.final_(round), None),
        TxnOp::get(keys.closed(), Some(GetOptions::new().with_count_only())),
        TxnOp::get(
            keys.alive_prefix(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
        TxnOp::get(keys.leader(round), None),
        TxnOp::get(
            keys.gone_prefix(round),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
        TxnOp::get(keys.drain_prefix(), Some(GetOptions::new().with_prefix())),
    ];
    if round > 0 {
        // The previous round's members: the leader is the one node that reads the whole list.
        reads.push(TxnOp::get(keys.final_(round - 1), None));
        reads.push(TxnOp::get(
            keys.lanes_prefix(round - 1),
            Some(GetOptions::new().with_prefix()),
        ));
    }
    let resp = rdzv
        .etcd()
        .txn(deadline, "read round", Txn::new().and_then(reads))
        .await?;
    let seen = resp.header().map_or(0, |h| h.revision());
    let got = ranges(&resp);
    if let Some(kv) = got[1].kvs().first() {
        return Ok(Some(Outcome::Sealed(FinalRecord::parse(
            kv.key(),
            kv.value(),
        )?)));
    }
    if got[2].count() > 0 {
        return Err(rdzv.closed_err(left_out));
    }
    let previous = match (got.get(7).and_then(|g| g.kvs().first()), got.get(8)) {
        (Some(kv), Some(chunks)) => {
            let sealed = FinalRecord::parse(kv.key(), kv.value())?;
            let chunks = chunks.kvs().iter().map(|kv| (kv.key(), kv.value()));
            Some(members_from_chunks(&sealed, chunks)?)
        }
        _ => None,
    };
    if let Some(kv) = got[6]
        .kvs()
        .iter()
        .find(|kv| Keys::node_of(kv.key()) == Some(rdzv.node()))
    {
        return Err(rdzv.drained_err(&String::from_utf8_lossy(kv.value())));
    }
    let mut view = RoundView {
        round,
        joiners: BTreeMap::new(),
        revision_of: HashMap::new(),
        gone: HashMap::new(),
        newest_gone: 0,
        previous,
        alive: got[3]
            .kvs()
            .iter()
            .filter_map(|kv| Keys::node_of(kv.key()))
            .map(str::to_string)
            .collect(),
        draining: got[6]
            .kvs()
            .iter()
            .filter_map(|kv| Keys::node_of(kv.key()))
            .map(str::to_string)
            .collect(),
        newest_drain: got[6]
            .kvs()
            .iter()
            .map(|kv| kv.mod_revision())
            .max()
            .unwrap_or(0),
        leading: got[4]
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == rdzv.node().as_bytes()),
        since,
    };
    for kv in got[0].kvs() {
        view.add_joiner(kv.create_revision(), kv.key(), kv.value())?;
    }
    for kv in got[5].kvs() {
        view.add_gone(kv.key(), kv.mod_revision());
    }
    if !view.revision_of.contains_key(rdzv.node()) {
        return Ok(Some(Outcome::Rejoin));
    }
    let rule = SealRule {
        min,
        max,
        last_call: params.last_call_timeout(),
        member_wait: params.lease_ttl(),
    };
    let mut report_at = Instant::now() + PROGRESS_EVERY;
    let mut waited_for_members = false;
    loop {
        if !view.leading {
            return Ok(None);
        }
        let had_last_call = last_call.is_some();
        let (until, held) = match view.decide(&rule, last_call, Instant::now()) {
            Decision::Seal(trigger) => {
                return seal(rdzv, &view, max, deadline, left_out, trigger).await
            }
            Decision::Wait { until, held } => (until, held),
        };
        if last_call.is_some() && !had_last_call {
            tracing::debug!(run = %params.run_id(), node = %rdzv.node(), round,
                joined = view.count(), max, last_call_ms = params.last_call_timeout().as_millis() as u64,
                "min_nodes reached: last call for more nodes");
        }
        if held && !waited_for_members {
            waited_for_members = true;
            tracing::info!(run = %params.run_id(), node = %rdzv.node(), round,
                joined = view.count(), max, wait_ms = params.lease_ttl().as_millis() as u64,
                "last call over: waiting for the members of the previous round still missing");
        }
        let wake = until.unwrap_or(deadline).min(deadline).min(report_at);
        let events = tokio::select! {
            e = watch.events() => e,
            _ = tokio::time::sleep_until(wake) => {
                if Instant::now() >= deadline {
                    return Err(timeout(rdzv, Some(view.count())));
                }
                if Instant::now() >= report_at {
                    report_at = Instant::now() + PROGRESS_EVERY;
                    view.report_progress(rdzv, min, max, *last_call);
                }
                continue;
            }
        };
        // The watch broke (etcd restart, compaction): read the round again.
        let Some(events) = events else {
            return Ok(None);
        };
        for ev in &events {
            if ev.kv().is_some_and(|kv| kv.mod_revision() <= seen) {
                continue;
            }
            match view.apply(keys, rdzv.node(), ev)? {
                Some(Step::Done(outcome)) => return Ok(Some(outcome)),
                Some(Step::Reread) => return Ok(None),
                Some(Step::Drained(reason)) => return Err(rdzv.drained_err(&reason)),
                None => {}
            }
        }
    }
}

/// Writes the round's membership once: guarded by "no final yet", "not closed", "the leader's
/// own join key still exists and it still holds `leader`" (a leader whose lease expired must
/// not seal), and "no withdrawal or drain newer than the view" (a node that withdrew or was
/// drained after the view was taken must not be sealed in). `Ok(None)`: the view was stale;
/// read the round again.
async fn seal(
    rdzv: &Rendezvous,
    view: &RoundView,
    max: usize,
    deadline: Instant,
    left_out: bool,
    trigger: &str,
) -> Result<Option<Outcome>> {
    let keys = rdzv.keys();
    let round = view.round;
    let run_lease = rdzv.run_lease_id()?;
    let (sealed, members) = view.seal_record(max, rdzv.lanes());
    // Bound to the run's lease: they outlive their writer, and expire once no node is left.
    let shared = || Some(etcd_client::PutOptions::new().with_lease(run_lease));
    let mut writes = vec![
        TxnOp::put(keys.final_(round), sealed.to_json(), shared()),
        TxnOp::put(keys.current(), (round + 1).to_string(), shared()),
    ];
    // The seal as each lane's followers receive it, with the ranks of that lane's members:
    // with `final`, in this one transaction, so a sealed round always has its whole list.
    for (lane, value) in lane_values(&sealed, &members).into_iter().enumerate() {
        writes.push(TxnOp::put(
            keys.lane_sealed(round, lane as u32),
            value,
            shared(),
        ));
    }
    // Keep the previous round (its members may still read its store); drop the one before.
    if round >= 2 {
        writes.push(TxnOp::delete(
            keys.round_prefix(round - 2),
            Some(DeleteOptions::new().with_prefix()),
        ));
    }
    let txn = Txn::new()
        .when([
            Compare::create_revision(keys.final_(round), CompareOp::Equal, 0),
            Compare::create_revision(keys.closed(), CompareOp::Equal, 0),
            Compare::version(keys.join(round, rdzv.node()), CompareOp::Greater, 0),
            Compare::value(keys.leader(round), CompareOp::Equal, rdzv.node()),
            Compare::mod_revision(
                keys.gone_prefix(round),
                CompareOp::Less,
                view.newest_gone + 1,
            )
            .with_prefix(),
            Compare::mod_revision(keys.drain_prefix(), CompareOp::Less, view.newest_drain + 1)
                .with_prefix(),
        ])
        .and_then(writes)
        .or_else([
            TxnOp::get(keys.final_(round), None),
            TxnOp::get(keys.closed(), Some(GetOptions::new().with_count_only())),
        ]);
    let resp = rdzv.write(deadline, "seal round", txn).await?;
    if resp.succeeded() {
        // Only a leader that joined first knows when the round's first join happened.
        let ms = view.since.at.elapsed().as_millis() as u64;
        let first = view.since.first_join;
        tracing::info!(run = %rdzv.params().run_id(), node = %rdzv.node(), round,
            world_size = sealed.world_size, joined = view.count(), trigger,
            since_first_join_ms = first.then_some(ms), since_takeover_ms = (!first).then_some(ms),
            "round sealed");
        return Ok(Some(Outcome::Sealed(sealed)));
    }
    tracing::debug!(run = %rdzv.params().run_id(), node = %rdzv.node(), round,
        "seal refused (view stale, or sealed or closed meanwhile)");
    let got = ranges(&resp);
    if let Some(kv) = got[0].kvs().first() {
        return Ok(Some(Outcome::Sealed(FinalRecord::parse(
            kv.key(),
            kv.value(),
        )?)));
    }
    if got[1].count() > 0 {
        return Err(rdzv.closed_err(left_out));
    }
    Ok(None)
}

fn timeout(rdzv: &Rendezvous, joined: Option<usize>) -> Error {
    let p = rdzv.params();
    let count = joined.map_or(String::new(), |n| format!(" ({n} node(s) had joined)"));
    Error::timeout(format!(
        "no round with min_nodes={} formed within join_timeout={} s{count}",
        p.min_nodes(),
        p.join_timeout().as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LAST_CALL: Duration = Duration::from_millis(500);
    const MEMBER_WAIT: Duration = Duration::from_secs(10);

    fn rule(min: usize, max: usize) -> SealRule {
        SealRule {
            min,
            max,
            last_call: LAST_CALL,
            member_wait: MEMBER_WAIT,
        }
    }

    /// A leader's view of round 1: `previous` is round 0 in rank order, `joined` joined round
    /// 1 in this order, and every node named is alive except the `dead`.
    fn view(previous: &[&str], joined: &[&str], dead: &[&str]) -> RoundView {
        let named = previous.iter().chain(joined);
        let mut view = RoundView {
            round: 1,
            joiners: BTreeMap::new(),
            revision_of: HashMap::new(),
            gone: HashMap::new(),
            newest_gone: 0,
            previous: Some(previous.iter().map(|m| m.to_string()).collect()),
            alive: named
                .filter(|n| !dead.contains(n))
                .map(|n| n.to_string())
                .collect(),
            draining: HashSet::new(),
            newest_drain: 0,
            leading: true,
            since: Since {
                at: Instant::now(),
                first_join: true,
            },
        };
        for (i, node) in joined.iter().enumerate() {
            let last = previous.iter().position(|m| m == node);
            let record = JoinRecord {
                addr: node.to_string(),
                port: 1,
                last: last.map(|rank| (0, rank as u32)),
            };
            let rev = i as i64 + 1;
            view.revision_of.insert(node.to_string(), rev);
            view.joiners.insert(rev, (node.to_string(), record));
        }
        view
    }

    fn members(view: &RoundView, max: usize) -> Vec<String> {
        view.seal_record(max, 1).1
    }

    fn wait(until: Instant, held: bool) -> Decision {
        Decision::Wait {
            until: Some(until),
            held,
        }
    }

    /// Rank 0 (a) is alive but back after the last call; two spares and b have joined,
    /// max_nodes=2. The round waits for a, up to `lease_ttl` past the last call.
    #[test]
    fn a_live_member_back_after_the_last_call_keeps_rank_0_over_spares() {
        let (rule, t0) = (rule(2, 2), Instant::now());
        let mut last_call = None;
        let without_a = view(&["a", "b"], &["s1", "s2", "b"], &[]);
        let end = t0 + LAST_CALL;
        assert_eq!(
            without_a.decide(&rule, &mut last_call, t0),
            wait(end, false)
        );
        assert_eq!(last_call, Some(end));
        let held = wait(end + MEMBER_WAIT, true);
        assert_eq!(without_a.decide(&rule, &mut last_call, end), held);
        let later = end + MEMBER_WAIT - Duration::from_millis(1);
        assert_eq!(without_a.decide(&rule, &mut last_call, later), held);
        // a is back: the round is full with every live member, survivors first.
        let with_a = view(&["a", "b"], &["s1", "s2", "b", "a"], &[]);
        assert_eq!(
            with_a.decide(&rule, &mut last_call, later),
            Decision::Seal("max_nodes")
        );
        assert_eq!(members(&with_a, 2), ["a", "b"]);
        // a never comes back: the wait ends one member_wait after the last call.
        assert_eq!(
            without_a.decide(&rule, &mut last_call, end + MEMBER_WAIT),
            Decision::Seal("member_wait_over")
        );
        assert_eq!(members(&without_a, 2), ["b", "s1"]);
    }

    /// A member that is dead or leaving is not waited for: the spares fill the round at once.
    #[test]
    fn a_dead_or_drained_member_is_not_waited_for() {
        let rule = rule(2, 2);
        let dead = view(&["a", "b"], &["s1", "s2", "b"], &["a"]);
        let mut drained = view(&["a", "b"], &["s1", "s2", "b"], &[]);
        drained.draining.insert("a".to_string());
        for view in [dead, drained] {
            let mut last_call = None;
            let now = Instant::now();
            assert_eq!(
                view.decide(&rule, &mut last_call, now),
                Decision::Seal("max_nodes")
            );
            assert_eq!(members(&view, 2), ["b", "s1"]);
        }
    }

    /// Without spares too: b alone would take a's rank 0, so the round waits for a.
    #[test]
    fn rank_0_is_waited_for_even_when_nobody_else_would_fill_the_round() {
        let (rule, t0) = (rule(1, 2), Instant::now());
        let mut last_call = Some(t0);
        let view = view(&["a", "b"], &["b"], &[]);
        assert_eq!(
            view.decide(&rule, &mut last_call, t0),
            wait(t0 + MEMBER_WAIT, true)
        );
    }

    /// A member whose place nobody would take (the last rank, no newcomer) is not waited for
    /// past the last call; a newcomer that would take its place makes the round wait.
    #[test]
    fn a_member_is_waited_for_only_when_its_place_would_be_taken() {
        let (rule, t0) = (rule(1, 3), Instant::now());
        let alone = view(&["b", "a"], &["b"], &[]);
        let mut last_call = Some(t0);
        assert_eq!(
            alone.decide(&rule, &mut last_call, t0),
            Decision::Seal("last_call")
        );
        let with_newcomer = view(&["b", "a"], &["b", "n"], &[]);
        assert_eq!(
            with_newcomer.decide(&rule, &mut last_call, t0),
            wait(t0 + MEMBER_WAIT, true)
        );
        let back = view(&["b", "a"], &["b", "n", "a"], &[]);
        assert_eq!(
            back.decide(&rule, &mut last_call, t0),
            Decision::Seal("max_nodes")
        );
        assert_eq!(members(&back, 3), ["b", "a", "n"]);
    }

    /// A live node that was not a member keeps the last call, never more.
    #[test]
    fn a_live_node_that_was_not_a_member_is_not_waited_for_past_the_last_call() {
        let (rule, t0) = (rule(1, 3), Instant::now());
        let mut view = view(&["a", "b"], &["a", "b"], &[]);
        view.alive.insert("bystander".to_string());
        let mut last_call = None;
        assert_eq!(
            view.decide(&rule, &mut last_call, t0),
            wait(t0 + LAST_CALL, false)
        );
        assert_eq!(
            view.decide(&rule, &mut last_call, t0 + LAST_CALL),
            Decision::Seal("last_call")
        );
    }
}
