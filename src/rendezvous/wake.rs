//! Waking the joiners of the open round. A joiner waits with one watcher, on its round's
//! `seal/` keys (who leads, the seal). Closing the run and draining a node must wake it too,
//! so `closed` and `drain/{node}` are written in one transaction with a marker under the
//! `seal/` of the round open for joining at that moment, guarded by `current` naming that
//! round. Every waiting joiner is in that round: a join is guarded by `current == r`, and
//! once `current` moves past `r`, `r` is sealed and its joiners wake for the seal.

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

/// Sends `guards` then `ops(open)` in the round `open` that is open for joining, learning it
/// from the transaction itself and sending again if a seal moved it in between. False when
/// `guards` failed (with the open round unchanged).
pub(crate) async fn in_open_round(
    etcd: &Etcd,
    keys: &Keys,
    what: &str,
    deadline: Instant,
    guards: &[Compare],
    ops: impl Fn(u64) -> Vec<TxnOp>,
) -> Result<bool> {
    let mut open = 0;
    loop {
        let txn = Txn::new()
            .when([guards, &[is_open(keys, open)]].concat())
            .and_then(ops(open))
            .or_else([TxnOp::get(keys.current(), None)]);
        let resp = etcd.txn(deadline, what, txn).await?;
        if resp.succeeded() {
            return Ok(true);
        }
        let now_open = match ranges(&resp).first().and_then(|g| g.kvs().first()) {
            Some(kv) => super::records::parse_round(kv.key(), kv.value())?,
            None => 0,
        };
        if now_open == open {
            return Ok(false);
        }
        if Instant::now() >= deadline {
            return Err(Error::timeout(format!(
                "{what}: rounds kept being sealed while writing (the open round moved from {open} to {now_open})"
            )));
        }
        open = now_open;
    }
}

/// Closes the run: `closed` (bound to a lease of `retention`, so the run id can be used again
/// once it expires), with the wake-up of the open round's joiners bound to the same lease.
pub(crate) async fn close(
    etcd: &Etcd,
    keys: &Keys,
    retention: std::time::Duration,
    what: &str,
    deadline: Instant,
) -> Result<()> {
    let ttl = retention.as_secs().max(1) as i64;
    let lease = etcd
        .call(deadline, what, move |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await?
        .id();
    let bound = || Some(PutOptions::new().with_lease(lease));
    let written = in_open_round(etcd, keys, what, deadline, &[], |open| {
        vec![
            TxnOp::put(keys.closed(), "1", bound()),
            TxnOp::put(keys.closed_wake(open), "1", bound()),
        ]
    })
    .await?;
    match written {
        true => Ok(()),
        false => Err(Error::internal(format!(
            "{what}: an unguarded write was refused"
        ))),
    }
}
