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

use crate::backend::keys::Keys;
use crate::backend::{ranges, Etcd, Target, RDZV_MAX_VALUE_BYTES};
use crate::cancel::{cancelled_by_token, CancelToken, HandleCall, HandleCancel};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnResponse};
use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Keys longer than this are refused: etcd keeps keys in memory and in every index.
pub const RDZV_MAX_KEY_BYTES: usize = 4096;

/// Longer waits are capped here, so "forever" (e.g. `i64::MAX` ms) cannot overflow a clock.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long past its deadline a wait may still be reading: a wait with timeout 0 still reads
/// once (a key that exists is returned), and a read begun just before the deadline may finish.
/// An etcd that does not answer ends the wait this long after its deadline.
const READ_GRACE: Duration = Duration::from_secs(1);

/// Keys a store read asks for in its first transaction, beside the run's state (two reads):
/// etcd refuses a transaction of more than 128 operations by default (`--max-txn-ops`).
const READ_KEYS_PER_TXN: usize = 126;
/// Keys a `multi_set` writes per transaction (its guard's reads are in the other branch).
const WRITE_KEYS_PER_TXN: usize = 128;

/// A store wait as it was called: see `Store::waiting`.
struct Waiting<'a> {
    deadline: Instant,
    /// As the caller gave it (None: the store's default), for the timeout's message.
    timeout: Option<Duration>,
    /// Its hold on the store's own cancel.
    call: HandleCall<'a>,
    token: CancelToken,
}

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

/// At most this many answered receipts are deleted by one add (etcd takes 128 operations in a
/// transaction); the rest wait for the next.
const RECEIPTS_PER_ADD: usize = 32;

/// What one read of the store saw.
struct Read {
    values: Vec<Option<Vec<u8>>>,
    closed: bool,
}

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

    /// Makes the `get`, `wait` and `multi_get` calls running on this store (or a clone) return
    /// `Cancelled` or, if none is running, the next one to start (at once). A call is running
    /// from the moment it is made, before its future is first polled. Never lost: the cancel
    /// stays pending until a wait has ended with `Cancelled` because of it (waits that start
    /// meanwhile end too); then it is used up and later waits run normally. Reaches the waits
    /// only (with or without a token of the caller's); the other calls take a token. Never
    /// blocks; needs no runtime.
    pub fn cancel(&self) {
        self.cancel.cancel();
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
        if key.len() > RDZV_MAX_KEY_BYTES {
            return Err(Error::invalid(format!(
                "key: {} bytes is longer than the limit of {RDZV_MAX_KEY_BYTES}",
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

    /// A wait that starts now: its deadline, and its hold on `cancel` taken at the call, not
    /// when the wait's future is first polled, so a cancel in between reaches it.
    fn waiting(&self, timeout: Option<Duration>, token: &CancelToken) -> Waiting<'_> {
        let waited = timeout.unwrap_or_else(|| self.timeout()).min(MAX_WAIT);
        Waiting {
            deadline: Instant::now() + waited,
            timeout,
            call: self.cancel.enter(),
            token: token.clone(),
        }
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

    /// Waits up to `timeout` (or the store's default) for `key` to exist, then returns it.
    pub fn get<'a>(
        &'a self,
        key: &'a str,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Vec<u8>>> + 'a {
        self.get_with(key, timeout, &CancelToken::new())
    }

    /// `get`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it already is.
    pub fn get_with<'a>(
        &'a self,
        key: &'a str,
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> impl Future<Output = Result<Vec<u8>>> + 'a {
        let waiting = self.waiting(timeout, cancel);
        async move {
            let keys = [key];
            Ok(self
                .wait_for(&keys, waiting)
                .await?
                .pop()
                .unwrap_or_default())
        }
    }

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

    /// Waits until every key exists.
    pub fn wait<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<()>> + 'a {
        self.wait_with(keys, timeout, &CancelToken::new())
    }

    /// `wait`, which also ends (`Cancelled`) once `cancel` is cancelled.
    pub fn wait_with<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> impl Future<Output = Result<()>> + 'a {
        let waiting = self.waiting(timeout, cancel);
        async move { self.wait_for(keys, waiting).await.map(|_| ()) }
    }

    /// True if every key exists right now.
    pub async fn check(&self, keys: &[&str]) -> Result<bool> {
        let read = self.read(keys, self.op_deadline()).await?;
        Ok(read.values.iter().all(Option::is_some))
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

    /// Waits for all keys, then returns their values in order, read at one revision.
    pub fn multi_get<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>>> + 'a {
        self.multi_get_with(keys, timeout, &CancelToken::new())
    }

    /// `multi_get`, which also ends (`Cancelled`) once `cancel` is cancelled.
    pub fn multi_get_with<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>>> + 'a {
        let waiting = self.waiting(timeout, cancel);
        self.wait_for(keys, waiting)
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
        if total > RDZV_MAX_VALUE_BYTES {
            return Err(Error::invalid(format!(
                "multi_set: {total} bytes in one call exceeds etcd's request limit of {RDZV_MAX_VALUE_BYTES} bytes"
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

    // The calls that do not wait, with a cancel token of the caller's: each returns
    // `Cancelled` once the token is cancelled (at once, without touching etcd, if it already
    // is), whatever etcd is doing. A write cancelled on its way may or may not have been
    // applied, as one that times out (an `add` so cancelled may have added).

    /// `set`, ended by `token`.
    pub async fn set_with(&self, key: &str, value: &[u8], token: &CancelToken) -> Result<()> {
        token.run("store set", self.set(key, value)).await
    }
    /// `add`, ended by `token`.
    pub async fn add_with(&self, key: &str, delta: i64, token: &CancelToken) -> Result<i64> {
        token.run("store add", self.add(key, delta)).await
    }
    /// `compare_set`, ended by `token`.
    pub async fn compare_set_with(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        token: &CancelToken,
    ) -> Result<Vec<u8>> {
        let call = self.compare_set(key, expected, desired);
        token.run("store compare_set", call).await
    }
    /// `check`, ended by `token`.
    pub async fn check_with(&self, keys: &[&str], token: &CancelToken) -> Result<bool> {
        token.run("store check", self.check(keys)).await
    }
    /// `delete_key`, ended by `token`.
    pub async fn delete_key_with(&self, key: &str, token: &CancelToken) -> Result<bool> {
        token.run("store delete_key", self.delete_key(key)).await
    }
    /// `num_keys`, ended by `token`.
    pub async fn num_keys_with(&self, token: &CancelToken) -> Result<i64> {
        token.run("store num_keys", self.num_keys()).await
    }
    /// `multi_set`, ended by `token` (with more than 128 keys, the transactions sent before
    /// the cancel stay applied).
    pub async fn multi_set_with(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        token: &CancelToken,
    ) -> Result<()> {
        token
            .run("store multi_set", self.multi_set(keys, values))
            .await
    }

    /// Reads keys in one snapshot (each value, None where absent) with the run's state.
    ///
    /// etcd refuses a transaction of more than 128 operations (`--max-txn-ops`), so a read of
    /// more keys is several transactions: the first reads the run's state and the first keys,
    /// the others read theirs at the first one's revision, so every value is of one snapshot.
    /// If etcd compacts its history past that revision in between (a shared etcd compacts on
    /// a schedule), the read starts again at a fresh one.
    async fn read(&self, keys: &[&str], deadline: Instant) -> Result<Read> {
        self.usable()?;
        let full = keys
            .iter()
            .map(|k| self.key(k))
            .collect::<Result<Vec<_>>>()?;
        loop {
            match self.read_snapshot(&full, deadline).await {
                Err(e) if crate::backend::is_compacted(&e) && Instant::now() < deadline => {
                    tracing::debug!(
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

    /// Read, then watch the store until every missing key appears. Ends early, with the
    /// matching error, when the keys can no longer appear for this caller: the run was closed
    /// with keys still missing, the round's (or run's) data was deleted, the node shut down, or
    /// `cancel`.
    async fn wait_for(&self, keys: &[&str], waiting: Waiting<'_>) -> Result<Vec<Vec<u8>>> {
        let started = Instant::now();
        let call = &waiting.call;
        let result = self
            .wait_for_keys(
                keys,
                waiting.deadline,
                waiting.timeout,
                call.token(),
                &waiting.token,
            )
            .await;
        call.ended(&result);
        let who = self.etcd.who();
        tracing::debug!(run = who.run.as_deref(), node = who.node.as_deref(), round = self.round,
            run_store = self.is_run_store(), keys = %keys.join(","), waited_ms = started.elapsed().as_millis() as u64,
            outcome = %result.as_ref().map_or_else(|e| e.to_string(), |_| "found".into()), "store wait ended");
        result
    }

    /// Shutdown, `cancel` and the token end the wait in whichever step it is (a read, a
    /// watch's set-up, the watch), so none of them waits for etcd.
    async fn wait_for_keys(
        &self,
        keys: &[&str],
        deadline: Instant,
        timeout: Option<Duration>,
        cancel: &CancelToken,
        token: &CancelToken,
    ) -> Result<Vec<Vec<u8>>> {
        let by_cancel = || {
            Error::new(
                ErrorKind::Cancelled,
                format!("{}: wait cancelled by rdzv_store_cancel", self.what()),
            )
        };
        let by_token = || cancelled_by_token(&format!("{}: wait", self.what()));
        if cancel.is_cancelled() {
            return Err(by_cancel());
        }
        if token.is_cancelled() {
            return Err(by_token());
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            found = self.watch_for_keys(keys, deadline, timeout) => found,
            _ = shutdown.wait_for(|down| *down) => Err(self.shut_down()),
            _ = cancel.cancelled() => Err(by_cancel()),
            _ = token.cancelled() => Err(by_token()),
        }
    }

    /// Read, then watch until every key exists, the run is closed, or `deadline`. A step that
    /// etcd does not answer ends by the deadline too: a read `READ_GRACE` after it (a read
    /// begun before the deadline may still find the keys), a watch's set-up at it.
    async fn watch_for_keys(
        &self,
        keys: &[&str],
        deadline: Instant,
        timeout: Option<Duration>,
    ) -> Result<Vec<Vec<u8>>> {
        let names = |missing: &HashSet<String>| -> Vec<&str> {
            keys.iter()
                .copied()
                .filter(|k| missing.contains(&format!("{}{k}", self.prefix)))
                .collect()
        };
        let timed_out = |missing: &HashSet<String>| {
            let waited = timeout.unwrap_or_else(|| self.timeout());
            Error::timeout(format!(
                "{}: key(s) {:?} not set within {:.1} s",
                self.what(),
                names(missing),
                waited.as_secs_f64()
            ))
        };
        let targets = [
            Target::Prefix(self.prefix.clone()),
            Target::Key(self.closed.clone()),
            Target::Key(self.anchor.clone()),
        ];
        let mut watch = None;
        loop {
            // Reads get a normal request deadline even when the wait's is zero.
            let read_by = self
                .op_deadline()
                .min(deadline.max(Instant::now() + READ_GRACE));
            let read = self.read(keys, read_by).await?;
            let mut missing = HashSet::new();
            for (k, v) in keys.iter().zip(&read.values) {
                if v.is_none() {
                    missing.insert(self.key(k)?);
                }
            }
            if missing.is_empty() {
                return Ok(read
                    .values
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect());
            }
            if read.closed {
                return Err(Error::closed(format!(
                    "{}: the run was closed while key(s) {:?} were still unset",
                    self.what(),
                    names(&missing)
                )));
            }
            if Instant::now() >= deadline {
                return Err(timed_out(&missing));
            }
            // Watch, then read again: a key set between the first read and the watch is seen.
            let Some(events) = watch.as_mut() else {
                let watch_by = self.op_deadline().min(deadline);
                watch = Some(match self.etcd.watch(&targets, watch_by).await {
                    Ok(opened) => opened,
                    // Not open by the wait's own deadline (a loaded machine, a slow etcd): the
                    // wait timed out, as it promises, rather than failing to connect.
                    Err(_) if Instant::now() >= deadline => return Err(timed_out(&missing)),
                    Err(e) => return Err(e),
                });
                let who = self.etcd.who();
                tracing::debug!(run = who.run.as_deref(), node = who.node.as_deref(), round = self.round,
                    run_store = self.is_run_store(), missing = %names(&missing).join(","), "store wait watching");
                continue;
            };
            let intact = loop {
                let batch = tokio::select! {
                    e = events.events() => e,
                    _ = tokio::time::sleep_until(deadline) => return Err(timed_out(&missing)),
                };
                let Some(batch) = batch else { break false };
                let mut reread = false;
                for ev in batch {
                    let Some(kv) = ev.kv() else { continue };
                    let key = String::from_utf8_lossy(kv.key());
                    match ev.event_type() {
                        EventType::Put if key == self.closed => reread = true,
                        // The run's `lease` rewritten: the run started over under another.
                        EventType::Put if key == self.anchor => reread = true,
                        EventType::Put => {
                            missing.remove(key.as_ref());
                        }
                        EventType::Delete if key == self.anchor => reread = true,
                        EventType::Delete => {}
                    }
                }
                // Re-read so every value comes from one revision (a key may have changed).
                if missing.is_empty() || reread {
                    break true;
                }
            };
            if !intact {
                watch = None; // broken (etcd restart, compaction): watch again, read again
            }
        }
    }
}

fn check_value(key: &str, value: &[u8]) -> Result<()> {
    if value.len() > RDZV_MAX_VALUE_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "value for key {key:?} is {} bytes; etcd accepts at most {RDZV_MAX_VALUE_BYTES} bytes per request",
                value.len()
            ),
        ));
    }
    Ok(())
}

fn parse_integer(key: &str, value: &[u8]) -> Result<i64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| Error::invalid(format!("add: the value at key {key:?} is not an integer")))
}
