//! Leading a round: the leader watches the whole round (its join keys and withdrawals, the
//! run's live nodes and drains, `closed`), reads it once the watch exists, and keeps its view
//! current from the events, until the seal rule says seal, the round is sealed or closed, or
//! it no longer leads. The seal is one transaction guarded by everything the view assumed.

use super::view::{read_round, Decision, RoundRead, RoundView, SealRule, Since, Step};
use super::{timeout, Outcome, Rendezvous, LOG_TARGET};
use crate::backend::{ranges, Target};
use crate::error::Result;
use crate::rendezvous::records::{lane_values, FinalRecord};
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

/// How long a leader waits between two log records saying why its round is still open.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Leads round `round` until it is sealed. `Ok(None)` means this node no longer leads or its
/// view went stale; the caller reads the round again. `last_call` (when the last call ends)
/// outlives this call and is cleared only when the round stops qualifying for one.
pub(super) async fn lead(
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
    let (mut view, seen) = match read_round(rdzv, round, deadline, since).await? {
        RoundRead::Sealed(sealed) => return Ok(Some(Outcome::Sealed(sealed))),
        RoundRead::Closed => return Err(rdzv.closed_err(left_out)),
        RoundRead::Drained(reason) => return Err(rdzv.drained_err(&reason)),
        RoundRead::Rejoin => return Ok(Some(Outcome::Rejoin)),
        RoundRead::Open(view, seen) => (*view, seen),
    };
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
            tracing::debug!(target: LOG_TARGET, run = %params.run_id(), node = %rdzv.node(), round,
                joined = view.count(), max, last_call_ms = params.last_call_timeout().as_millis() as u64,
                "min_nodes reached: last call for more nodes");
        }
        if held && !waited_for_members {
            waited_for_members = true;
            tracing::info!(target: LOG_TARGET, run = %params.run_id(), node = %rdzv.node(), round,
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
        tracing::info!(target: LOG_TARGET, run = %rdzv.params().run_id(), node = %rdzv.node(), round,
            world_size = sealed.world_size, joined = view.count(), trigger,
            since_first_join_ms = first.then_some(ms), since_takeover_ms = (!first).then_some(ms),
            "round sealed");
        return Ok(Some(Outcome::Sealed(sealed)));
    }
    tracing::debug!(target: LOG_TARGET, run = %rdzv.params().run_id(), node = %rdzv.node(), round,
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
