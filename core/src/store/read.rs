//! Reading the store without waiting: one snapshot of any number of keys with the run's state
//! beside them, so a read can tell a missing key from a store that is gone. etcd takes 128
//! operations in a transaction, so a read of more keys is several transactions pinned to the
//! first one's revision.

use super::{Store, LOG_TARGET};
use crate::backend::ranges;
use crate::error::Result;
use etcd_client::{GetOptions, Txn, TxnOp};
use tokio::time::Instant;

/// Keys a store read asks for in its first transaction, beside the run's state (two reads):
/// etcd refuses a transaction of more than 128 operations by default (`--max-txn-ops`).
const READ_KEYS_PER_TXN: usize = 126;

/// What one read of the store saw.
pub(super) struct Read {
    pub(super) values: Vec<Option<Vec<u8>>>,
    pub(super) closed: bool,
}

impl Store {
    /// True if every key exists right now.
    pub async fn check(&self, keys: &[&str]) -> Result<bool> {
        let read = self.read(keys, self.op_deadline()).await?;
        Ok(read.values.iter().all(Option::is_some))
    }

    /// Number of keys in this store.
    pub async fn num_keys(&self) -> Result<i64> {
        self.usable()?;
        let count = GetOptions::new().with_count_only();
        let txn = Txn::new().and_then([
            TxnOp::get(self.prefix.clone(), Some(count.clone().with_prefix())),
            self.read_anchor(),
            TxnOp::get(self.closed.clone(), Some(count)),
        ]);
        let resp = self
            .etcd
            .txn(self.op_deadline(), "store num_keys", txn)
            .await?;
        let got = ranges(&resp);
        if !self.exists_in(&got[1]) {
            return Err(self.gone(got[2].count() > 0));
        }
        Ok(got[0].count())
    }

    /// Reads keys in one snapshot (each value, None where absent) with the run's state.
    ///
    /// etcd refuses a transaction of more than 128 operations (`--max-txn-ops`), so a read of
    /// more keys is several transactions: the first reads the run's state and the first keys,
    /// the others read theirs at the first one's revision, so every value is of one snapshot.
    /// If etcd compacts its history past that revision in between (a shared etcd compacts on
    /// a schedule), the read starts again at a fresh one.
    pub(super) async fn read(&self, keys: &[&str], deadline: Instant) -> Result<Read> {
        self.usable()?;
        let full = keys
            .iter()
            .map(|k| self.key(k))
            .collect::<Result<Vec<_>>>()?;
        loop {
            match self.read_snapshot(&full, deadline).await {
                Err(e) if crate::backend::is_compacted(&e) && Instant::now() < deadline => {
                    tracing::debug!(target: LOG_TARGET,
                        keys = full.len(),
                        "store read: history compacted between its transactions, reading again"
                    );
                }
                other => return other,
            }
        }
    }

    async fn read_snapshot(&self, full: &[String], deadline: Instant) -> Result<Read> {
        let first = full.len().min(READ_KEYS_PER_TXN);
        let mut ops: Vec<TxnOp> = full[..first]
            .iter()
            .map(|k| TxnOp::get(k.clone(), None))
            .collect();
        let count = GetOptions::new().with_count_only();
        ops.push(self.read_anchor());
        ops.push(TxnOp::get(self.closed.clone(), Some(count)));
        let resp = self
            .etcd
            .txn(deadline, "store get", Txn::new().and_then(ops))
            .await?;
        let got = ranges(&resp);
        let (anchor, closed) = (&got[first], got[first + 1].count() > 0);
        if !self.exists_in(anchor) {
            return Err(self.gone(closed));
        }
        let value = |g: &etcd_client::GetResponse| g.kvs().first().map(|kv| kv.value().to_vec());
        let mut values: Vec<Option<Vec<u8>>> = got[..first].iter().map(value).collect();
        let revision = resp.header().map_or(0, |h| h.revision());
        for chunk in full[first..].chunks(READ_KEYS_PER_TXN + 2) {
            let at = GetOptions::new().with_revision(revision);
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|k| TxnOp::get(k.clone(), Some(at.clone())))
                .collect();
            let resp = self
                .etcd
                .txn(deadline, "store get", Txn::new().and_then(ops))
                .await?;
            values.extend(ranges(&resp).iter().map(value));
        }
        Ok(Read { values, closed })
    }
}
