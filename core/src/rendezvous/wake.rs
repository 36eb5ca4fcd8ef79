//! Waking the joiners of the open round. A joiner waits on its round's `leader` key and on its
//! lane of the round (the seal), with one stream. Closing the run and draining a node must
//! wake it too, so `closed` and `drain/{node}` are written in one transaction with a marker in
//! the lanes of the round open for joining at that moment (every lane for a close, the node's
//! own for a drain), guarded by `current` naming that round and by its leader's lane count.
//! Every waiting joiner is in that round: a join is guarded by `current == r`, and once
//! `current` moves past `r`, `r` is sealed and its joiners wake for the seal. A round with no
//! leader has no joiner waiting on a lane: each of its joiners is claiming the leadership, and
//! the claim reads `closed` and the joiner's drain.

use crate::backend::keys::Keys;
use crate::backend::{ranges, Etcd};
use crate::error::{Error, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

/// The guard "round `round` is the one open for joining" (`current` absent means 0).
pub(crate) fn is_open(keys: &Keys, round: u64) -> Compare {
    match round {
        0 => Compare::create_revision(keys.current(), CompareOp::Equal, 0),
        _ => Compare::value(keys.current(), CompareOp::Equal, round.to_string()),
    }
}

/// The leader of the round open for joining, as a closer or drainer sees it.
#[derive(Clone, Copy)]
pub(crate) struct Leader {
    /// Its lane count: the lanes its followers wait on.
    pub lanes: u32,
    /// Its lease (that of `seal/lanes`): a wake-up is bound to it, so that it goes when the
    /// followers stop waiting on this leader, and never outlives the run.
    pub lease: i64,
}

/// Sends `guards` then `ops(open, leader)` in the round `open` that is open for joining, where
/// `leader` is its leader's lane count and lease (None: no leader), learning both from the
/// transaction itself and sending again if a seal moved the open round or a new leader took it
/// in between. False when `guards` failed (with the open round and its leader unchanged).
pub(crate) async fn in_open_round(
    etcd: &Etcd,
    keys: &Keys,
    what: &str,
    deadline: Instant,
    guards: &[Compare],
    ops: impl Fn(u64, Option<Leader>) -> Vec<TxnOp>,
) -> Result<bool> {
    // The open round, and the revision and value of its `seal/lanes` (0 and None: absent).
    let (mut open, mut lanes_at, mut lanes) = (0, 0, None);
    loop {
        let same_leader = Compare::mod_revision(keys.lanes(open), CompareOp::Equal, lanes_at);
        let txn = Txn::new()
            .when([guards, &[is_open(keys, open), same_leader]].concat())
            .and_then(ops(open, lanes))
            .or_else([
                TxnOp::get(keys.current(), None),
                TxnOp::get(keys.lanes(open), None),
            ]);
        let resp = etcd.txn(deadline, what, txn).await?;
        if resp.succeeded() {
            return Ok(true);
        }
        let got = ranges(&resp);
        let now_open = match got.first().and_then(|g| g.kvs().first()) {
            Some(kv) => super::records::parse_round(kv.key(), kv.value())?,
            None => 0,
        };
        if now_open == open {
            let now = got.get(1).and_then(|g| g.kvs().first());
            let now_at = now.map_or(0, |kv| kv.mod_revision());
            if now_at == lanes_at {
                return Ok(false);
            }
            lanes_at = now_at;
            lanes = match now {
                Some(kv) => Some(Leader {
                    lanes: super::records::parse_lanes(kv)?,
                    lease: kv.lease(),
                }),
                None => None,
            };
            continue;
        }
        if Instant::now() >= deadline {
            return Err(Error::timeout(format!(
                "{what}: rounds kept being sealed while writing (the open round moved from {open} to {now_open})"
            )));
        }
        (open, lanes_at, lanes) = (now_open, 0, None);
    }
}

/// The value of `closed`: `1` for a run that ended, or `{"failed": REASON}` for a job that
/// failed (`Rendezvous::set_failed`), so that every node and operator can tell the two apart.
pub(crate) fn closed_value(failure: Option<&str>) -> String {
    match failure {
        None => "1".into(),
        Some(reason) => serde_json::json!({ "failed": reason }).to_string(),
    }
}

/// The failure a `closed` value records, if any (a value of another shape is a plain close).
pub(crate) fn closed_failure(value: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    v.get("failed")?.as_str().map(str::to_string)
}

/// Closes the run: `closed` (bound to a lease of `retention`, so the run id can be used again
/// once it expires) holding `value` (`closed_value`), with the wake-up of the open round's
/// joiners (bound to their leader's lease, so that a finished run leaves nothing but
/// `closed`).
pub(crate) async fn close(
    etcd: &Etcd,
    keys: &Keys,
    retention: std::time::Duration,
    what: &str,
    deadline: Instant,
    value: String,
) -> Result<()> {
    let ttl = retention.as_secs().max(1) as i64;
    let lease = etcd
        .call(deadline, what, move |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await?
        .id();
    let bound = |lease| Some(PutOptions::new().with_lease(lease));
    let written = in_open_round(etcd, keys, what, deadline, &[], |open, leader| {
        let wakes = leader.into_iter().flat_map(|leader| {
            (0..leader.lanes)
                .map(move |lane| TxnOp::put(keys.lane_closed(open, lane), "1", bound(leader.lease)))
        });
        std::iter::once(TxnOp::put(keys.closed(), value.as_str(), bound(lease)))
            .chain(wakes)
            .collect()
    })
    .await?;
    match written {
        true => Ok(()),
        false => Err(Error::internal(format!(
            "{what}: an unguarded write was refused"
        ))),
    }
}
