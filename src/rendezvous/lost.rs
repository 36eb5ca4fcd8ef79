//! How many members of this node's last round are gone or leaving, counted without reading the
//! member list. A member keeps its join key of the round it ran in, bound to its lease, until
//! it leaves (`join` drops only the key of a round that left it out), so round r's live
//! members are its `r/{r}/join/` keys: one count-only read, the same few bytes at any round
//! size. Members that are leaving are the `drain/` keys whose node still has such a key. Lost
//! = world size - live + draining. (Nodes a full round left out hold a key of it too, until
//! they join the next round a moment later: meanwhile they can only hide a loss, never invent
//! one.)
//!
//! Supervisors poll `num_lost` several times a second on every node; the tracker keeps the
//! count current by a watch on those two prefixes, so polling costs etcd nothing. The watch
//! ends at the first member seen leaving (a delete event; `num_lost` then counts by a read): the round must be formed again anyway, and a watch kept open on
//! every node while the others leave would make a job of N nodes that shuts down cost N²/2
//! events and reads; stopped at the first, it is about N. After that, `num_lost` reads etcd,
//! at most once per `REREAD_AFTER`.

use crate::backend::keys::Keys;
use crate::backend::{backoff, ranges, Etcd, Target};
use crate::error::Result;
use crate::rendezvous::FinalRecord;
use etcd_client::{EventType, GetOptions, Txn, TxnOp};
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
    pub fn start(etcd: Etcd, keys: Keys, sealed: FinalRecord) -> LostTracker {
        let view = Arc::new(Mutex::new(View::Syncing));
        let task = tokio::spawn(track(etcd, keys, sealed, view.clone()));
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

/// Members of `sealed` that are gone (their join key of the round went with their lease) or
/// leaving (drained while still there).
pub(crate) async fn read_lost(
    etcd: &Etcd,
    keys: &Keys,
    sealed: &FinalRecord,
    deadline: Instant,
) -> Result<u32> {
    let round = sealed.round;
    let txn = Txn::new().and_then([
        TxnOp::get(
            keys.join_prefix(round),
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
        TxnOp::get(
            keys.drain_prefix(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
    ]);
    let resp = etcd.txn(deadline, "num_lost", txn).await?;
    let got = ranges(&resp);
    let live = got.first().map_or(0, |g| g.count()).max(0) as u64;
    let draining: Vec<&str> = got
        .get(1)
        .map(|g| g.kvs())
        .unwrap_or_default()
        .iter()
        .filter_map(|kv| Keys::node_of(kv.key()))
        .collect();
    // Which of the draining nodes ran in this round: those that still hold its join key.
    // Drains are few (a scheduler's planned departures), so this read is rare and small.
    let mut drained = 0u64;
    for batch in draining.chunks(64) {
        let reads = batch.iter().map(|node| {
            TxnOp::get(
                keys.join(round, node),
                Some(GetOptions::new().with_count_only()),
            )
        });
        let resp = etcd
            .txn(
                deadline,
                "num_lost",
                Txn::new().and_then(reads.collect::<Vec<_>>()),
            )
            .await?;
        drained += ranges(&resp).iter().filter(|g| g.count() > 0).count() as u64;
    }
    let world = u64::from(sealed.world_size);
    Ok((world.saturating_sub(live) + drained).min(world) as u32)
}

/// A member of `sealed` whose join key is gone, for the log: read only when a loss is found on
/// (re)syncing, which is rare (usually the watch sees it go). O(round size), once.
async fn first_gone(
    etcd: &Etcd,
    keys: &Keys,
    sealed: &FinalRecord,
    deadline: Instant,
) -> Option<String> {
    let round = sealed.round;
    let txn = Txn::new().and_then([
        TxnOp::get(
            keys.lanes_prefix(round),
            Some(GetOptions::new().with_prefix()),
        ),
        TxnOp::get(
            keys.join_prefix(round),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
    ]);
    let resp = etcd.txn(deadline, "num_lost", txn).await.ok()?;
    let got = ranges(&resp);
    let chunks = got.first()?.kvs().iter().map(|kv| (kv.key(), kv.value()));
    let members = super::records::members_from_chunks(sealed, chunks).ok()?;
    let joined: std::collections::HashSet<&str> = got
        .get(1)?
        .kvs()
        .iter()
        .filter_map(|kv| Keys::node_of(kv.key()))
        .collect();
    members
        .iter()
        .find(|m| !joined.contains(m.as_str()))
        .cloned()
}

async fn track(etcd: Etcd, keys: Keys, sealed: FinalRecord, view: Arc<Mutex<View>>) {
    let set = |value: View| {
        *view.lock().unwrap_or_else(|e| e.into_inner()) = value;
    };
    // `lost` names the member whose departure was seen, when an event showed it.
    let settle = |lost: Option<&str>| {
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
    let joins = keys.join_prefix(sealed.round);
    let drains = keys.drain_prefix();
    let mut attempt = 0u32;
    loop {
        let deadline = Instant::now() + Duration::from_secs(10);
        // Watch, then read: a change between the two is not missed.
        let targets = [
            Target::Prefix(joins.clone()),
            Target::Prefix(drains.clone()),
        ];
        if let Ok(mut watch) = etcd.watch(&targets, deadline).await {
            if let Ok(lost) = read_lost(&etcd, &keys, &sealed, deadline).await {
                if lost > 0 {
                    let who = first_gone(&etcd, &keys, &sealed, deadline).await;
                    return settle(who.as_deref());
                }
                set(View::Watching);
                attempt = 0;
                while let Some(events) = watch.events().await {
                    // A join key of the round going, or a drain appearing, may be a member
                    // leaving: count again.
                    // A join key of the round going, or a drain appearing: a member leaving,
                    // or (rarely) a node the round left out moving on. The watch ends here
                    // either way, without a read (so a job of N that shuts down costs about N
                    // events, not more while reads are in flight); num_lost then counts.
                    let leaving = events.iter().find_map(|ev| {
                        let key = ev.kv()?.key();
                        let deleted = ev.event_type() == EventType::Delete;
                        let drain = key.starts_with(drains.as_bytes());
                        (deleted != drain).then(|| Keys::node_of(key))?
                    });
                    if let Some(node) = leaving {
                        return settle(Some(node));
                    }
                }
                set(View::Syncing);
            }
        }
        backoff(&mut attempt, Instant::now() + Duration::from_secs(1)).await;
    }
}
