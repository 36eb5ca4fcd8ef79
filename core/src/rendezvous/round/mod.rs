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
//!
//! This file holds the wait and the follower's side. Submodules, each using only those listed
//! before it (and this file): `view` (what the leader knows of its round, and the seal rule),
//! `lead` (leading: the watch, the read, the seal).

mod view;

mod lead;

use super::records::{chunk_of, parse_lanes};
use super::{FinalRecord, Outcome, Rendezvous};
use crate::backend::{ranges, Target, Watch};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, EventType, GetOptions, Txn, TxnOp};
use lead::lead;
use tokio::time::Instant;
use view::Since;

/// The target of this module's log records, which the rooms split out of it keep: hosts
/// filter and route records by target (`RDZV_LOG`, the log handler), so the split changes none.
const LOG_TARGET: &str = module_path!();

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

fn timeout(rdzv: &Rendezvous, joined: Option<usize>) -> Error {
    let p = rdzv.params();
    let count = joined.map_or(String::new(), |n| format!(" ({n} node(s) had joined)"));
    Error::timeout(format!(
        "no round with min_nodes={} formed within join_timeout={} s{count}",
        p.min_nodes(),
        p.join_timeout().as_secs_f64()
    ))
}
