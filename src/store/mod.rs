//! The key-value store handed out with each round, with the semantics of torch's c10d `Store`
//! (`set`, blocking `get`, atomic `add`, `compare_set`, `wait`, ...), kept in etcd under
//! `r/{round}/store/`. Scoping by round means a node of an old round can never write into a
//! newer round's store, and a round's data goes away two rounds later.

use crate::backend::{ranges, Etcd, Target, RDZV_MAX_VALUE_BYTES};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, EventType, GetOptions, Txn, TxnOp};
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Keys longer than this are refused: etcd keeps keys in memory and in every index.
pub const RDZV_MAX_KEY_BYTES: usize = 4096;

/// Longer waits are capped here, so "forever" (e.g. `i64::MAX` ms) cannot overflow a clock.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(Clone)]
pub struct Store {
    etcd: Etcd,
    prefix: String,
    timeout: std::sync::Arc<Mutex<Duration>>,
}

impl Store {
    pub(crate) fn new(etcd: Etcd, prefix: String, timeout: Duration) -> Store {
        Store {
            etcd,
            prefix,
            timeout: std::sync::Arc::new(Mutex::new(timeout)),
        }
    }

    /// The default timeout of `get`, `wait` and `multi_get` (c10d's `set_timeout`).
    pub fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout.min(MAX_WAIT);
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

    fn wait_deadline(&self, timeout: Option<Duration>) -> Instant {
        let timeout = timeout.unwrap_or_else(|| self.timeout()).min(MAX_WAIT);
        Instant::now() + timeout
    }

    pub async fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let full = self.key(key)?;
        check_value(key, value)?;
        let value = value.to_vec();
        // A plain put, not a one-operation transaction: etcd applies puts about twice as fast.
        self.etcd
            .call(self.op_deadline(), "store set", move |mut c| {
                let (full, value) = (full.clone(), value.clone());
                async move { c.put(full, value, None).await }
            })
            .await?;
        Ok(())
    }

    /// Waits up to `timeout` (or the store's default) for `key` to exist, then returns it.
    pub async fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        Ok(self
            .multi_get(&[key], timeout)
            .await?
            .pop()
            .unwrap_or_default())
    }

    /// Adds `delta` to the integer at `key` (absent counts as 0) and returns the new value.
    /// Optimistic: the transaction is guarded by the key's mod revision and, when another node
    /// got there first, its else branch returns the fresh value, so each retry is one round trip.
    pub async fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let full = self.key(key)?;
        let deadline = self.op_deadline();
        let (mut value, mut mod_rev) = (0i64, 0i64);
        let mut attempt = 0u32;
        loop {
            let new = value.checked_add(delta).ok_or_else(|| {
                Error::invalid(format!(
                    "add: {value} + {delta} overflows a 64-bit integer at key {key:?}"
                ))
            })?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    full.clone(),
                    CompareOp::Equal,
                    mod_rev,
                )])
                .and_then([TxnOp::put(full.clone(), new.to_string(), None)])
                .or_else([TxnOp::get(full.clone(), None)]);
            let resp = self.etcd.txn(deadline, "store add", txn).await?;
            if resp.succeeded() {
                return Ok(new);
            }
            match ranges(&resp)[0].kvs().first() {
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
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put(full.clone(), desired.to_vec(), None)])
            .or_else([TxnOp::get(full.clone(), None)]);
        let resp = self
            .etcd
            .txn(self.op_deadline(), "store compare_set", txn)
            .await?;
        if resp.succeeded() {
            return Ok(desired.to_vec());
        }
        Ok(match ranges(&resp)[0].kvs().first() {
            Some(kv) => kv.value().to_vec(),
            None => expected.to_vec(),
        })
    }

    /// Waits until every key exists.
    pub async fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        self.wait_for(keys, self.wait_deadline(timeout), timeout)
            .await
            .map(|_| ())
    }

    /// True if every key exists right now.
    pub async fn check(&self, keys: &[&str]) -> Result<bool> {
        let present = self.read(keys, self.op_deadline()).await?;
        Ok(present.iter().all(Option::is_some))
    }

    /// Deletes `key`; true if it existed.
    pub async fn delete_key(&self, key: &str) -> Result<bool> {
        let full = self.key(key)?;
        let resp = self
            .etcd
            .call(self.op_deadline(), "store delete_key", move |mut c| {
                let full = full.clone();
                async move { c.delete(full, None).await }
            })
            .await?;
        Ok(resp.deleted() > 0)
    }

    /// Number of keys in this round's store.
    pub async fn num_keys(&self) -> Result<i64> {
        let prefix = self.prefix.clone();
        let options = GetOptions::new().with_prefix().with_count_only();
        let resp = self
            .etcd
            .get(self.op_deadline(), "store num_keys", prefix, options)
            .await?;
        Ok(resp.count())
    }

    /// Waits for all keys, then returns their values in order, read at one revision.
    pub async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Option<Duration>,
    ) -> Result<Vec<Vec<u8>>> {
        self.wait_for(keys, self.wait_deadline(timeout), timeout)
            .await
    }

    /// Sets every key in one transaction: all or nothing.
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
            ops.push(TxnOp::put(self.key(key)?, value.to_vec(), None));
        }
        if total > RDZV_MAX_VALUE_BYTES {
            return Err(Error::invalid(format!(
                "multi_set: {total} bytes in one call exceeds etcd's request limit of {RDZV_MAX_VALUE_BYTES} bytes"
            )));
        }
        self.etcd
            .txn(self.op_deadline(), "store set", Txn::new().and_then(ops))
            .await?;
        Ok(())
    }

    /// Reads keys in one snapshot: each value, None where absent.
    async fn read(&self, keys: &[&str], deadline: Instant) -> Result<Vec<Option<Vec<u8>>>> {
        let ops = keys
            .iter()
            .map(|k| Ok(TxnOp::get(self.key(k)?, None)))
            .collect::<Result<Vec<_>>>()?;
        let resp = self
            .etcd
            .txn(deadline, "store get", Txn::new().and_then(ops))
            .await?;
        let values = ranges(&resp)
            .iter()
            .map(|g| g.kvs().first().map(|kv| kv.value().to_vec()))
            .collect();
        Ok(values)
    }

    /// Snapshot, then watch the store from just after it until every missing key appears.
    async fn wait_for(
        &self,
        keys: &[&str],
        deadline: Instant,
        timeout: Option<Duration>,
    ) -> Result<Vec<Vec<u8>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let timed_out = |missing: &HashSet<String>| {
            let waited = timeout.unwrap_or_else(|| self.timeout());
            let names: Vec<&str> = keys
                .iter()
                .copied()
                .filter(|k| missing.contains(&format!("{}{k}", self.prefix)))
                .collect();
            Error::timeout(format!(
                "store: key(s) {names:?} not set within {:.1} s",
                waited.as_secs_f64()
            ))
        };
        let missing_of = |values: &[Option<Vec<u8>>]| -> Result<HashSet<String>> {
            let mut missing = HashSet::new();
            for (k, v) in keys.iter().zip(values) {
                if v.is_none() {
                    missing.insert(self.key(k)?);
                }
            }
            Ok(missing)
        };
        loop {
            // Reads get a normal request deadline even when the wait's is zero.
            let values = self.read(keys, self.op_deadline()).await?;
            let missing = missing_of(&values)?;
            if missing.is_empty() {
                return Ok(values.into_iter().map(Option::unwrap_or_default).collect());
            }
            if Instant::now() >= deadline {
                return Err(timed_out(&missing));
            }
            // Watch, then read again: a key set between the first read and the watch is seen.
            let targets = [Target::Prefix(self.prefix.clone())];
            let mut watch = self.etcd.watch(&targets, self.op_deadline()).await?;
            let values = self.read(keys, self.op_deadline()).await?;
            let mut missing = missing_of(&values)?;
            if missing.is_empty() {
                return Ok(values.into_iter().map(Option::unwrap_or_default).collect());
            }
            loop {
                let events = tokio::select! {
                    e = watch.events() => e,
                    _ = tokio::time::sleep_until(deadline) => return Err(timed_out(&missing)),
                };
                let Some(events) = events else { break };
                for ev in events {
                    if ev.event_type() == EventType::Put {
                        if let Some(kv) = ev.kv() {
                            missing.remove(String::from_utf8_lossy(kv.key()).as_ref());
                        }
                    }
                }
                if missing.is_empty() {
                    // Re-read so every value comes from one revision (a key may have changed).
                    break;
                }
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
