//! Which members of this node's last round are gone or leaving, kept current by a watch on
//! the run's `alive/` and `drain/` keys. Supervisors poll `num_lost` several times a second on every node; answered
//! from memory, that costs etcd nothing instead of a read of every live node's key per poll.
//!
//! The watch ends at the first member lost. A loss means the round must be formed again
//! anyway, and a watch kept open on every node while the others leave would make a job of N
//! nodes that shuts down receive N²/2 events; stopped at the first, it is about N in all.
//! After that, `num_lost` reads etcd, at most once per `REREAD_AFTER`.

use crate::backend::keys::Keys;
use crate::backend::{backoff, ranges, Etcd, Target};
use crate::error::Result;
use etcd_client::{EventType, GetOptions, Txn, TxnOp};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a count read from etcd (after the watch ended) is reused.
const REREAD_AFTER: Duration = Duration::from_secs(1);

enum View {
    /// Starting, or the watch broke: the answer must be read from etcd.
    Syncing,
    /// In sync with etcd, no member lost yet.
    Watching,
    /// A member was lost and the watch ended: answers come from reads, reused briefly.
    Settled { read: Option<(Instant, u32)> },
}

pub(crate) struct LostTracker {
    view: Arc<Mutex<View>>,
    task: JoinHandle<()>,
}

impl LostTracker {
    /// Starts tracking `members` (must be called inside the runtime).
    pub fn start(etcd: Etcd, keys: Keys, members: Arc<[String]>) -> LostTracker {
        let view = Arc::new(Mutex::new(View::Syncing));
        let task = tokio::spawn(track(etcd, keys, members, view.clone()));
        LostTracker { view, task }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many members are gone, or `None` when the answer must be read from etcd.
    pub fn count(&self) -> Option<u32> {
        match *self.view() {
            View::Watching => Some(0),
            View::Settled {
                read: Some((at, n)),
            } if at.elapsed() < REREAD_AFTER => Some(n),
            _ => None,
        }
    }

    /// Keeps a count read from etcd, if the watch has ended (a read while syncing is not kept:
    /// the watch will answer soon).
    pub fn read(&self, n: u32) {
        if let View::Settled { read } = &mut *self.view() {
            *read = Some((Instant::now(), n));
        }
    }
}

impl Drop for LostTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The run's live nodes that are not leaving: `alive/` keys without a `drain/` key, read at one
/// revision.
pub(crate) async fn read_live(
    etcd: &Etcd,
    keys: &Keys,
    deadline: Instant,
    what: &str,
) -> Result<HashSet<String>> {
    let names = || Some(GetOptions::new().with_prefix().with_keys_only());
    let txn = Txn::new().and_then([
        TxnOp::get(keys.alive_prefix(), names()),
        TxnOp::get(keys.drain_prefix(), names()),
    ]);
    let resp = etcd.txn(deadline, what, txn).await?;
    let got = ranges(&resp);
    let node_ids = |i: usize| {
        got.get(i)
            .map(|g| g.kvs())
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| Keys::node_of(kv.key()).map(str::to_string))
    };
    let draining: HashSet<String> = node_ids(1).collect();
    Ok(node_ids(0).filter(|n| !draining.contains(n)).collect())
}

async fn track(etcd: Etcd, keys: Keys, members: Arc<[String]>, view: Arc<Mutex<View>>) {
    let members: HashSet<&str> = members.iter().map(String::as_str).collect();
    let set = |value: View| {
        *view.lock().unwrap_or_else(|e| e.into_inner()) = value;
    };
    let settle = |lost: &str| {
        let who = etcd.who();
        let (run, me, round) = (who.run.as_deref(), who.node.as_deref(), who.round);
        tracing::info!(
            run,
            node = me,
            round,
            lost,
            "member of the round lost (its lease expired, it left or it was drained)"
        );
        set(View::Settled { read: None });
    };
    let mut attempt = 0u32;
    loop {
        let deadline = Instant::now() + Duration::from_secs(10);
        // Watch, then read: a change between the two is not missed.
        let targets = [
            Target::Prefix(keys.alive_prefix()),
            Target::Prefix(keys.drain_prefix()),
        ];
        let drain_prefix = keys.drain_prefix();
        if let Ok(mut watch) = etcd.watch(&targets, deadline).await {
            if let Ok(live) = read_live(&etcd, &keys, deadline, "track alive").await {
                if let Some(gone) = members.iter().find(|m| !live.contains(**m)) {
                    return settle(gone);
                }
                set(View::Watching);
                attempt = 0;
                while let Some(events) = watch.events().await {
                    // A member is lost when its alive key goes, or leaving when a drain key
                    // of it appears.
                    let lost = events.iter().find_map(|ev| {
                        let key = ev.kv()?.key();
                        let node = Keys::node_of(key)?;
                        let drained = key.starts_with(drain_prefix.as_bytes());
                        let gone = (ev.event_type() == EventType::Delete) != drained;
                        (gone && members.contains(node)).then_some(node)
                    });
                    if let Some(node) = lost {
                        return settle(node);
                    }
                }
                set(View::Syncing);
            }
        }
        backoff(&mut attempt, Instant::now() + Duration::from_secs(1)).await;
    }
}
