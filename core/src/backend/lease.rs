//! An etcd lease and its refreshes. All of a node's keys (its `alive` key and its join
//! requests) are bound to the node's own lease, so when the node dies or is cut off for longer
//! than the TTL, etcd deletes them and the other nodes see it by watch. The keys of the run
//! that no node owns (`current`, the rounds' seals and stores) are bound to the run's lease,
//! which every live node refreshes beside its own: they expire once no node is left.
//!
//! A connection refreshes the leases its process holds over shared `LeaseKeepAlive` streams,
//! as etcd's own clients do: a stream per lease cost each handle the buffers of a gRPC stream
//! (about 20 KiB), and a lease held by many handles of one process (the run's) is refreshed
//! once, not once per handle. A stream carries at most `PER_STREAM` leases: etcd answers a
//! stream's refreshes one after another, each a round trip to the raft leader when the stream
//! ends at a follower, so one stream for 900 leases (a process of 800 nodes) fell behind what
//! their TTLs need once etcd slowed (`scripts/soak.sh`: leases expired by the thousand).

use super::{backoff_delay, hand_over, sleep_until_some, Etcd};
use crate::error::Result;
use etcd_client::proto::PbLeaseKeepAliveRequest;
use etcd_client::{LeaseKeepAliveResponse, LeaseKeepAliveStream, LeaseKeeper};
use once_cell::sync::Lazy;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::Permit;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::error::Elapsed;
use tokio::time::Instant;

pub struct Lease {
    pub id: i64,
    kept: Kept,
    shard: Shard,
}

/// The process's clock for `Refreshed`.
static EPOCH: Lazy<std::time::Instant> = Lazy::new(std::time::Instant::now);

/// When etcd last answered a refresh of a lease (or granted it): shared with whoever needs to
/// know whether this node still reaches etcd without asking it (a watch alone cannot tell a
/// quiet etcd from one cut off).
#[derive(Clone)]
pub struct Refreshed(Arc<AtomicU64>);

impl Refreshed {
    fn new() -> Refreshed {
        let r = Refreshed(Arc::new(AtomicU64::new(0)));
        r.now();
        r
    }

    fn now(&self) {
        self.0
            .store(EPOCH.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether etcd answered within `within`.
    pub fn within(&self, within: Duration) -> bool {
        let at = Duration::from_millis(self.0.load(Ordering::Relaxed));
        EPOCH.elapsed().saturating_sub(at) <= within
    }
}

impl Lease {
    /// Grants a lease of `ttl` and starts refreshing it every third of the TTL.
    pub async fn grant(etcd: &Etcd, ttl: Duration, deadline: Instant) -> Result<Lease> {
        let id = Self::grant_id(etcd, ttl, deadline).await?;
        Ok(Self::adopt(etcd, id, ttl))
    }

    /// Grants a lease of `ttl` that nobody refreshes yet.
    pub async fn grant_id(etcd: &Etcd, ttl: Duration, deadline: Instant) -> Result<i64> {
        let secs = ttl.as_secs().max(1) as i64;
        let granted = etcd
            .call(deadline, "lease grant", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        Ok(granted.id())
    }

    /// Starts refreshing a lease that exists already (granted by this node or another), every
    /// third of `ttl` or of the lease's own TTL, whichever is shorter: a lease granted by a
    /// node with a shorter `lease_ttl` must not expire between two refreshes.
    pub fn adopt(etcd: &Etcd, id: i64, ttl: Duration) -> Lease {
        let (shard, kept) = etcd.keep_alives().hold(etcd, id, ttl);
        Lease { id, kept, shard }
    }

    /// When etcd last answered a refresh of this lease.
    pub fn refreshed(&self) -> Refreshed {
        self.kept.refreshed.clone()
    }

    /// True once etcd has said the lease no longer exists.
    pub fn is_lost(&self) -> bool {
        *self.kept.lost.borrow()
    }

    /// Turns true once etcd has said the lease no longer exists (its keys are gone with it).
    pub fn lost(&self) -> watch::Receiver<bool> {
        self.kept.lost.subscribe()
    }

    /// Records that etcd no longer knows this lease (a request using it was refused).
    pub fn mark_lost(&self) {
        self.kept.lost.send_replace(true);
    }

    /// Stops refreshing and deletes the lease (and with it every key bound to it).
    pub async fn revoke(self, etcd: &Etcd, deadline: Instant) -> Result<()> {
        let id = self.id;
        drop(self);
        revoke(etcd, id, deadline).await
    }
}

/// Deletes a lease by id (and every key bound to it); one that is gone already is no error.
pub async fn revoke(etcd: &Etcd, id: i64, deadline: Instant) -> Result<()> {
    let revoked = etcd
        .call(deadline, "lease revoke", |mut c| async move {
            c.lease_revoke(id).await
        })
        .await;
    match revoked {
        Err(e) if e.kind() == crate::error::ErrorKind::LeaseLost => Ok(()),
        other => other.map(|_| ()),
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shard.release(self.id);
    }
}

/// What a holder of a lease sees of its refreshes; shared by every holder of the same id.
#[derive(Clone)]
struct Kept {
    lost: Arc<watch::Sender<bool>>,
    refreshed: Refreshed,
}

/// How many leases one refresh stream carries at most. A lease needs three refreshes per TTL;
/// 32 leases of a 1 s TTL are 96 a second, a fraction of what one stream carries even through a
/// follower under load (about 400 a second measured so), and a process of 4096 nodes holds
/// 129 streams (about 0.6 KiB per node).
const PER_STREAM: usize = 32;

/// The leases one connection refreshes, in shards of at most `PER_STREAM`, each refreshed by
/// a task of its own over a stream of its own.
#[derive(Clone, Default)]
pub struct KeepAlives(Arc<Mutex<Vec<Shard>>>);

impl KeepAlives {
    /// Refreshes lease `id` in the shard that refreshes it already (the run's lease, held by
    /// every handle of the process), else in the first with room, else in a new one.
    fn hold(&self, etcd: &Etcd, id: i64, ttl: Duration) -> (Shard, Kept) {
        let mut shards = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let counts: Vec<(bool, usize)> = shards
            .iter()
            .map(|shard| {
                let state = shard.lock();
                (state.leases.contains_key(&id), state.leases.len())
            })
            .collect();
        let at = match counts.iter().position(|(holds, _)| *holds) {
            Some(i) => i,
            None => match counts.iter().position(|(_, n)| *n < PER_STREAM) {
                Some(i) => i,
                None => {
                    shards.push(Shard::default());
                    shards.len() - 1
                }
            },
        };
        // Under the list's lock: two handles adopting the run's lease at once pick one shard.
        let shard = shards[at].clone();
        let kept = shard.hold(etcd, id, ttl);
        (shard, kept)
    }
}

/// Some of a connection's leases, and the task that refreshes them over one stream.
#[derive(Clone, Default)]
struct Shard(Arc<Shared>);

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the task when a lease is added or released.
    changed: Notify,
}

#[derive(Default)]
struct State {
    leases: HashMap<i64, Entry>,
    /// Whether the refresh task runs; it ends once no lease is held.
    running: bool,
}

struct Entry {
    kept: Kept,
    /// A third of the shortest TTL anyone asked for, or of the TTL etcd reports.
    period: Duration,
    due: Instant,
    holders: usize,
}

impl Shard {
    fn hold(&self, etcd: &Etcd, id: i64, ttl: Duration) -> Kept {
        let period = ttl / 3;
        let mut state = self.lock();
        let entry = state.leases.entry(id).or_insert_with(|| Entry {
            kept: Kept {
                lost: Arc::new(watch::Sender::new(false)),
                refreshed: Refreshed::new(),
            },
            period,
            due: Instant::now() + period,
            holders: 0,
        });
        entry.holders += 1;
        if period < entry.period {
            entry.period = period;
            entry.due = entry.due.min(Instant::now() + period);
        }
        let kept = entry.kept.clone();
        if !state.running {
            state.running = true;
            tokio::spawn(refresh(etcd.clone(), self.clone()));
        }
        drop(state);
        self.0.changed.notify_one();
        kept
    }

    fn release(&self, id: i64) {
        let mut state = self.lock();
        if let Some(entry) = state.leases.get_mut(&id) {
            entry.holders -= 1;
            if entry.holders == 0 {
                state.leases.remove(&id);
            }
        }
        drop(state);
        self.0.changed.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One lease of the shard, to open a stream with.
    fn any(&self) -> Option<i64> {
        self.lock().leases.keys().next().copied()
    }

    /// Marks a lease lost (etcd said it does not exist) and stops refreshing it.
    fn lost(&self, id: i64) {
        if let Some(entry) = self.lock().leases.remove(&id) {
            tracing::warn!(
                lease = id,
                "lease lost: etcd expired it (not refreshed within its TTL)"
            );
            entry.kept.lost.send_replace(true);
        }
    }

    /// The leases due for a refresh (all of them when `all`; their next refresh scheduled),
    /// when the next one falls due, and the shortest refresh period (a stream unanswered that
    /// long is stuck). None once no lease is held: the task then ends.
    fn due(&self, all: bool) -> Option<(Vec<i64>, Instant, Duration)> {
        let mut state = self.lock();
        if state.leases.is_empty() {
            state.running = false;
            return None;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        let mut next = now + Duration::from_secs(3600);
        let mut shortest = Duration::from_secs(3600);
        for (id, entry) in state.leases.iter_mut() {
            if all || entry.due <= now {
                due.push(*id);
                entry.due = now + entry.period;
            }
            next = next.min(entry.due);
            shortest = shortest.min(entry.period);
        }
        Some((due, next, shortest))
    }

    fn answered(&self, id: i64, ttl: i64) {
        if ttl <= 0 {
            return self.lost(id);
        }
        let mut state = self.lock();
        if let Some(entry) = state.leases.get_mut(&id) {
            entry.kept.refreshed.now();
            entry.period = entry.period.min(Duration::from_secs(ttl as u64) / 3);
        }
    }
}

/// A refresh stream: etcd's client opens it with one lease's refresh, and returns once etcd
/// answered that one.
type Stream = (LeaseKeeper, LeaseKeepAliveStream);

/// An opening of a stream, with the lease it opened with; bounded by the shortest TTL (a lease
/// not refreshed by then is gone anyway).
type Opening = (i64, OpeningResult);

/// How an opening ended: a stream, etcd's refusal, or no answer in time.
type OpeningResult = std::result::Result<std::result::Result<Stream, etcd_client::Error>, Elapsed>;

/// Streams opening at once for one shard, at most: one more each refresh period that the
/// stream (or the openings before) did not answer.
const OPENINGS_AT_ONCE: usize = 3;

/// What woke the refresh task.
enum Event {
    Nothing,
    Answered(LeaseKeepAliveResponse),
    Broken(String),
    OpenAnother,
    Opened(Option<std::result::Result<Opening, tokio::task::JoinError>>),
}

/// Refreshes every lease of the shard over one stream until none is held.
///
/// A stream that leaves a refresh unanswered for a refresh period (a third of the shortest
/// TTL) may end at a member that stopped (frozen, cut off from its leader) or at one merely
/// slowed by load. So another stream is opened beside it, and the first of the two to answer
/// carries the refreshes from then on. Giving up on the slow stream instead, and bounding the
/// new one's opening by a refresh period, lost every lease of the stream whenever etcd
/// answered later than that: the new stream's first answer came as late, so no stream ever
/// opened (`scripts/soak.sh`, 30 minutes: hundreds of leases in one minute). A broken stream
/// (etcd restart, leader change) is opened again. Every lease is refreshed at once over a new
/// stream; a lease survives as long as a refresh lands within its TTL, and one etcd reports
/// gone is marked lost.
///
/// Requests are queued here and handed to the stream only as it takes them, while responses
/// are read all along: etcd answers a stream's refreshes one by one, so a writer blocked on a
/// full stream that stopped reading would stall both sides.
async fn refresh(etcd: Etcd, leases: Shard) {
    let mut s = Refresher::new(etcd, leases);
    loop {
        if (s.recheck || Instant::now() >= s.next) && !s.schedule() {
            return;
        }
        let event = tokio::select! {
            permit = reserve(s.keeper.as_ref()), if !s.pending.is_empty() => match permit {
                None => Event::Broken("the stream takes no more refreshes".into()),
                Some(permit) => {
                    if s.unanswered == 0 {
                        s.open_at = Some(Instant::now() + s.retry_within);
                    }
                    permit.send(PbLeaseKeepAliveRequest { id: s.pending.pop_front().unwrap_or_default() });
                    s.unanswered += 1;
                    // Hand over as many as the stream takes now; the rest wait for room.
                    if let Some(keeper) = &s.keeper {
                        let next = |id| PbLeaseKeepAliveRequest { id };
                        s.unanswered += hand_over(&keeper.sender, &mut s.pending, next);
                    }
                    Event::Nothing
                }
            },
            message = answer(s.responses.as_mut()) => match message {
                Ok(Some(resp)) => Event::Answered(resp),
                Ok(None) => Event::Broken("etcd ended the stream".into()),
                Err(e) => Event::Broken(e.to_string()),
            },
            opened = s.openings.join_next(), if !s.openings.is_empty() => Event::Opened(opened),
            _ = tokio::time::sleep_until(s.next) => Event::Nothing,
            _ = s.leases.0.changed.notified() => {
                s.recheck = true;
                Event::Nothing
            }
            _ = sleep_until_some(s.open_at), if s.openings.len() < OPENINGS_AT_ONCE => Event::OpenAnother,
        };
        let go_on = match event {
            Event::Nothing | Event::Opened(None | Some(Err(_))) => true,
            Event::Answered(resp) => s.answered(resp),
            Event::Broken(why) => s.broken(&why),
            Event::OpenAnother => s.open_another(),
            Event::Opened(Some(Ok((first, opened)))) => s.opened(first, opened),
        };
        if !go_on {
            return;
        }
    }
}

/// What the task of one refresh stream keeps between two events (`refresh`).
struct Refresher {
    etcd: Etcd,
    leases: Shard,
    /// Openings of a stream that failed in a row (the backoff's count).
    attempt: u32,
    /// The refresh period: a third of the shortest TTL of the shard's leases.
    retry_within: Duration,
    /// Dropping the set aborts its openings: done once a stream answers.
    openings: JoinSet<Opening>,
    keeper: Option<LeaseKeeper>,
    responses: Option<LeaseKeepAliveStream>,
    /// Refreshes due and not yet handed to the stream.
    pending: VecDeque<i64>,
    /// When the next lease is due.
    next: Instant,
    /// The shard's leases changed: see which are due now.
    recheck: bool,
    /// Refreshes handed to the stream and not answered yet.
    unanswered: usize,
    /// When to open a stream: at once with none; with one, a refresh period after it last
    /// answered (or was handed a refresh) while a refresh is unanswered.
    open_at: Option<Instant>,
}

impl Refresher {
    fn new(etcd: Etcd, leases: Shard) -> Refresher {
        Refresher {
            etcd,
            leases,
            attempt: 0,
            retry_within: Duration::from_secs(1),
            openings: JoinSet::new(),
            keeper: None,
            responses: None,
            pending: VecDeque::new(),
            next: Instant::now(),
            recheck: true,
            unanswered: 0,
            open_at: Some(Instant::now()),
        }
    }

    /// Queues the leases now due (when there is a stream to take them). False once the shard
    /// holds no lease: the task ends.
    fn schedule(&mut self) -> bool {
        let Some((due, at, shortest)) = self.leases.due(false) else {
            return false;
        };
        if self.keeper.is_some() {
            self.pending.extend(due);
        }
        (self.next, self.retry_within, self.recheck) = (at, shortest, false);
        true
    }

    fn answered(&mut self, resp: LeaseKeepAliveResponse) -> bool {
        if let Some(header) = resp.header() {
            self.etcd.saw_term(header.raft_term());
        }
        self.leases.answered(resp.id(), resp.ttl());
        self.unanswered = self.unanswered.saturating_sub(1);
        // The stream answers: none is needed beside it (dropping the set aborts them).
        if !self.openings.is_empty() {
            self.openings = JoinSet::new();
        }
        self.open_at = (self.unanswered > 0).then(|| Instant::now() + self.retry_within);
        true
    }

    fn broken(&mut self, why: &str) -> bool {
        tracing::debug!(unanswered = self.unanswered, error = %why,
            "the lease refresh stream broke; opening another");
        (self.keeper, self.responses, self.unanswered) = (None, None, 0);
        self.pending.clear();
        self.open_at = Some(Instant::now() + backoff_delay(&mut self.attempt));
        true
    }

    fn open_another(&mut self) -> bool {
        let Some(first) = self.leases.any() else {
            (self.recheck, self.open_at) = (true, None);
            return true;
        };
        if self.keeper.is_some() || !self.openings.is_empty() {
            tracing::debug!(
                unanswered = self.unanswered,
                opening = self.openings.len() + 1,
                "the lease refresh stream has not answered within a refresh period; opening another beside it"
            );
        }
        let mut client = self.etcd.client();
        let limit = self.retry_within * 3;
        self.openings.spawn(async move {
            let opened = tokio::time::timeout(limit, client.lease_keep_alive(first)).await;
            (first, opened)
        });
        self.open_at = Some(Instant::now() + self.retry_within);
        true
    }

    /// An opening ended (`first`: the lease it opened with). False once the shard holds no
    /// lease: the task ends.
    fn opened(&mut self, first: i64, opened: OpeningResult) -> bool {
        match opened {
            Ok(Ok((new_keeper, new_responses))) => {
                self.attempt = 0;
                self.openings = JoinSet::new();
                if let Some(entry) = self.leases.lock().leases.get(&first) {
                    entry.kept.refreshed.now();
                }
                (self.keeper, self.responses) = (Some(new_keeper), Some(new_responses));
                // Every lease at once over the new stream: the refreshes left unanswered
                // on the old one are dropped with it.
                let Some((all, at, shortest)) = self.leases.due(true) else {
                    return false;
                };
                self.pending = all.into_iter().filter(|id| *id != first).collect();
                (self.next, self.retry_within, self.unanswered, self.open_at) =
                    (at, shortest, 0, None);
            }
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(e)))
                if e.contains("lease not found") =>
            {
                self.leases.lost(first);
                if self.keeper.is_none() {
                    self.open_at = Some(Instant::now());
                }
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "no answer within the TTL".to_string(),
                };
                tracing::debug!(lease = first, attempt = self.attempt + 1, %error,
                    "cannot open a lease refresh stream; retrying");
                if self.keeper.is_none() && self.openings.is_empty() {
                    self.open_at = Some(Instant::now() + backoff_delay(&mut self.attempt));
                }
            }
        }
        true
    }
}

/// Room for one refresh on the stream, if there is one (None: it is gone).
async fn reserve(keeper: Option<&LeaseKeeper>) -> Option<Permit<'_, PbLeaseKeepAliveRequest>> {
    match keeper {
        Some(keeper) => keeper.sender.reserve().await.ok(),
        None => std::future::pending().await,
    }
}

/// The stream's next answer, if there is a stream.
async fn answer(
    responses: Option<&mut LeaseKeepAliveStream>,
) -> std::result::Result<Option<LeaseKeepAliveResponse>, etcd_client::Error> {
    match responses {
        Some(responses) => responses.message().await,
        None => std::future::pending().await,
    }
}
