//! How many members of this node's last round are gone or leaving, counted without reading the
//! member list. A member keeps its join key of the round it ran in, bound to its lease, until
//! it leaves (`join` drops only the key of a round that left it out), so round r's live
//! members are its `r/{r}/join/` keys: one count-only read, the same few bytes at any round
//! size. Members that are leaving are the `drain/` keys whose node still has such a key. Lost
//! = world size - live + draining. (Nodes a full round left out hold a key of it too, until
//! they join the next round a moment later: meanwhile they can only hide a loss, never invent
//! one.)
//!
//! Supervisors poll `num_lost`, `num_waiting` and `is_closed` several times a second on every
//! node; the tracker keeps all three current by one watch (on those two prefixes, the next
//! round's `join/` prefix and the `closed` key), so polling costs etcd nothing: a job at rest
//! costs etcd its lease refreshes alone. A broken watch falls back to reads (and says so in the
//! log) until it is back. A watch cannot tell a quiet etcd from one this node is cut off from,
//! so its answers are used only while etcd answers this node's lease refreshes
//! (`Rendezvous::watch_trusted`); a node cut off reads, and gets its error. The watch
//! ends at the first member seen leaving (a delete event; `num_lost` then counts by a read): the round must be formed again anyway, and a watch kept open on
//! every node while the others leave would make a job of N nodes that shuts down cost N²/2
//! events and reads; stopped at the first, it is about N. After that, `num_lost` reads etcd,
//! at most once per `REREAD_AFTER`.

use crate::backend::keys::Keys;
use crate::backend::{backoff, ranges, Etcd, Target};
use crate::error::Result;
use crate::rendezvous::records::JoinRecord;
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
    Watching(Seen),
    /// A member was lost and the watch ended: answers come from reads, reused briefly.
    Settled { read: Option<(Instant, u32)> },
}

/// What the watch shows besides losses: the next round's joiners and the `closed` marker.
#[derive(Default)]
struct Seen {
    /// The next round's join keys, each with whether its node was a member of this round (a
    /// re-rendezvous under way).
    joined: std::collections::HashMap<Vec<u8>, bool>,
    closed: bool,
}

/// The next round's joiners as `num_waiting` counts them.
pub(crate) struct Waiting {
    pub joined: usize,
    /// One of them was a member of this round: a re-rendezvous is under way.
    pub rejoining: bool,
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
            View::Watching(_) => Some(0),
            View::Settled {
                read: Some((at, n)),
            } if at.elapsed() < REREAD_AFTER => Some(n),
            _ => None,
        }
    }

    /// The next round's joiners, or `None` when they must be read from etcd.
    pub fn waiting(&self) -> Option<Waiting> {
        match &*self.view() {
            View::Watching(seen) => Some(Waiting {
                joined: seen.joined.len(),
                rejoining: seen.joined.values().any(|&member| member),
            }),
            _ => None,
        }
    }

    /// Whether the run is closed, or `None` when it must be read from etcd.
    pub fn closed(&self) -> Option<bool> {
        match &*self.view() {
            View::Watching(seen) => Some(seen.closed),
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

/// The next round's joiners and the `closed` marker, as the watch then keeps them.
async fn read_seen(
    etcd: &Etcd,
    keys: &Keys,
    sealed: &FinalRecord,
    deadline: Instant,
) -> Result<Seen> {
    let txn = Txn::new().and_then([
        TxnOp::get(
            keys.join_prefix(sealed.round + 1),
            Some(GetOptions::new().with_prefix()),
        ),
        TxnOp::get(keys.closed(), Some(GetOptions::new().with_count_only())),
    ]);
    let resp = etcd.txn(deadline, "num_waiting", txn).await?;
    let got = ranges(&resp);
    let mut seen = Seen::default();
    for kv in got.first().map(|g| g.kvs()).unwrap_or_default() {
        seen.joined
            .insert(kv.key().to_vec(), was_member(kv.key(), kv.value(), sealed));
    }
    seen.closed = got.get(1).is_some_and(|g| g.count() > 0);
    Ok(seen)
}

/// Whether the joiner of this key (the next round's) was a member of `sealed`. A record that
/// does not parse counts as a newcomer: `num_waiting`'s read reports it.
fn was_member(key: &[u8], value: &[u8], sealed: &FinalRecord) -> bool {
    JoinRecord::parse(key, value)
        .is_ok_and(|r| r.last.is_some_and(|(round, _)| round == sealed.round))
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
    // `lost` names the member whose departure was seen, when an event showed it. The view is
    // settled before the record is logged: a host that reads the record and then asks
    // `num_lost` must get the loss (logged first, it once got 0 from the watched view).
    let settle = |lost: Option<&str>| {
        set(View::Settled { read: None });
        let who = etcd.who();
        let (run, me, round) = (who.run.as_deref(), who.node.as_deref(), who.round);
        tracing::info!(
            run,
            node = me,
            round,
            lost,
            "member of the round lost (its lease expired, it left or it was drained)"
        );
    };
    let joins = keys.join_prefix(sealed.round);
    let drains = keys.drain_prefix();
    let next_joins = keys.join_prefix(sealed.round + 1);
    let closed = keys.closed();
    let mut attempt = 0u32;
    let mut broke = false;
    loop {
        let deadline = Instant::now() + Duration::from_secs(10);
        // Watch, then read: a change between the two is not missed.
        let targets = [
            Target::Prefix(joins.clone()),
            Target::Prefix(drains.clone()),
            Target::Prefix(next_joins.clone()),
            Target::Key(closed.clone()),
        ];
        // The same test as `leaving` below, for the stream's task to end the watch at once.
        let until: crate::backend::watch::Until = {
            let (joins, drains) = (joins.clone(), drains.clone());
            Arc::new(move |ev: &etcd_client::Event| {
                let Some(kv) = ev.kv() else { return false };
                let deleted = ev.event_type() == EventType::Delete;
                let drain = kv.key().starts_with(drains.as_bytes());
                (drain || kv.key().starts_with(joins.as_bytes())) && deleted != drain
            })
        };
        if let Ok(mut watch) = etcd.watch_until(&targets, until, deadline).await {
            let lost = read_lost(&etcd, &keys, &sealed, deadline).await;
            let seen = read_seen(&etcd, &keys, &sealed, deadline).await;
            if let (Ok(lost), Ok(mut seen)) = (lost, seen) {
                if lost > 0 {
                    let who = first_gone(&etcd, &keys, &sealed, deadline).await;
                    return settle(who.as_deref());
                }
                if broke {
                    let who = etcd.who();
                    tracing::info!(run = who.run.as_deref(), node = who.node.as_deref(), round = who.round,
                        "membership watch back: num_lost, num_waiting and is_closed answer from it again");
                }
                set(View::Watching(Seen {
                    joined: std::mem::take(&mut seen.joined),
                    closed: seen.closed,
                }));
                attempt = 0;
                while let Some(events) = watch.events().await {
                    {
                        let mut view = view.lock().unwrap_or_else(|e| e.into_inner());
                        if let View::Watching(seen) = &mut *view {
                            for ev in events.iter() {
                                let Some(kv) = ev.kv() else { continue };
                                let key = kv.key();
                                let put = ev.event_type() == EventType::Put;
                                if key.starts_with(next_joins.as_bytes()) {
                                    match put {
                                        true => seen.joined.insert(
                                            key.to_vec(),
                                            was_member(key, kv.value(), &sealed),
                                        ),
                                        false => seen.joined.remove(key),
                                    };
                                } else if key == closed.as_bytes() {
                                    seen.closed = put;
                                }
                            }
                        }
                    }
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
                        if !drain && !key.starts_with(joins.as_bytes()) {
                            return None;
                        }
                        (deleted != drain).then(|| Keys::node_of(key))?
                    });
                    if let Some(node) = leaving {
                        return settle(Some(node));
                    }
                }
                set(View::Syncing);
                broke = true;
                let who = etcd.who();
                tracing::info!(run = who.run.as_deref(), node = who.node.as_deref(), round = who.round,
                    "membership watch broke: num_lost, num_waiting and is_closed read etcd until it is back");
            }
        }
        backoff(&mut attempt, Instant::now() + Duration::from_secs(1)).await;
    }
}
