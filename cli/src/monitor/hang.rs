//! Hangs: a worker that stops making progress (no heartbeat, no section begun or ended) for
//! longer than its timeout.
//!
//! Which timeout applies to a worker, at each tick (`limit`):
//! - inside a section that has one (`--section-timeout NAME=…`, or learned with `auto`): how
//!   long the section has been open, against that;
//! - otherwise: how long since its last progress, against `--hang-timeout` (given, or learned);
//! - before its first progress: nothing, or `--hang-initial-timeout` (with `auto`) from its
//!   start.
//!
//! `auto` learns as NVRx does, but job-wide: the longest interval between two heartbeats after
//! the warm-up (and the longest run of each section), times `SAFETY`, never below `AUTO_FLOOR`;
//! from one attempt to the next the learned values are smoothed (the mean of the previous and
//! the new, NVRx's alpha of 0.5). Each launcher publishes what its workers show to the round's
//! store when it grew by a quarter (a few writes per job, not per step), and reads the job's
//! value once before declaring a hang: every node applies the longest interval any worker of
//! the job showed.
//!
//! Before its first progress a worker is watched only against `--hang-initial-timeout`; while
//! it has paused monitoring (`rdzv::progress::pause`: a final save, its exit) it is not
//! watched at all; under `auto`, a section that never ended yet has no learned timeout, so
//! it too is watched only against `--hang-initial-timeout` (a first checkpoint is not a
//! hang). A damaged page (`rdzv::progress::Read::Damaged`) shows no progress, so its worker is
//! held to the heartbeat timeout from the last progress its page showed.
//!
//! The launchers' hang protocol, in the round's store: whoever detects a hang announces it
//! (`HANG`, a `HangNotice`; the first stands); every launcher answers with its workers'
//! progress (`PROGRESS/{node rank}`, `WorkerProgress` records), from which the detecting
//! launcher names the suspect (`verdict`), and with where its evidence went
//! (`EVIDENCE/{node rank}`), so the hang's note names every node's.

use super::pages::Watched;
use super::verdict::WorkerProgress;
use crate::args::monitor::Timeout;
use crate::output::say;
use crate::settings::monitor::MonitorConfig;
use rdzv::progress::{Read, Snapshot};
use rdzv::{ErrorKind, Store};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// A learned timeout is this many times the longest interval seen (NVRx's safety factor).
pub const SAFETY: u32 = 5;
/// A learned timeout is never shorter: a step of 10 ms does not make a 50 ms pause a hang.
pub const AUTO_FLOOR: Duration = Duration::from_secs(5);
/// How long the detecting launcher waits for the other nodes' progress.
pub const GATHER_BOUND: Duration = Duration::from_secs(1);

const HANG: &str = "rdzv/agent/hang";
const PROGRESS: &str = "rdzv/agent/progress";
const EVIDENCE: &str = "rdzv/agent/evidence";
const LEARNED: &str = "rdzv/agent/learned";

/// What `auto` learned: the longest heartbeat interval, and each section's longest run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learned {
    pub beat: Option<Duration>,
    pub sections: BTreeMap<String, Duration>,
}

impl Learned {
    /// What this node's workers show now.
    pub fn observed(workers: &[Watched]) -> Learned {
        let mut learned = Learned::default();
        for s in workers.iter().filter_map(Watched::snapshot) {
            learned.merge(&Learned::of(&s));
        }
        learned
    }

    fn of(s: &Snapshot) -> Learned {
        Learned {
            beat: s.max_interval,
            sections: s.sections.iter().map(|r| (r.name.clone(), r.max)).collect(),
        }
    }

    /// The longer of each.
    pub fn merge(&mut self, other: &Learned) {
        self.beat = self.beat.max(other.beat);
        for (name, took) in &other.sections {
            let mine = self.sections.entry(name.clone()).or_default();
            *mine = (*mine).max(*took);
        }
    }

    /// From one attempt to the next: the mean of what was learned before and what this attempt
    /// showed (either alone when the other has none).
    pub fn smoothed(&self, attempt: &Learned) -> Learned {
        let mean = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some((a + b) / 2),
            (a, b) => a.or(b),
        };
        let names: std::collections::BTreeSet<&String> = self
            .sections
            .keys()
            .chain(attempt.sections.keys())
            .collect();
        Learned {
            beat: mean(self.beat, attempt.beat),
            sections: names
                .into_iter()
                .filter_map(|n| {
                    let m = mean(
                        self.sections.get(n).copied(),
                        attempt.sections.get(n).copied(),
                    )?;
                    Some((n.clone(), m))
                })
                .collect(),
        }
    }

    /// Grew enough since `published` to be worth a write: by a quarter, or a new section.
    fn grew_from(&self, published: &Learned) -> bool {
        let grew = |now: Duration, then: Option<Duration>| match then {
            None => true,
            Some(then) => now.as_secs_f64() > then.as_secs_f64() * 1.25,
        };
        self.beat.is_some_and(|b| grew(b, published.beat))
            || self
                .sections
                .iter()
                .any(|(n, t)| grew(*t, published.sections.get(n).copied()))
    }

    fn to_json(&self) -> Vec<u8> {
        let sections: serde_json::Map<String, Value> = self
            .sections
            .iter()
            .map(|(n, t)| (n.clone(), json!(t.as_secs_f64())))
            .collect();
        json!({"beat_s": self.beat.map(|b| b.as_secs_f64()), "sections": sections})
            .to_string()
            .into_bytes()
    }

    fn from_json(bytes: &[u8]) -> Learned {
        let v: Value = serde_json::from_slice(bytes).unwrap_or_default();
        let secs = |v: &Value| {
            v.as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
        };
        Learned {
            beat: secs(&v["beat_s"]),
            sections: v["sections"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(n, t)| Some((n.clone(), secs(t)?)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// A worker found hung.
#[derive(Debug, Clone)]
pub struct Hung {
    pub global_rank: u32,
    pub local_rank: u32,
    pub pid: u32,
    /// The section it is in, if any.
    pub section: Option<String>,
    /// How long it made no progress (or how long its section has been open).
    pub silent: Duration,
    pub timeout: Duration,
    /// Where the timeout came from: "--hang-timeout", "learned", ...
    pub source: &'static str,
    pub beats: u64,
    pub step: Option<u64>,
}

impl Hung {
    pub fn describe(&self) -> String {
        format!(
            "rank {} (local rank {}, pid {}) made no progress for {:.1} s{} (timeout {:.1} s, {}; {} heartbeat(s){})",
            self.global_rank,
            self.local_rank,
            self.pid,
            self.silent.as_secs_f64(),
            self.section
                .as_ref()
                .map(|s| format!(" in section {s:?}"))
                .unwrap_or_default(),
            self.timeout.as_secs_f64(),
            self.source,
            self.beats,
            self.step.map(|s| format!(", last step {s}")).unwrap_or_default(),
        )
    }
}

/// A worker's timeout now: (elapsed, timeout, where the timeout came from).
type Limit = (Duration, Duration, &'static str);

/// The hang monitor of one attempt.
pub struct HangMonitor<'a> {
    pub cfg: &'a MonitorConfig,
    /// Learned in earlier attempts (smoothed).
    pub carried: &'a Learned,
    pub interval: Duration,
    /// The round's store, when other launchers share it.
    pub store: Option<&'a Store>,
}

fn learned_timeout(longest: Duration) -> Duration {
    longest.saturating_mul(SAFETY).max(AUTO_FLOOR)
}

impl HangMonitor<'_> {
    /// The timeout that applies to a worker whose page says `s` (module comment).
    fn limit(&self, s: Option<&Snapshot>, since_start: Duration, job: &Learned) -> Option<Limit> {
        let Some(s) = s else {
            // Never called rdzv's progress API: watched only against an initial timeout.
            return self
                .cfg
                .initial
                .map(|t| (since_start, t, "--hang-initial-timeout"));
        };
        if s.paused_for.is_some() {
            return None;
        }
        if let Some(open) = &s.open {
            let given = self.cfg.sections.iter().find(|(n, _)| *n == open.name);
            let auto = match given.map(|(_, t)| *t) {
                Some(Timeout::Given(t)) => return Some((open.open_for, t, "--section-timeout")),
                Some(Timeout::Auto) => true,
                None => self.cfg.hang == Some(Timeout::Auto),
            };
            if auto {
                return match job.sections.get(&open.name) {
                    Some(l) => Some((open.open_for, learned_timeout(*l), "learned")),
                    // Never ended yet: nothing to learn from, and a first checkpoint is not a
                    // hang. Only an initial timeout, if one is given, applies.
                    None => self
                        .cfg
                        .initial
                        .map(|t| (open.open_for, t, "--hang-initial-timeout")),
                };
            }
        }
        let Some(silent) = s.since_event else {
            return self
                .cfg
                .initial
                .map(|t| (since_start, t, "--hang-initial-timeout"));
        };
        self.beat_limit(job).map(|(t, from)| (silent, t, from))
    }

    /// The heartbeat's timeout: given, learned, or (under `auto`, before anything is learned)
    /// the initial one.
    fn beat_limit(&self, job: &Learned) -> Option<(Duration, &'static str)> {
        match self.cfg.hang {
            Some(Timeout::Given(t)) => Some((t, "--hang-timeout")),
            Some(Timeout::Auto) => match job.beat {
                Some(longest) => Some((learned_timeout(longest), "learned")),
                None => self.cfg.initial.map(|t| (t, "--hang-initial-timeout")),
            },
            None => None,
        }
    }

    /// Resolves when a worker of `workers` is hung; never, when nothing is watched.
    pub async fn watch(&self, workers: &[Watched]) -> Hung {
        if !self.cfg.watches_progress() {
            return std::future::pending().await;
        }
        let mut published = Learned::default();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut job = self.carried.clone();
            job.merge(&Learned::observed(workers));
            if self.cfg.learns() && job.grew_from(&published) {
                if let Some(store) = self.store {
                    job.merge(&publish(store, &job).await);
                }
                published = job.clone();
            }
            let Some(suspect) = self.first_past(workers, &job) else {
                continue;
            };
            if suspect.source == "learned" {
                // Before calling it a hang: what the rest of the job has seen.
                if let Some(store) = self.store {
                    job.merge(&read_learned(store).await);
                }
                match self.first_past(workers, &job) {
                    Some(hung) => return hung,
                    None => continue,
                }
            }
            return suspect;
        }
    }

    /// The worker furthest past its timeout, if any is.
    fn first_past(&self, workers: &[Watched], job: &Learned) -> Option<Hung> {
        workers
            .iter()
            .filter(|w| !w.has_exited())
            .filter_map(|w| {
                let (s, limit) = match w.read() {
                    Read::Page(s) => {
                        let limit = self.limit(Some(&s), w.started.elapsed(), job);
                        (Some(s), limit)
                    }
                    Read::NotYet => (None, self.limit(None, w.started.elapsed(), job)),
                    // No progress can be read: silence since the last that could.
                    Read::Damaged(_) => (
                        None,
                        self.beat_limit(job)
                            .map(|(t, _)| (w.silent_since(), t, "its progress page is damaged")),
                    ),
                };
                let (silent, timeout, source) = limit?;
                (silent > timeout).then(|| Hung {
                    global_rank: w.global_rank,
                    local_rank: w.local_rank,
                    pid: w.pid,
                    section: s
                        .as_ref()
                        .and_then(|s| s.open.as_ref())
                        .map(|o| o.name.clone()),
                    silent,
                    timeout,
                    source,
                    beats: s.as_ref().map_or(0, |s| s.beats),
                    step: s.as_ref().and_then(|s| s.step),
                })
            })
            .max_by(|a, b| {
                let over = |h: &Hung| h.silent.as_secs_f64() / h.timeout.as_secs_f64();
                over(a).total_cmp(&over(b))
            })
    }
}

/// Merges `mine` into the job's learned values in the round's store (compare-and-set, so
/// concurrent publishers keep the longest of each); returns the job's.
async fn publish(store: &Store, mine: &Learned) -> Learned {
    for _ in 0..5 {
        let (current, raw) = match store.get(LEARNED, Some(Duration::ZERO)).await {
            Ok(raw) => (Learned::from_json(&raw), raw),
            Err(e) if e.kind() == ErrorKind::Timeout => (Learned::default(), Vec::new()),
            Err(_) => return mine.clone(),
        };
        let mut merged = current.clone();
        merged.merge(mine);
        if merged == current {
            return current;
        }
        let desired = merged.to_json();
        match store.compare_set(LEARNED, &raw, &desired).await {
            Ok(now) if now == desired => return merged,
            Ok(_) => continue,
            Err(_) => return mine.clone(),
        }
    }
    mine.clone()
}

/// The job's learned values in the round's store (none yet: empty).
pub async fn read_learned(store: &Store) -> Learned {
    match store.get(LEARNED, Some(Duration::ZERO)).await {
        Ok(raw) => Learned::from_json(&raw),
        Err(_) => Learned::default(),
    }
}

/// A hang as the launcher that found it announces it (`HANG`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HangNotice {
    /// The node rank of the launcher that found it.
    pub node: u32,
    pub host: String,
    pub rank: u32,
    /// `Hung::describe`.
    pub what: String,
}

impl HangNotice {
    fn to_bytes(&self) -> Vec<u8> {
        json!({"node": self.node, "host": self.host, "rank": self.rank, "what": self.what})
            .to_string()
            .into_bytes()
    }

    fn from_bytes(bytes: &[u8]) -> HangNotice {
        let v: Value = serde_json::from_slice(bytes).unwrap_or_default();
        let u32_of = |k: &str| v[k].as_u64().and_then(|n| u32::try_from(n).ok());
        HangNotice {
            node: u32_of("node").unwrap_or(u32::MAX),
            host: v["host"].as_str().unwrap_or("?").to_string(),
            rank: u32_of("rank").unwrap_or(u32::MAX),
            what: v["what"].as_str().unwrap_or("a worker hung").to_string(),
        }
    }
}

/// Tells the other launchers that this node (`group_rank`) found `hung`; they answer with
/// their workers' progress (`peer_hung`). The first announcement stands: returns another
/// node's when it came first (that node spends the restart; this one only re-forms).
pub async fn announce(
    store: &Store,
    group_rank: u32,
    host: &str,
    hung: &Hung,
) -> Option<HangNotice> {
    let mine = HangNotice {
        node: group_rank,
        host: host.to_string(),
        rank: hung.global_rank,
        what: hung.describe(),
    }
    .to_bytes();
    match store.compare_set(HANG, b"", &mine).await {
        Ok(first) if first != mine => Some(HangNotice::from_bytes(&first)),
        Ok(_) => None,
        Err(e) => {
            say(format_args!(
                "could not tell the other nodes of the hang: {}",
                e.message()
            ));
            None
        }
    }
}

/// Publishes this node's workers' progress (`Watched::progress`) under its node rank.
pub async fn share_progress(store: &Store, group_rank: u32, mine: &[WorkerProgress]) {
    let key = format!("{PROGRESS}/{group_rank}");
    if let Err(e) = store.set(&key, &WorkerProgress::list_to_bytes(mine)).await {
        say(format_args!(
            "could not share the workers' progress: {}",
            e.message()
        ));
    }
}

/// Resolves when another launcher announces a hang (`announce`): returns what it said.
/// Never resolves when the store fails (the membership check sees why).
pub async fn peer_hung(store: &Store) -> HangNotice {
    HangNotice::from_bytes(&crate::store_wait::until_set(store, HANG).await)
}

/// Reads `{prefix}/{n}` for every node, waiting up to `bound` for all `nodes` to answer;
/// those that did not are left out.
async fn gather_raw(
    store: &Store,
    prefix: &str,
    nodes: impl Iterator<Item = u32>,
    bound: Duration,
) -> Vec<Vec<u8>> {
    let keys: Vec<String> = nodes.map(|n| format!("{prefix}/{n}")).collect();
    let deadline = tokio::time::Instant::now() + bound;
    let reads = keys.iter().map(|k| async move {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        store.get(k, Some(left)).await.ok()
    });
    super::join_all(reads).await.into_iter().flatten().collect()
}

/// Every node's workers' progress (`share_progress`), waiting up to `bound` for all
/// `nodes` to answer; those that did not are left out.
pub async fn gather(store: &Store, nodes: u32, bound: Duration) -> Vec<WorkerProgress> {
    gather_raw(store, PROGRESS, 0..nodes, bound)
        .await
        .iter()
        .flat_map(|raw| WorkerProgress::list_from_bytes(raw))
        .collect()
}

/// Publishes where this node's workers' evidence went, for the note of the node that found
/// the hang (`gather_evidence`).
pub async fn share_evidence(store: &Store, group_rank: u32, mine: &[(u32, Value)]) {
    let map: serde_json::Map<String, Value> = mine
        .iter()
        .map(|(rank, e)| (rank.to_string(), e.clone()))
        .collect();
    let key = format!("{EVIDENCE}/{group_rank}");
    let _ = store
        .set(&key, Value::Object(map).to_string().as_bytes())
        .await;
}

/// Every other node's evidence (`share_evidence`), waiting up to `bound`; by rank. The
/// finder (`group_rank`) shares none: waiting for its own would wait out the bound.
pub async fn gather_evidence(
    store: &Store,
    nodes: u32,
    group_rank: u32,
    bound: Duration,
) -> serde_json::Map<String, Value> {
    let mut all = serde_json::Map::new();
    let others = (0..nodes).filter(|&n| n != group_rank);
    for raw in gather_raw(store, EVIDENCE, others, bound).await {
        if let Ok(Value::Object(map)) = serde_json::from_slice(&raw) {
            all.extend(map);
        }
    }
    all
}

/// The hung worker's error file, as torchelastic writes one (the report and the launcher's
/// own TORCHELASTIC_ERROR_FILE take it from there): the hang, and its stacks if it gave them.
pub fn write_error_file(path: &std::path::Path, hung: &Hung, stacks: Option<&str>) {
    write_error_file_why(path, &hung.describe(), stacks);
}

/// The same, saying `why` the worker is taken for the hung one.
pub fn write_error_file_why(path: &std::path::Path, why: &str, stacks: Option<&str>) {
    let stacks = stacks.unwrap_or(
        "(no stacks: the worker registered no stack signal and py-spy is not installed)",
    );
    let _ = crate::workers::error_file::write(path, &format!("hang: {why}"), stacks);
}

#[cfg(test)]
mod tests;
