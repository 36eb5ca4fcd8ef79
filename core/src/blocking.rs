//! The blocking facade the C ABI calls: one tokio runtime per process, `block_on` for each
//! call. A process that forks gets a fresh runtime in the child (the parent's worker threads
//! do not exist there); handles made before the fork refuse to work in the child.

use crate::admin::{Admin, Purge, RunStatus, StatusWatch};
use crate::cancel::{CancelToken, HandleCancel};
use crate::error::{Error, ErrorKind, Result};
use crate::params::Params;
use crate::rendezvous::{Rendezvous, RoundInfo};
use crate::store::Store;
use once_cell::sync::Lazy;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Runtime;

/// The process's runtime, tagged with the pid that created it.
type PerProcessRuntime = Option<(u32, Arc<Runtime>)>;
static RUNTIME: Lazy<Mutex<PerProcessRuntime>> = Lazy::new(|| Mutex::new(None));

/// The runtime of this process, created on first use (and again after a fork).
fn runtime() -> Result<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.clone());
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rdzv")
        .on_thread_start(block_sigpipe)
        .enable_all()
        .build()
        .map_err(|e| Error::internal(format!("cannot start the I/O runtime: {e}")))?;
    // The parent's runtime cannot be dropped in a forked child (its threads are gone): leak it.
    if let Some(old) = slot.replace((pid, Arc::new(rt))) {
        std::mem::forget(old);
    }
    Ok(slot.as_ref().map(|(_, rt)| rt.clone()).expect("just set"))
}

/// Blocks SIGPIPE on the runtime's threads. A write to a connection etcd dropped (a vectored
/// write, which cannot ask for MSG_NOSIGNAL) raises SIGPIPE on the writing thread; a host
/// process that does not ignore it (a C program by default, a Go program for any thread Go
/// did not create) would die of it, instead of the write failing with EPIPE and the call
/// reporting a connection error. Blocked, the signal stays pending on the thread and is
/// never delivered. Threads of the host process are left alone.
fn block_sigpipe() {
    // SAFETY: plain libc calls on a local set; pthread_sigmask changes this thread's mask only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Something bound to the process and runtime that created it.
struct Owned {
    pid: u32,
    rt: Arc<Runtime>,
}

impl Owned {
    fn new() -> Result<Owned> {
        Ok(Owned {
            pid: std::process::id(),
            rt: runtime()?,
        })
    }

    fn run<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        if self.pid != std::process::id() {
            return Err(Error::invalid(
                "handle: created in a parent process before fork(); create a new handle in the child",
            ));
        }
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            // A plain thread: the usual case.
            Err(_) => self.rt.block_on(fut),
            // A thread already driving async code: a log handler or a finalizer that calls
            // rdzv while a record is delivered, on a runtime worker or inside another call's
            // block_on. block_in_place hands this thread's other work to a new worker first,
            // so blocking here stalls nothing and block_on is allowed.
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| self.rt.block_on(fut)),
            Ok(_) => Err(Error::invalid(
                "blocking call made from inside a single-threaded async runtime, which it \
                 would stall: use the async API (rdzv::Rendezvous) there",
            )),
        }
    }

    /// True when dropping the runtime here would be unsafe (a forked child).
    fn foreign(&self) -> bool {
        self.pid != std::process::id()
    }
}

/// A blocking rendezvous handle: `Rendezvous` for callers without an async runtime.
///
/// ```no_run
/// # fn node() -> rdzv::Result<()> {
/// use rdzv::{BlockingRendezvous, CancelToken, Params};
///
/// let params = Params::from_url("etcd://127.0.0.1:2379/job-42?min_nodes=2")?;
/// let node = std::sync::Arc::new(BlockingRendezvous::new(params)?);
/// // Another thread may end the join: node.cancel(), or a token of the call's own.
/// let stop = CancelToken::new();
/// let (round, _store) = node.next_with(&stop)?;
/// println!("rank {} of {}", round.rank, round.world_size);
/// # Ok(())
/// # }
/// ```
pub struct BlockingRendezvous {
    owned: Owned,
    inner: Arc<Rendezvous>,
}

impl BlockingRendezvous {
    pub fn new(params: Params) -> Result<BlockingRendezvous> {
        let owned = Owned::new()?;
        let inner = owned.run(Rendezvous::new(params))?;
        Ok(BlockingRendezvous {
            owned,
            inner: Arc::new(inner),
        })
    }

    pub fn next(&self) -> Result<(RoundInfo, BlockingStore)> {
        self.next_with(&CancelToken::new())
    }
    /// `next`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it is.
    pub fn next_with(&self, cancel: &CancelToken) -> Result<(RoundInfo, BlockingStore)> {
        let (info, store) = self.owned.run(self.inner.next_with(cancel))?;
        Ok((
            info,
            BlockingStore {
                owned: Owned::new()?,
                inner: store,
            },
        ))
    }
    /// The run's store, which lives as long as the run, across rounds
    /// (`Rendezvous::run_store`).
    pub fn run_store(&self) -> Result<BlockingStore> {
        self.run_store_with(&CancelToken::new())
    }
    /// `run_store`, ended by `cancel`.
    pub fn run_store_with(&self, cancel: &CancelToken) -> Result<BlockingStore> {
        let store = self
            .owned
            .run(cancel.run("run_store", self.inner.run_store()))?;
        Ok(BlockingStore {
            owned: Owned::new()?,
            inner: store,
        })
    }
    pub fn is_closed(&self) -> Result<bool> {
        self.owned.run(self.inner.is_closed())
    }
    /// `is_closed`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it is.
    pub fn is_closed_with(&self, cancel: &CancelToken) -> Result<bool> {
        self.owned
            .run(cancel.run("is_closed", self.inner.is_closed()))
    }
    pub fn set_closed(&self) -> Result<()> {
        self.owned.run(self.inner.set_closed())
    }
    /// `set_closed`, ended by `cancel` (a close on its way may still be applied).
    pub fn set_closed_with(&self, cancel: &CancelToken) -> Result<()> {
        self.owned
            .run(cancel.run("set_closed", self.inner.set_closed()))
    }
    pub fn num_waiting(&self) -> Result<u32> {
        self.owned.run(self.inner.num_waiting())
    }
    /// `num_waiting`, ended by `cancel`.
    pub fn num_waiting_with(&self, cancel: &CancelToken) -> Result<u32> {
        self.owned
            .run(cancel.run("num_waiting", self.inner.num_waiting()))
    }
    pub fn num_lost(&self) -> Result<u32> {
        self.owned.run(self.inner.num_lost())
    }
    /// `num_lost`, ended by `cancel`.
    pub fn num_lost_with(&self, cancel: &CancelToken) -> Result<u32> {
        self.owned
            .run(cancel.run("num_lost", self.inner.num_lost()))
    }
    /// The members of this node's last round in rank order (read once, on first use).
    pub fn members(&self) -> Result<Arc<[String]>> {
        self.owned.run(self.inner.members())
    }
    /// `members`, ended by `cancel`.
    pub fn members_with(&self, cancel: &CancelToken) -> Result<Arc<[String]>> {
        self.owned.run(cancel.run("members", self.inner.members()))
    }
    pub fn drain(&self, reason: &str) -> Result<()> {
        self.owned.run(self.inner.drain(reason))
    }
    /// `drain`, ended by `cancel` (a mark on its way may still be written).
    pub fn drain_with(&self, reason: &str, cancel: &CancelToken) -> Result<()> {
        self.owned
            .run(cancel.run("drain", self.inner.drain(reason)))
    }
    pub fn is_draining(&self) -> Result<bool> {
        self.owned.run(self.inner.is_draining())
    }
    /// `is_draining`, ended by `cancel`.
    pub fn is_draining_with(&self, cancel: &CancelToken) -> Result<bool> {
        self.owned
            .run(cancel.run("is_draining", self.inner.is_draining()))
    }
    /// Ends the `next` running on this handle or, if none is, the next one to start
    /// (`Rendezvous::cancel`). Never lost; the handle stays usable.
    pub fn cancel(&self) {
        self.inner.cancel()
    }
    pub fn shutdown(&self) -> Result<()> {
        self.owned.run(self.inner.shutdown())
    }
    pub fn params(&self) -> &Params {
        self.inner.params()
    }
    pub fn node_id(&self) -> &str {
        self.inner.node_id()
    }
}

impl Drop for BlockingRendezvous {
    fn drop(&mut self) {
        if self.owned.foreign() {
            // Leak: the parent's runtime and tasks must not be torn down in a child.
            std::mem::forget(self.owned.rt.clone());
            std::mem::forget(self.inner.clone());
            return;
        }
        let _ = self.shutdown();
    }
}

/// A blocking operator handle on one run: never joins it. One `watch_next` runs at a time;
/// `cancel` wakes it from another thread.
pub struct BlockingAdmin {
    owned: Owned,
    inner: Admin,
    watch: tokio::sync::Mutex<StatusWatch>,
    /// What `cancel` reaches: the `watch_next` in progress, or else the next one to start.
    cancel: HandleCancel,
}

impl BlockingAdmin {
    pub fn new(params: Params) -> Result<BlockingAdmin> {
        let owned = Owned::new()?;
        let inner = owned.run(Admin::connect(params))?;
        Ok(BlockingAdmin {
            watch: tokio::sync::Mutex::new(inner.watch()),
            owned,
            inner,
            cancel: HandleCancel::default(),
        })
    }
    pub fn status(&self) -> Result<RunStatus> {
        self.owned.run(self.inner.status())
    }
    /// `status`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it is.
    pub fn status_with(&self, cancel: &CancelToken) -> Result<RunStatus> {
        self.owned.run(cancel.run("status", self.inner.status()))
    }
    /// The current status on the first call, then each change, in order (see
    /// `StatusWatch::next`). `Timeout` when nothing changed within `timeout`; the watch stays
    /// open and the next call goes on from where this one stopped.
    pub fn watch_next(&self, timeout: Duration) -> Result<RunStatus> {
        self.watch_next_with(timeout, &CancelToken::new())
    }
    /// `watch_next`, which also ends (`Cancelled`) once `token` is cancelled, at once if it is.
    pub fn watch_next_with(&self, timeout: Duration, token: &CancelToken) -> Result<RunStatus> {
        // Entered before anything else, so a cancel made once the call is entered is seen.
        let call = self.cancel.enter();
        let by_cancel = || {
            Error::new(
                ErrorKind::Cancelled,
                "watch: cancelled by rdzv_admin_cancel",
            )
        };
        let result = if call.token().is_cancelled() {
            Err(by_cancel())
        } else if token.is_cancelled() {
            Err(crate::cancel::cancelled_by_token("watch"))
        } else {
            self.owned.run(async {
                let mut watch = self.watch.try_lock().map_err(|_| {
                    Error::invalid("watch: another watch call is already running on this handle")
                })?;
                tokio::select! {
                    status = watch.next() => status,
                    _ = tokio::time::sleep(timeout) => Err(Error::timeout(format!(
                        "watch: no change within {} ms",
                        timeout.as_millis()
                    ))),
                    _ = call.token().cancelled() => Err(by_cancel()),
                    _ = token.cancelled() => Err(crate::cancel::cancelled_by_token("watch")),
                }
            })
        };
        call.ended(&result);
        result
    }
    /// Ends the `watch_next` running on this handle (it returns `Cancelled`) or, if none is,
    /// the next one to start: never lost (see `Rendezvous::cancel`); the handle stays usable.
    /// Never blocks.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }
    pub fn close(&self) -> Result<()> {
        self.owned.run(self.inner.close())
    }
    /// `close`, ended by `cancel` (a close on its way may still be applied).
    pub fn close_with(&self, cancel: &CancelToken) -> Result<()> {
        self.owned.run(cancel.run("close", self.inner.close()))
    }
    pub fn purge(&self, force: bool) -> Result<Purge> {
        self.owned.run(self.inner.purge(force))
    }
    /// `purge`, ended by `cancel` (a purge on its way may still be applied).
    pub fn purge_with(&self, force: bool, cancel: &CancelToken) -> Result<Purge> {
        self.owned.run(cancel.run("purge", self.inner.purge(force)))
    }
    pub fn drain(&self, node: &str, reason: &str) -> Result<()> {
        self.owned.run(self.inner.drain(node, reason))
    }
    /// `drain`, ended by `cancel` (a mark on its way may still be written).
    pub fn drain_with(&self, node: &str, reason: &str, cancel: &CancelToken) -> Result<()> {
        self.owned
            .run(cancel.run("drain", self.inner.drain(node, reason)))
    }
    pub fn params(&self) -> &Params {
        self.inner.params()
    }
}

impl Drop for BlockingAdmin {
    fn drop(&mut self) {
        if self.owned.foreign() {
            // Leak: the parent's runtime and connection must not be torn down in a child.
            std::mem::forget(self.owned.rt.clone());
            std::mem::forget(self.inner.clone());
        }
    }
}

/// A blocking handle on one round's store, or on the run's (`BlockingRendezvous::run_store`).
pub struct BlockingStore {
    owned: Owned,
    inner: Store,
}

impl BlockingStore {
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.owned.run(self.inner.set(key, value))
    }
    /// `set`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it is (a
    /// write on its way may still be applied).
    pub fn set_with(&self, key: &str, value: &[u8], cancel: &CancelToken) -> Result<()> {
        self.owned
            .run(cancel.run("store set", self.inner.set(key, value)))
    }
    pub fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        self.owned.run(self.inner.get(key, timeout))
    }
    /// `get`, which also ends (`Cancelled`) once `cancel` is cancelled, at once if it is.
    pub fn get_with(
        &self,
        key: &str,
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> Result<Vec<u8>> {
        self.owned.run(self.inner.get_with(key, timeout, cancel))
    }
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.owned.run(self.inner.add(key, delta))
    }
    /// `add`, ended by `cancel` (an add on its way may still be applied).
    pub fn add_with(&self, key: &str, delta: i64, cancel: &CancelToken) -> Result<i64> {
        self.owned
            .run(cancel.run("store add", self.inner.add(key, delta)))
    }
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.owned
            .run(self.inner.compare_set(key, expected, desired))
    }
    /// `compare_set`, ended by `cancel` (a write on its way may still be applied).
    pub fn compare_set_with(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        cancel: &CancelToken,
    ) -> Result<Vec<u8>> {
        self.owned.run(cancel.run(
            "store compare_set",
            self.inner.compare_set(key, expected, desired),
        ))
    }
    pub fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        self.owned.run(self.inner.wait(keys, timeout))
    }
    pub fn wait_with(
        &self,
        keys: &[&str],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> Result<()> {
        self.owned.run(self.inner.wait_with(keys, timeout, cancel))
    }
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        self.owned.run(self.inner.check(keys))
    }
    /// `check`, ended by `cancel`.
    pub fn check_with(&self, keys: &[&str], cancel: &CancelToken) -> Result<bool> {
        self.owned
            .run(cancel.run("store check", self.inner.check(keys)))
    }
    pub fn delete_key(&self, key: &str) -> Result<bool> {
        self.owned.run(self.inner.delete_key(key))
    }
    /// `delete_key`, ended by `cancel` (a delete on its way may still be applied).
    pub fn delete_key_with(&self, key: &str, cancel: &CancelToken) -> Result<bool> {
        self.owned
            .run(cancel.run("store delete_key", self.inner.delete_key(key)))
    }
    pub fn num_keys(&self) -> Result<i64> {
        self.owned.run(self.inner.num_keys())
    }
    /// `num_keys`, ended by `cancel`.
    pub fn num_keys_with(&self, cancel: &CancelToken) -> Result<i64> {
        self.owned
            .run(cancel.run("store num_keys", self.inner.num_keys()))
    }
    pub fn multi_get(&self, keys: &[&str], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>> {
        self.owned.run(self.inner.multi_get(keys, timeout))
    }
    pub fn multi_get_with(
        &self,
        keys: &[&str],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> Result<Vec<Vec<u8>>> {
        self.owned
            .run(self.inner.multi_get_with(keys, timeout, cancel))
    }
    pub fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        self.owned.run(self.inner.multi_set(keys, values))
    }
    /// `multi_set`, ended by `cancel` (writes on their way may still be applied).
    pub fn multi_set_with(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        cancel: &CancelToken,
    ) -> Result<()> {
        self.owned
            .run(cancel.run("store multi_set", self.inner.multi_set(keys, values)))
    }
    pub fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    pub fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
    /// Ends the waits running on this store in other threads (`Cancelled`) or, if none is, the
    /// next one to start (`Store::cancel`). Never lost; the store stays usable.
    pub fn cancel(&self) {
        self.inner.cancel()
    }
    /// The store's round; `u64::MAX` for the run's store.
    pub fn round(&self) -> u64 {
        self.inner.round()
    }
    /// True for the run's store.
    pub fn is_run_store(&self) -> bool {
        self.inner.is_run_store()
    }
}

impl Drop for BlockingStore {
    fn drop(&mut self) {
        if self.owned.foreign() {
            std::mem::forget(self.owned.rt.clone());
            std::mem::forget(self.inner.clone());
        }
    }
}
