//! The watches of a process on one etcd connection share a few gRPC watch streams (`STREAMS`),
//! as etcd's own clients share one: a stream per watch cost each watch a gRPC stream's buffers
//! (about 16 KiB), and an etcd that limits the streams of a connection
//! (`--max-concurrent-streams`) capped the watches of a process (a scheduler watching many
//! runs, or many nodes in one process).
//!
//! One task per stream owns it. A watch asks it for its targets; etcd answers a
//! stream's creates in the order they were sent, which is how each answer's watch id is matched
//! to its watch. Events are routed by watch id as they arrive; a dropped `Watch` cancels its
//! ids. A broken stream ends every watch on it (each reads afresh and watches again, as
//! before), and the next watch opens a new stream.

use super::{backoff, hand_over, sleep_until_some, Etcd, Target};
use crate::error::Result;
use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion};
use etcd_client::{Event, WatchOptions, WatchResponse};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// How long a stream with no watch left stays open for the next one (a node watches again at
/// every round).
const IDLE: Duration = Duration::from_secs(5);

/// A confirmed watch. Its events are read off the shared stream as soon as they arrive, so a
/// watch its owner does not read never holds back the connection's flow-control window for
/// every other request (that deadlocked rounds of 1024 nodes once).
pub struct Watch {
    events: mpsc::UnboundedReceiver<Option<Vec<Event>>>,
    id: u64,
    hub: mpsc::UnboundedSender<Command>,
}

impl Watch {
    /// The next batch of events, or `None` when the watch can no longer be trusted (stream
    /// broken, watcher cancelled, history compacted): the caller then watches again and reads
    /// a fresh snapshot, which is how compaction and etcd restarts are survived.
    pub async fn events(&mut self) -> Option<Vec<Event>> {
        self.events.recv().await.flatten()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.hub.send(Command::Close(self.id));
    }
}

/// How many streams a connection's watches are spread over. etcd sends a stream's responses one
/// after another: with every watch of 4096 nodes on one stream, a member leaving reached the
/// last of them so late that each node's watch saw 59 more departures before its cancel landed
/// (`scripts/bench.sh 4096`, shutdown); four streams still keep a process far below any limit
/// etcd sets on streams per connection.
const STREAMS: usize = 4;

/// The watches of one connection: the senders to its streams' tasks, while they run.
#[derive(Clone, Default)]
pub struct Watches(Arc<[Mutex<Option<mpsc::UnboundedSender<Command>>>; STREAMS]>);

/// Which event ends a watch where etcd sends it (see `Watches::watch`).
pub type Until = Arc<dyn Fn(&Event) -> bool + Send + Sync>;

pub enum Command {
    Open {
        id: u64,
        targets: Vec<Target>,
        until: Option<Until>,
        events: mpsc::UnboundedSender<Option<Vec<Event>>>,
        opened: oneshot::Sender<std::result::Result<(), String>>,
    },
    Close(u64),
}

static NEXT_WATCH: AtomicU64 = AtomicU64::new(1);

impl Watches {
    /// Watches `targets` on the connection's shared stream; returns once etcd confirmed every
    /// one. A stream that fails to open or breaks meanwhile is retried until `deadline`. With
    /// `until`, the watch ends after the first batch holding an event it matches: cancelled by
    /// the stream's task as it reads that batch, before its owner even sees it, so etcd stops
    /// matching it at once (a node's watch of its round ends at the first member leaving; when
    /// a job shuts down node after node, every event sent to it after that is etcd's work
    /// wasted). The owner gets that batch, then `None`.
    pub async fn watch(
        &self,
        etcd: &Etcd,
        targets: &[Target],
        until: Option<Until>,
        deadline: Instant,
    ) -> Result<Watch> {
        let mut attempt = 0u32;
        loop {
            let id = NEXT_WATCH.fetch_add(1, Ordering::Relaxed);
            let hub = self.hub(etcd, id as usize % STREAMS);
            let (events_tx, events) = mpsc::unbounded_channel();
            let (opened_tx, opened) = oneshot::channel();
            let watch = Watch {
                events,
                id,
                hub: hub.clone(),
            };
            let sent = hub.send(Command::Open {
                id,
                targets: targets.to_vec(),
                until: until.clone(),
                events: events_tx,
                opened: opened_tx,
            });
            let failure = match sent {
                Err(_) => "the watch stream ended".to_string(),
                Ok(()) => match tokio::time::timeout_at(deadline, opened).await {
                    Ok(Ok(Ok(()))) => return Ok(watch),
                    Ok(Ok(Err(e))) => e,
                    Ok(Err(_)) => "the watch stream ended".to_string(),
                    Err(_) => {
                        return Err(crate::error::Error::connection(format!(
                            "etcd at {} did not answer watch in time",
                            etcd.endpoints()
                        )))
                    }
                },
            };
            drop(watch);
            if Instant::now() >= deadline {
                return Err(crate::error::Error::connection(format!(
                    "etcd at {}: watch: {failure}",
                    etcd.endpoints()
                )));
            }
            tracing::debug!(attempt = attempt + 1, error = %failure, "watch failed; retrying");
            backoff(&mut attempt, deadline).await;
        }
    }

    /// Stream `i`'s task's sender, or a new task's.
    fn hub(&self, etcd: &Etcd, i: usize) -> mpsc::UnboundedSender<Command> {
        let mut slot = self.0[i].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        *slot = Some(tx.clone());
        tokio::spawn(run(etcd.clone(), rx));
        tx
    }
}

/// One watch's part of the stream.
struct Subscriber {
    events: mpsc::UnboundedSender<Option<Vec<Event>>>,
    until: Option<Until>,
    /// Answered once every target is confirmed.
    opened: Option<oneshot::Sender<std::result::Result<(), String>>>,
    wanted: usize,
    ids: Vec<i64>,
    /// Dropped by its owner while some of its creates were unanswered: each id is cancelled as
    /// it comes.
    closed: bool,
}

/// A request waiting for room in the stream.
enum Request {
    Create(String, WatchOptions),
    Cancel(i64),
}

impl Request {
    fn into_pb(self) -> PbWatchRequest {
        match self {
            Request::Create(key, options) => options.with_key(key).into(),
            Request::Cancel(id) => {
                let mut request = PbWatchRequest {
                    request_union: Some(PbWatchRequestUnion::CancelRequest(Default::default())),
                };
                if let Some(PbWatchRequestUnion::CancelRequest(cancel)) = &mut request.request_union
                {
                    cancel.watch_id = id;
                }
                request
            }
        }
    }
}

/// The task of one stream: opens it with the first watch's first target, then serves watches
/// until the stream breaks, or no watch is left for `IDLE`.
async fn run(etcd: Etcd, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut s = StreamTask::new(etcd);
    let broken = loop {
        if s.sender.is_none() {
            if let Err(why) = s.open().await {
                break why;
            }
        }
        let idle_at = s.idle_since.map(|since| since + IDLE);
        let stuck_at = (!s.creating.is_empty()).then(|| s.answered_at + s.etcd.attempt_timeout);
        // Commands first, then requests out, then responses: a dropped watch's cancels go out
        // before the next burst of its events is read (a node's watch of its round ends at the
        // first member leaving; every event sent to it after that is etcd's work wasted).
        let woke = tokio::select! {
            biased;
            command = commands.recv() => match command {
                None => return,
                Some(command) => Woke::Command(command),
            },
            permit = reserve(&s.sender), if s.sender.is_some() && !s.pending.is_empty() => {
                let Ok(permit) = permit else { break "the watch stream closed".to_string() };
                if let Some(request) = s.pending.pop_front() {
                    permit.send(request.into_pb());
                }
                // Hand over as many as the stream takes now; the rest wait for room.
                if let Some(sender) = &s.sender {
                    hand_over(&sender.0, &mut s.pending, Request::into_pb);
                }
                Woke::Nothing
            }
            message = next_message(&mut s.responses), if s.responses.is_some() => match message {
                Ok(Some(resp)) => Woke::Response(resp),
                Ok(None) => break "the watch stream ended".to_string(),
                Err(e) => break e.to_string(),
            },
            _ = sleep_until_some(stuck_at), if stuck_at.is_some() => {
                break "etcd did not answer the watch in time".to_string();
            }
            _ = sleep_until_some(idle_at), if idle_at.is_some() && s.pending.is_empty() => {
                // Idle: end, unless a watch asked meanwhile (its command is still queued).
                commands.close();
                if commands.is_empty() {
                    return;
                }
                s.idle_since = None;
                Woke::Nothing
            }
        };
        match woke {
            Woke::Nothing => {}
            Woke::Command(command) => s.command(command),
            Woke::Response(resp) => s.response(resp),
        }
    };
    // Every watch of this stream ends; the next watch opens a new stream (`Watches::hub`).
    commands.close();
    for (_, sub) in s.subscribers {
        match sub.opened {
            Some(opened) => {
                let _ = opened.send(Err(broken.clone()));
            }
            None => {
                let _ = sub.events.send(None);
            }
        }
    }
    // Watches that asked after the break are told at once, to retry on a new stream.
    while let Ok(command) = commands.try_recv() {
        if let Command::Open { opened, .. } = command {
            let _ = opened.send(Err(broken.clone()));
        }
    }
}

/// What woke a stream's task, to be handled once its other waits are dropped.
enum Woke {
    Nothing,
    Command(Command),
    Response(WatchResponse),
}

/// What the task of one stream keeps between two events (`run`).
struct StreamTask {
    etcd: Etcd,
    subscribers: HashMap<u64, Subscriber>,
    by_watch_id: HashMap<i64, u64>,
    /// The watch of each create sent and not yet answered, in the order sent.
    creating: VecDeque<u64>,
    /// Requests waiting for room in the stream.
    pending: VecDeque<Request>,
    /// The stream's two halves, once open.
    sender: Option<etcd_client::WatchRequestSender>,
    responses: Option<etcd_client::WatchResponseStream>,
    /// Since when no watch is left on the stream, if none is.
    idle_since: Option<Instant>,
    /// When etcd last answered on this stream: creates unanswered for an attempt's timeout
    /// mean a stream stuck on a member that no longer serves it, and it is broken off.
    answered_at: Instant,
}

impl StreamTask {
    fn new(etcd: Etcd) -> StreamTask {
        StreamTask {
            etcd,
            subscribers: HashMap::new(),
            by_watch_id: HashMap::new(),
            creating: VecDeque::new(),
            pending: VecDeque::new(),
            sender: None,
            responses: None,
            idle_since: Some(Instant::now()),
            answered_at: Instant::now(),
        }
    }

    /// Opens the stream with the first request queued, when it is a create. The error says
    /// why the stream could not be opened.
    async fn open(&mut self) -> std::result::Result<(), String> {
        if let Some(Request::Create(key, options)) = self.pending.pop_front() {
            // Bounded as any request is: a member that accepts and never answers (stopping,
            // starting) must not hold every watch of this stream.
            let mut client = self.etcd.client().watch_client();
            let opening = client.watch(key, Some(options));
            match tokio::time::timeout(self.etcd.attempt_timeout, opening).await {
                Ok(Ok(opened)) => {
                    let (tx, rx) = opened.split();
                    (self.sender, self.responses) = (Some(tx), Some(rx));
                    self.answered_at = Instant::now();
                }
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("etcd did not open the watch stream in time".to_string()),
            }
        }
        Ok(())
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Open {
                id,
                targets,
                until,
                events,
                opened,
            } => {
                self.idle_since = None;
                if self.creating.is_empty() {
                    // The wait for etcd's answer starts now, not at its last answer.
                    self.answered_at = Instant::now();
                }
                for target in &targets {
                    let (key, options) = target.options();
                    self.pending.push_back(Request::Create(key, options));
                    self.creating.push_back(id);
                }
                self.subscribers.insert(
                    id,
                    Subscriber {
                        events,
                        until,
                        opened: Some(opened),
                        wanted: targets.len(),
                        ids: Vec::new(),
                        closed: false,
                    },
                );
            }
            Command::Close(id) => {
                let unanswered = self.creating.contains(&id);
                if let Some(mut sub) = self.subscribers.remove(&id) {
                    for watch_id in sub.ids.drain(..) {
                        self.by_watch_id.remove(&watch_id);
                        // Ahead of queued creates (whose order is kept).
                        self.pending.push_front(Request::Cancel(watch_id));
                    }
                    if unanswered {
                        sub.closed = true;
                        self.subscribers.insert(id, sub);
                    }
                }
                if self.subscribers.is_empty() {
                    self.idle_since = Some(Instant::now());
                }
            }
        }
    }

    fn response(&mut self, resp: WatchResponse) {
        self.answered_at = Instant::now();
        for watch_id in self.answer(resp) {
            self.pending.push_front(Request::Cancel(watch_id));
        }
        if self.subscribers.is_empty() && self.idle_since.is_none() {
            self.idle_since = Some(Instant::now());
        }
    }

    /// Applies one response of the stream; returns watch ids to cancel.
    fn answer(&mut self, resp: WatchResponse) -> Vec<i64> {
        let StreamTask {
            subscribers,
            by_watch_id,
            creating,
            ..
        } = self;
        let watch_id = resp.watch_id();
        let mut cancel = Vec::new();
        if resp.created() {
            let Some(id) = creating.pop_front() else {
                return cancel;
            };
            let Some(sub) = subscribers.get_mut(&id) else {
                return cancel;
            };
            if resp.canceled() {
                // Refused (compacted history, a bad range): the watch fails as a whole.
                let reason = resp.cancel_reason().to_string();
                if let Some(opened) = sub.opened.take() {
                    let _ = opened.send(Err(format!("watch refused: {reason}")));
                }
                let sub = subscribers.remove(&id).map(|s| s.ids).unwrap_or_default();
                cancel.extend(sub);
                return cancel;
            }
            if sub.closed {
                cancel.push(watch_id);
                if !creating.contains(&id) {
                    subscribers.remove(&id);
                }
                return cancel;
            }
            sub.ids.push(watch_id);
            by_watch_id.insert(watch_id, id);
            if sub.ids.len() == sub.wanted {
                if let Some(opened) = sub.opened.take() {
                    let _ = opened.send(Ok(()));
                }
            }
            return cancel;
        }
        let Some(&id) = by_watch_id.get(&watch_id) else {
            return cancel;
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            // This watch can no longer be trusted: its owner reads afresh and watches again.
            if let Some(sub) = subscribers.remove(&id) {
                let _ = sub.events.send(None);
                for other in sub.ids {
                    by_watch_id.remove(&other);
                    if other != watch_id {
                        cancel.push(other);
                    }
                }
            }
            return cancel;
        }
        if !resp.events().is_empty() {
            let Some(sub) = subscribers.get(&id) else {
                return cancel;
            };
            let _ = sub.events.send(Some(resp.events().to_vec()));
            let ends = sub
                .until
                .as_ref()
                .is_some_and(|until| resp.events().iter().any(|e| until(e)));
            if ends && !creating.contains(&id) {
                // Dropped here: its owner reads this batch, then the end of the watch.
                if let Some(sub) = subscribers.remove(&id) {
                    for watch_id in sub.ids {
                        by_watch_id.remove(&watch_id);
                        cancel.push(watch_id);
                    }
                }
            }
        }
        cancel
    }
}

async fn reserve(
    sender: &Option<etcd_client::WatchRequestSender>,
) -> std::result::Result<mpsc::Permit<'_, PbWatchRequest>, ()> {
    match sender {
        Some(sender) => sender.0.reserve().await.map_err(|_| ()),
        None => std::future::pending().await,
    }
}

async fn next_message(
    responses: &mut Option<etcd_client::WatchResponseStream>,
) -> std::result::Result<Option<WatchResponse>, etcd_client::Error> {
    match responses {
        Some(responses) => responses.message().await,
        None => std::future::pending().await,
    }
}
