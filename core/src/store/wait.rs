//! Waiting for keys (`get`, `wait`, `multi_get`): read, then watch until every key is set,
//! the run is closed, the store is gone, or the wait's deadline passes. Shutdown, the store's
//! `cancel` and the caller's token end a wait in whichever step it is, so no wait outlasts its
//! reason because etcd does not answer.

use super::{Store, LOG_TARGET, MAX_WAIT};
use crate::backend::Target;
use crate::cancel::{cancelled_by_token, CancelToken, HandleCall};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::EventType;
use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How long past its deadline a wait may still be reading: a wait with timeout 0 still reads
/// once (a key that exists is returned), and a read begun just before the deadline may finish.
/// An etcd that does not answer ends the wait this long after its deadline.
const READ_GRACE: Duration = Duration::from_secs(1);

/// A store wait as it was called: see `Store::waiting`.
struct Waiting<'a> {
    deadline: Instant,
    /// As the caller gave it (None: the store's default), for the timeout's message.
    timeout: Option<Duration>,
    /// Its hold on the store's own cancel.
    call: HandleCall<'a>,
    token: CancelToken,
}

impl Store {
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

    /// Waits up to `timeout` (or the store's default) for `key` to exist, then returns it.
    pub fn get<'a>(
        &'a self,
        key: &'a str,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Vec<u8>>> + 'a {
        self.get_with(key, timeout, &CancelToken::new())
    }

    /// `get`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it already is.
    pub(crate) fn get_with<'a>(
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

    /// Waits until every key exists.
    pub fn wait<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<()>> + 'a {
        self.wait_with(keys, timeout, &CancelToken::new())
    }

    /// `wait`, which also ends (`Cancelled`) once `cancel` is cancelled.
    pub(crate) fn wait_with<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> impl Future<Output = Result<()>> + 'a {
        let waiting = self.waiting(timeout, cancel);
        async move { self.wait_for(keys, waiting).await.map(|_| ()) }
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
    pub(crate) fn multi_get_with<'a>(
        &'a self,
        keys: &'a [&'a str],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>>> + 'a {
        let waiting = self.waiting(timeout, cancel);
        self.wait_for(keys, waiting)
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
        tracing::debug!(target: LOG_TARGET, run = who.run.as_deref(), node = who.node.as_deref(), round = self.round,
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
                tracing::debug!(target: LOG_TARGET, run = who.run.as_deref(), node = who.node.as_deref(), round = self.round,
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
