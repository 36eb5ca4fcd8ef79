//! The key-value store handed out with each round, with the semantics of torch's c10d `Store`
//! (`set`, blocking `get`, atomic `add`, `compare_set`, `wait`, ...), kept in etcd under
//! `r/{round}/store/`. Scoping by round means a node of an old round can never write into a
//! newer round's store, and a round's data goes away two rounds later.
//!
//! A store lives exactly as long as its round's `final` key: every write is guarded by it, so
//! a store whose round was deleted (rotated out, or the run finished and was cleaned up) fails
//! instead of writing keys nobody will ever delete.
//!
//! The run's store (`Rendezvous::run_store`) is the same store over `store/` at the run's
//! level, for what must outlive a round (a job-wide restart budget, why a node left). It lives
//! as long as the run's lease it was made with: its values are bound to that lease, and every
//! write is guarded by the run's `lease` key still naming it, as a round's store is by `final`.
//! The last node out and a purge delete `lease` with the rest of the run, so a run store of a
//! finished run writes nothing either. Waits end early when they can no longer
//! succeed: the run closed with the keys still missing, the node shut down, `cancel`, or the
//! caller's cancel token. Those, and the wait's deadline, end it whatever etcd is doing: a
//! read or a watch that etcd does not answer is abandoned (a wait writes nothing, so there is
//! nothing to undo).
//!
//! This file holds the store itself: its limits, the guard every write carries and the writes
//! that need nothing more. Submodules, each using only those listed before it (and the
//! store): `read` (reads of one snapshot), `wait` (waits for keys: a read, then a watch),
//! `add` (the atomic add and its receipts).

mod read;

mod wait;

mod add;

use crate::backend::keys::Keys;
/// etcd's default `--max-request-bytes` is 1.5 MiB; a value (or a `multi_set`'s values
/// together) may be this long, which leaves headroom for keys and framing.
pub use crate::backend::MAX_VALUE_BYTES;
use crate::backend::{ranges, Etcd};
use crate::cancel::HandleCancel;
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnResponse};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The target of this module's log records, which the rooms split out of it keep: hosts
/// filter and route records by target (`RDZV_LOG`, the log handler), so the split changes none.
const LOG_TARGET: &str = module_path!();

/// Keys longer than this are refused: etcd keeps keys in memory and in every index.
pub const MAX_KEY_BYTES: usize = 4096;

/// Longer waits are capped here, so "forever" (e.g. `i64::MAX` ms) cannot overflow a clock.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Keys a `multi_set` writes per transaction (its guard's reads are in the other branch).
const WRITE_KEYS_PER_TXN: usize = 128;

#[derive(Clone)]
pub struct Store {
    etcd: Etcd,
    /// The round this store belongs to; None for the run's store.
    round: Option<u64>,
    prefix: String,
    /// The key the store lives by: the round's `final` (the store exists while it does), or
    /// the run's `lease` (the run's store exists while it names the store's lease).
    anchor: String,
    closed: String,
    /// The run's lease, to which every value is bound (as the round's `final` is): a store
    /// whose nodes are all gone expires with the rest of the run.
    lease: Option<i64>,
    timeout: Arc<Mutex<Duration>>,
    /// The owning node's shutdown flag: once set, every call fails with `Shutdown`.
    shutdown: watch::Receiver<bool>,
    /// What `cancel` reaches: the waits in progress on this store (or a clone), or else the
    /// next one to start.
    cancel: Arc<HandleCancel>,
    /// Where adds leave their receipts (`Keys::add_receipts_prefix`).
    receipts: String,
    /// Receipts of adds that have returned, to delete with the next add: shared by every store
    /// of one node (its rounds' and the run's), so each round does not leave one behind.
    answered: Receipts,
}

/// The receipts of a node's adds that have returned (`Store::add`).
pub(crate) type Receipts = Arc<Mutex<Vec<String>>>;

impl Store {
    pub(crate) fn new(
        etcd: Etcd,
        keys: &Keys,
        round: u64,
        lease: Option<i64>,
        timeout: Duration,
        shutdown: watch::Receiver<bool>,
        answered: Receipts,
    ) -> Store {
        Store {
            etcd,
            round: Some(round),
            prefix: keys.store_prefix(round),
            anchor: keys.final_(round),
            closed: keys.closed(),
            lease,
            timeout: Arc::new(Mutex::new(timeout)),
            shutdown,
            cancel: Arc::new(HandleCancel::default()),
            receipts: keys.add_receipts_prefix(),
            answered,
        }
    }

    /// The run's store, its values bound to the run's lease `lease` and its writes guarded by
    /// the run's `lease` key naming it.
    pub(crate) fn for_run(
        etcd: Etcd,
        keys: &Keys,
        lease: i64,
        timeout: Duration,
        shutdown: watch::Receiver<bool>,
        answered: Receipts,
    ) -> Store {
        Store {
            etcd,
            round: None,
            prefix: keys.run_store_prefix(),
            anchor: keys.run_lease(),
            closed: keys.closed(),
            lease: Some(lease),
            timeout: Arc::new(Mutex::new(timeout)),
            shutdown,
            cancel: Arc::new(HandleCancel::default()),
            receipts: keys.add_receipts_prefix(),
            answered,
        }
    }

    /// The round this store belongs to. The run's store (`Rendezvous::run_store`) belongs to
    /// none: for it this is `u64::MAX`, a number no round ever has (`is_run_store` says so
    /// too).
    pub fn round(&self) -> u64 {
        self.round.unwrap_or(u64::MAX)
    }

    /// True for the run's store (`Rendezvous::run_store`), false for a round's.
    pub fn is_run_store(&self) -> bool {
        self.round.is_none()
    }

    /// How the errors of waits name this store.
    fn what(&self) -> &'static str {
        match self.round {
            Some(_) => "store",
            None => "run store",
        }
    }

    /// The default timeout of `get`, `wait` and `multi_get` (c10d's `set_timeout`).
    pub fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout.min(MAX_WAIT);
    }

    fn usable(&self) -> Result<()> {
        match *self.shutdown.borrow() {
            true => Err(self.shut_down()),
            false => Ok(()),
        }
    }

    fn shut_down(&self) -> Error {
        Error::new(
            ErrorKind::Shutdown,
            match self.round {
                Some(_) => "store: the node that joined this round was shut down",
                None => "run store: the node it was taken from was shut down",
            },
        )
    }

    fn key(&self, key: &str) -> Result<String> {
        if key.is_empty() {
            return Err(Error::invalid("key: expected a non-empty string"));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(format!(
                "key: {} bytes is longer than the limit of {MAX_KEY_BYTES}",
                key.len()
            )));
        }
        Ok(format!("{}{key}", self.prefix))
    }

    /// Deadline for a request that does not wait on other nodes.
    fn op_deadline(&self) -> Instant {
        Instant::now()
            + self
                .timeout()
                .clamp(Duration::from_secs(5), Duration::from_secs(30))
    }

    /// A put of `value` at `key`, bound to the run's lease.
    fn put(&self, key: String, value: Vec<u8>) -> Result<TxnOp> {
        let Some(lease) = self.lease else {
            return Err(Error::new(
                ErrorKind::LeaseLost,
                "store: the run's lease had expired when this round formed",
            ));
        };
        Ok(TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        ))
    }

    /// The guard of every write: the store's round (its `final`), or for the run's store the
    /// run's `lease` key naming the store's lease, still exists.
    fn exists(&self) -> Compare {
        match (self.round, self.lease) {
            (None, Some(lease)) => {
                Compare::value(self.anchor.clone(), CompareOp::Equal, lease.to_string())
            }
            _ => Compare::create_revision(self.anchor.clone(), CompareOp::Greater, 0),
        }
    }

    /// A read of the key the store lives by, for `exists_in`: a count for a round's `final`
    /// (the value is of no use here), the value for the run's `lease` (a decimal id).
    fn read_anchor(&self) -> TxnOp {
        let count = self.round.map(|_| GetOptions::new().with_count_only());
        TxnOp::get(self.anchor.clone(), count)
    }

    /// Whether `read_anchor`'s answer says the store still exists (as `exists` would).
    fn exists_in(&self, got: &etcd_client::GetResponse) -> bool {
        match (self.round, self.lease) {
            (None, Some(lease)) => got
                .kvs()
                .first()
                .is_some_and(|kv| kv.value() == lease.to_string().as_bytes()),
            _ => got.count() > 0,
        }
    }

    /// The error for a store whose round (or run) no longer exists in etcd.
    fn gone(&self, closed: bool) -> Error {
        match (self.round, closed) {
            (Some(round), true) => Error::closed(format!(
                "store of round {round}: the run was closed and its data deleted"
            )),
            (Some(round), false) => Error::state(format!(
                "store of round {round} no longer exists: the run moved on (a round's store is \
                 deleted when the round two after it forms) or its data was deleted"
            )),
            (None, true) => Error::closed(
                "run store: the run was closed and its data deleted (its last node left, or it \
                 was purged)",
            ),
            (None, false) => Error::state(
                "run store no longer exists: the run finished (its last node left), was \
                 purged, or its lease expired with every node cut off and it started over \
                 (take the run store again)",
            ),
        }
    }

    /// Sends a write guarded by "the store still exists"; its else branch reads the key the
    /// store lives by and `closed` after `extra` reads of its own, so the caller can tell why
    /// it failed.
    async fn guarded(
        &self,
        what: &str,
        guards: Vec<Compare>,
        writes: Vec<TxnOp>,
        mut reads: Vec<TxnOp>,
    ) -> Result<std::result::Result<TxnResponse, Vec<etcd_client::GetResponse>>> {
        self.usable()?;
        let mut when = vec![self.exists()];
        when.extend(guards);
        reads.push(self.read_anchor());
        reads.push(TxnOp::get(
            self.closed.clone(),
            Some(GetOptions::new().with_count_only()),
        ));
        let txn = Txn::new().when(when).and_then(writes).or_else(reads);
        let resp = self.etcd.txn(self.op_deadline(), what, txn).await?;
        if resp.succeeded() {
            return Ok(Ok(resp));
        }
        let got = ranges(&resp);
        let (anchor, closed) = (&got[got.len() - 2], &got[got.len() - 1]);
        if !self.exists_in(anchor) {
            return Err(self.gone(closed.count() > 0));
        }
        Ok(Err(got))
    }

    pub async fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let full = self.key(key)?;
        check_value(key, value)?;
        let put = self.put(full, value.to_vec())?;
        self.guarded("store set", vec![], vec![put], vec![])
            .await?
            .map_err(|_| Error::internal("store set: guard failed with the store present"))?;
        Ok(())
    }

    /// c10d's `compare_set`: sets `desired` if the current value is `expected` (or the key is
    /// absent and `expected` is empty) and returns the value the key holds afterwards; when the
    /// key is absent and `expected` is not empty, returns `expected` and changes nothing.
    pub async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let full = self.key(key)?;
        check_value(key, desired)?;
        let guard = if expected.is_empty() {
            Compare::create_revision(full.clone(), CompareOp::Equal, 0)
        } else {
            Compare::value(full.clone(), CompareOp::Equal, expected.to_vec())
        };
        let put = self.put(full.clone(), desired.to_vec())?;
        let read = TxnOp::get(full, None);
        match self
            .guarded("store compare_set", vec![guard], vec![put], vec![read])
            .await?
        {
            Ok(_) => Ok(desired.to_vec()),
            Err(got) => Ok(match got[0].kvs().first() {
                Some(kv) => kv.value().to_vec(),
                None => expected.to_vec(),
            }),
        }
    }

    /// Deletes `key`; true if it existed.
    pub async fn delete_key(&self, key: &str) -> Result<bool> {
        let full = self.key(key)?;
        let resp = self
            .guarded(
                "store delete_key",
                vec![],
                vec![TxnOp::delete(full, None)],
                vec![],
            )
            .await?
            .map_err(|_| {
                Error::internal("store delete_key: guard failed with the store present")
            })?;
        Ok(resp
            .op_responses()
            .iter()
            .any(|op| matches!(op, etcd_client::TxnOpResponse::Delete(d) if d.deleted() > 0)))
    }

    /// Sets every key in one transaction, all or nothing; beyond 128 keys, in one transaction
    /// per 128, in order.
    pub async fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        if keys.len() != values.len() {
            return Err(Error::invalid(format!(
                "multi_set: {} keys but {} values",
                keys.len(),
                values.len()
            )));
        }
        let mut total = 0usize;
        let mut ops = Vec::with_capacity(keys.len());
        for (key, value) in keys.iter().zip(values) {
            check_value(key, value)?;
            total += key.len() + value.len();
            ops.push(self.put(self.key(key)?, value.to_vec())?);
        }
        if total > MAX_VALUE_BYTES {
            return Err(Error::invalid(format!(
                "multi_set: {total} bytes in one call exceeds etcd's request limit of {MAX_VALUE_BYTES} bytes"
            )));
        }
        // etcd takes at most 128 operations per transaction (`--max-txn-ops`): more keys go
        // in several, in order, each all or nothing.
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            let chunk: Vec<TxnOp> = ops.by_ref().take(WRITE_KEYS_PER_TXN).collect();
            self.guarded("store set", vec![], chunk, vec![])
                .await?
                .map_err(|_| Error::internal("store set: guard failed with the store present"))?;
        }
        Ok(())
    }
}

fn check_value(key: &str, value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "value for key {key:?} is {} bytes; etcd accepts at most {MAX_VALUE_BYTES} bytes per request",
                value.len()
            ),
        ));
    }
    Ok(())
}
