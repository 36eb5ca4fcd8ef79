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
//! Suspect versus victims: when one rank hangs, its peers soon block in a collective and stop
//! making progress too, so the first rank to time out is not necessarily the cause. Whoever
//! detects a hang announces it in the round's store (`HANG`); every launcher answers with its
//! workers' progress (`PROGRESS/{node rank}`: last progress as wall-clock time, section,
//! step), and the detecting launcher names the rank whose last progress is the oldest as the
//! suspect and the others as waiting on it (`verdict`). Comparing across nodes relies on their
//! clocks agreeing to well under a step (NTP does); when every rank marks its collectives as
//! sections, the suspect is the one not in the collective.

use super::workers::Watched;
use crate::args::monitor::Timeout;
use crate::output::say;
use crate::settings::monitor::MonitorConfig;
use rdzv::progress::Snapshot;
use rdzv::{ErrorKind, Store};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// A learned timeout is this many times the longest interval seen (NVRx's safety factor).
pub const SAFETY: u32 = 5;
/// A learned timeout is never shorter: a step of 10 ms does not make a 50 ms pause a hang.
pub const AUTO_FLOOR: Duration = Duration::from_secs(5);
/// How long evidence may take per worker before the workers are stopped.
pub const EVIDENCE_BOUND: Duration = Duration::from_secs(2);
/// How long the detecting launcher waits for the other nodes' progress.
pub const GATHER_BOUND: Duration = Duration::from_secs(1);

const HANG: &str = "rdzv/agent/hang";
const PROGRESS: &str = "rdzv/agent/progress";
const LEARNED: &str = "rdzv/agent/learned";

/// Ranks that stopped within this of the suspect, in the same section, make the verdict
/// uncertain.
const ALIKE: Duration = Duration::from_millis(100);

/// A store wait that stands for "until it happens": renewed when it times out.
const LONG_WAIT: Duration = Duration::from_secs(3600);

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
    (longest * SAFETY).max(AUTO_FLOOR)
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
        if let Some(open) = &s.open {
            let given = self.cfg.sections.iter().find(|(n, _)| *n == open.name);
            let section = match given.map(|(_, t)| *t) {
                Some(Timeout::Given(t)) => Some((t, "--section-timeout")),
                Some(Timeout::Auto) => job
                    .sections
                    .get(&open.name)
                    .map(|l| (learned_timeout(*l), "learned")),
                None if self.cfg.hang == Some(Timeout::Auto) => job
                    .sections
                    .get(&open.name)
                    .map(|l| (learned_timeout(*l), "learned")),
                None => None,
            };
            if let Some((t, from)) = section {
                return Some((open.open_for, t, from));
            }
        }
        let Some(silent) = s.since_event else {
            return self
                .cfg
                .initial
                .map(|t| (since_start, t, "--hang-initial-timeout"));
        };
        match self.cfg.hang {
            Some(Timeout::Given(t)) => Some((silent, t, "--hang-timeout")),
            Some(Timeout::Auto) => match job.beat {
                Some(longest) => Some((silent, learned_timeout(longest), "learned")),
                None => self
                    .cfg
                    .initial
                    .map(|t| (silent, t, "--hang-initial-timeout")),
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
                let s = w.snapshot();
                let (silent, timeout, source) = self.limit(s.as_ref(), w.started.elapsed(), job)?;
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

/// Tells the other launchers that this node (`group_rank`) found `hung`; they answer with
/// their workers' progress (`peer_hung`). The first announcement stands: returns another
/// node's when it came first (that node spends the restart; this one only re-forms).
pub async fn announce(store: &Store, group_rank: u32, host: &str, hung: &Hung) -> Option<Value> {
    let what = json!({"node": group_rank, "host": host, "rank": hung.global_rank, "what": hung.describe()})
        .to_string();
    match store.compare_set(HANG, b"", what.as_bytes()).await {
        Ok(first) if first != what.as_bytes() => serde_json::from_slice(&first).ok(),
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
pub async fn share_progress(store: &Store, group_rank: u32, mine: &[Value]) {
    let key = format!("{PROGRESS}/{group_rank}");
    if let Err(e) = store
        .set(&key, Value::from(mine).to_string().as_bytes())
        .await
    {
        say(format_args!(
            "could not share the workers' progress: {}",
            e.message()
        ));
    }
}

/// Resolves when another launcher announces a hang (`announce`): returns what it said.
/// Never resolves when the store fails (the membership check sees why).
pub async fn peer_hung(store: &Store) -> Value {
    loop {
        match store.get(HANG, Some(LONG_WAIT)).await {
            Ok(raw) => return serde_json::from_slice(&raw).unwrap_or_default(),
            Err(e) if e.kind() == ErrorKind::Timeout => continue,
            Err(_) => return std::future::pending().await,
        }
    }
}

/// Every node's workers' progress (`share_progress`), waiting up to `bound` for all
/// `nodes` to answer; those that did not are left out.
pub async fn gather(store: &Store, nodes: u32, bound: Duration) -> Vec<Value> {
    let keys: Vec<String> = (0..nodes).map(|n| format!("{PROGRESS}/{n}")).collect();
    let deadline = tokio::time::Instant::now() + bound;
    let reads = keys.iter().map(|k| async move {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        store.get(k, Some(left)).await.ok()
    });
    let mut all = Vec::new();
    for raw in super::join_all(reads).await.into_iter().flatten() {
        if let Ok(Value::Array(workers)) = serde_json::from_slice(&raw) {
            all.extend(workers);
        }
    }
    all
}

/// The suspect and its victims, from every node's workers' progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The rank whose last progress is the oldest.
    pub suspect: Value,
    /// The others, each with how long after the suspect it stopped.
    pub victims: Vec<(Value, Duration)>,
}

/// Names the rank that stopped first as the suspect (ties: the lowest rank); ranks that never
/// reported progress, or had exited, are left out.
pub fn verdict(all: &[Value]) -> Option<Verdict> {
    let last = |w: &Value| w["last_progress_ms"].as_u64();
    let rank = |w: &Value| w["rank"].as_u64().unwrap_or(u64::MAX);
    let mut seen: Vec<&Value> = all
        .iter()
        .filter(|w| last(w).is_some() && w["ended"] != true)
        .collect();
    seen.sort_by_key(|w| (last(w), rank(w)));
    let (suspect, rest) = seen.split_first()?;
    let at = last(suspect)?;
    Some(Verdict {
        suspect: (*suspect).clone(),
        victims: rest
            .iter()
            .map(|w| {
                (
                    (*w).clone(),
                    Duration::from_millis(last(w).unwrap_or(at) - at),
                )
            })
            .collect(),
    })
}

impl Verdict {
    /// The report's lines: the suspect, then the victims grouped by section.
    pub fn lines(&self) -> Vec<String> {
        let who = |w: &Value| {
            format!(
                "rank {} (local rank {} on {})",
                w["rank"],
                w["local_rank"],
                w["host"].as_str().unwrap_or("?")
            )
        };
        let section = |w: &Value| match w["section"].as_str() {
            Some(s) => format!("in section {s:?}"),
            None => "outside any section".to_string(),
        };
        let s = &self.suspect;
        // Ranks that stopped about when the suspect did, in the same place, cannot be told
        // apart from it (heartbeats alone put every rank's last one in the same step).
        let mut alike: Vec<u64> = self
            .victims
            .iter()
            .filter(|(w, after)| *after < ALIKE && w["section"] == s["section"])
            .map(|(w, _)| w["rank"].as_u64().unwrap_or(0))
            .collect();
        alike.sort_unstable();
        let doubt = match alike.is_empty() {
            true => String::new(),
            false => format!(
                " (uncertain: rank(s) {} stopped within {:.1} s of it in the same place; marking collectives with rdzv sections tells them apart)",
                compress(&alike),
                ALIKE.as_secs_f64()
            ),
        };
        let mut lines = vec![format!(
            "suspect: {} stopped first, {}, {:.1} s without progress{}{doubt}",
            who(s),
            section(s),
            s["silent_s"].as_f64().unwrap_or(0.0),
            s["step"]
                .as_u64()
                .map(|n| format!(", at step {n}"))
                .unwrap_or_default()
        )];
        let mut by_section: BTreeMap<String, Vec<(u64, Duration)>> = BTreeMap::new();
        for (w, after) in &self.victims {
            by_section
                .entry(section(w))
                .or_default()
                .push((w["rank"].as_u64().unwrap_or(0), *after));
        }
        for (section, ranks) in by_section {
            let latest = ranks.iter().map(|(_, a)| *a).max().unwrap_or_default();
            let mut ranks: Vec<u64> = ranks.into_iter().map(|(r, _)| r).collect();
            ranks.sort_unstable();
            lines.push(format!(
                "waiting on it: rank(s) {} {section}, stopped up to {:.1} s later",
                compress(&ranks),
                latest.as_secs_f64()
            ));
        }
        lines
    }

    pub fn to_json(&self) -> Value {
        json!({
            "suspect": self.suspect,
            "victims": self.victims.iter().map(|(w, after)| {
                let mut w = w.clone();
                w["stopped_after_suspect_s"] = json!(after.as_secs_f64());
                w
            }).collect::<Vec<_>>(),
        })
    }
}

/// 0,1,2,5 → "0-2,5".
fn compress(ranks: &[u64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(match i == j {
            true => ranks[i].to_string(),
            false => format!("{}-{}", ranks[i], ranks[j]),
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests;
