//! The atomic `add`: an optimistic transaction guarded by the key's revision, whose failure
//! brings the fresh value back, so each retry is one round trip. Each add writes a receipt
//! with its sum, so an add whose answer was lost and that is sent again can tell its own write
//! from another node's; receipts of answered adds are deleted by the node's next add.

use super::Store;
use crate::error::{Error, Result};
use etcd_client::{Compare, CompareOp, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

/// At most this many answered receipts are deleted by one add (etcd takes 128 operations in a
/// transaction); the rest wait for the next.
const RECEIPTS_PER_ADD: usize = 32;

impl Store {
    /// Adds `delta` to the integer at `key` (absent counts as 0) and returns the new value.
    /// Optimistic: the transaction is guarded by the key's mod revision and, when another node
    /// got there first, its else branch returns the fresh value, so each retry is one round trip.
    pub async fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let full = self.key(key)?;
        // This add's receipt, written with the sum in the add's transaction: when the answer
        // to a write that took effect is lost, the library sends it again, its guard fails,
        // and the receipt tells this add's own write from another node's.
        let receipt = format!("{}{}", self.receipts, crate::util::new_node_id());
        let answered = {
            let mut all = self.answered.lock().unwrap_or_else(|e| e.into_inner());
            let keep = all.len().saturating_sub(RECEIPTS_PER_ADD);
            all.split_off(keep)
        };
        // A cancelled add (its future dropped) loses these from the list: they stay in etcd
        // until the run ends, as a node's last receipt does.
        let result = self.add_once(key, &full, delta, &receipt, &answered).await;
        let mut all = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            // The write deleted them: only this add's receipt is left to delete.
            Ok(_) => all.push(receipt),
            // Sent or not, deleted or not: deleting again later is harmless, and the receipt
            // may have been written.
            Err(_) => all.extend(answered.into_iter().chain([receipt])),
        }
        result
    }

    async fn add_once(
        &self,
        key: &str,
        full: &str,
        delta: i64,
        receipt: &str,
        answered: &[String],
    ) -> Result<i64> {
        let deadline = self.op_deadline();
        let (mut value, mut mod_rev) = (0i64, 0i64);
        let mut attempt = 0u32;
        loop {
            let new = value.checked_add(delta).ok_or_else(|| {
                Error::invalid(format!(
                    "add: {value} + {delta} overflows a 64-bit integer at key {key:?}"
                ))
            })?;
            let unchanged = Compare::mod_revision(full, CompareOp::Equal, mod_rev);
            let sum = new.to_string().into_bytes();
            let mut writes = vec![
                self.put(full.to_string(), sum.clone())?,
                self.put(receipt.to_string(), sum)?,
            ];
            writes.extend(answered.iter().map(|r| TxnOp::delete(r.as_str(), None)));
            let reads = vec![TxnOp::get(full, None), TxnOp::get(receipt, None)];
            let got = match self
                .guarded("store add", vec![unchanged], writes, reads)
                .await?
            {
                Ok(_) => return Ok(new),
                Err(got) => got,
            };
            if let Some(mine) = got[1].kvs().first() {
                // This add's write took effect; the answer that said so was lost.
                return parse_integer(key, mine.value());
            }
            match got[0].kvs().first() {
                Some(kv) => {
                    value = parse_integer(key, kv.value())?;
                    mod_rev = kv.mod_revision();
                }
                None => (value, mod_rev) = (0, 0),
            }
            // A lost race on the first try is expected (we guessed "absent"); back off only after.
            if attempt > 0 {
                let pause = Duration::from_micros(200 << attempt.min(6));
                tokio::time::sleep(pause.mul_f64(0.5 + crate::util::random_unit())).await;
            }
            attempt += 1;
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "add: key {key:?} kept changing; gave up"
                )));
            }
        }
    }
}

fn parse_integer(key: &str, value: &[u8]) -> Result<i64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| Error::invalid(format!("add: the value at key {key:?} is not an integer")))
}
