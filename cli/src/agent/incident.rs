//! The agent's part of the incident records (`crate::incidents`): how this node's last round
//! ended, carried into the next round, and, in the next round, the report of when this
//! node's workers were all stepping. The last node of the round to report writes the record.
//!
//! Nothing here is on a recovery's path: what a node saw of a round's end travels in its
//! entry of the next round, written once its workers step (two requests per node per round,
//! none at rest). Only a node that leaves (drained, unhealthy) writes what it saw on its way
//! out. The round's store holds the entries (`incident/entry/{group rank}`) and a counter;
//! the node whose add makes the count the round's size reads them all and writes the
//! record and the ledger in the run's notes.

use super::source::{Round, Source};
use crate::events::{Recorder, Source as EventSource};
use crate::incidents::{self, wall_ms};
use crate::monitor::hang::Hung;
use crate::monitor::pages::Watched;
use crate::monitor::respond::HangNote;
use rdzv::{progress::Read, Store};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// How long a node waits for its workers' first heartbeats before it reports without them
/// (workers that never call `heartbeat()`): the record then has no first step.
const NO_STEP_WAIT: Duration = Duration::from_secs(60);
/// How often the pages are read while waiting for the first step: the first step's time is
/// known to this much (or exactly, when a worker beat once between two reads).
const STEP_POLL: Duration = Duration::from_millis(10);

/// What a node saw of a round's end first-hand: its worker crashed or hung, or it left.
pub(super) struct Found {
    pub kind: &'static str,
    pub why: String,
    pub rank: Option<u32>,
    pub suspect: Option<u32>,
    /// None: when the round's end was seen here (`Log::ended`). It is decided when found.
    pub fault_ms: Option<u64>,
}

impl Found {
    /// A fault of `kind` whose time is when it was seen.
    pub fn of(kind: &'static str, why: String) -> Found {
        Found {
            kind,
            why,
            rank: None,
            suspect: None,
            fault_ms: None,
        }
    }

    /// A worker of rank `rank` failed (`why`), seen as it exited.
    pub fn crash(rank: u32, why: &str) -> Found {
        Found {
            rank: Some(rank),
            ..Found::of("crash", why.to_string())
        }
    }

    /// A hang found here (`ended_ms`: when), with the verdict's suspect: the fault is the
    /// suspect's last progress, or the hung worker's.
    pub fn hang(hung: &Hung, note: &HangNote, ended_ms: u64) -> Found {
        let suspect = note.verdict.as_ref().map(|v| &v.suspect);
        let silent = (hung.silent.as_millis() as u64).min(ended_ms);
        let fault = suspect.and_then(|s| s.last_progress_ms);
        Found {
            rank: Some(hung.global_rank),
            suspect: suspect.map(|s| s.rank),
            fault_ms: Some(fault.unwrap_or(ended_ms - silent)),
            ..Found::of("hang", hung.describe())
        }
    }
}

/// How this node's last round ended, as it saw it.
struct Ended {
    round: u64,
    kind: &'static str,
    why: String,
    at_ms: u64,
    found: Option<Value>,
    /// The round's members, for the evictions among those gone.
    members: Option<Arc<[String]>>,
}

/// This node's side of the records.
pub(super) struct Log {
    started_ms: u64,
    last: Option<Ended>,
    /// The current round's members (taken once its workers run).
    members: Option<Arc<[String]>>,
}

impl Log {
    pub fn new() -> Log {
        Log {
            started_ms: wall_ms(),
            last: None,
            members: None,
        }
    }

    /// The current round's members, for the next record's evictions.
    pub fn members(&mut self, members: Option<Arc<[String]>>) {
        self.members = members;
    }

    /// Round `round` ended here as `kind` (`why`). What was found first-hand stays.
    pub fn ended(&mut self, round: u64, kind: &'static str, why: impl Into<String>) {
        if self.last.as_ref().is_some_and(|e| e.round == round) {
            return;
        }
        self.last = Some(Ended {
            round,
            kind,
            why: why.into(),
            at_ms: wall_ms(),
            found: None,
            members: self.members.take(),
        });
    }

    /// What this node found of round `round`'s end (`who`: this node as the notes name it),
    /// detected when `ended` was called for it.
    pub fn found(&mut self, round: u64, who: &str, f: Found) {
        self.ended(round, f.kind, f.why.clone());
        // The first finding stays (a hang's, then the failure it is charged as).
        let Some(e) = self.last.as_mut().filter(|e| e.found.is_none()) else {
            return;
        };
        e.kind = f.kind;
        e.found = Some(json!({"kind": f.kind, "why": f.why, "rank": f.rank,
            "suspect": f.suspect, "node": who, "fault_ms": f.fault_ms.unwrap_or(e.at_ms),
            "detected_ms": e.at_ms, "decided_ms": wall_ms()}));
    }

    /// The round's end was a member's loss after all (a worker failed for it).
    pub fn lost(&mut self, why: &str) {
        if let Some(e) = self.last.as_mut() {
            (e.kind, e.why, e.found) = ("lost", why.to_string(), None);
        }
    }

    /// When round `round` ended here (now, if it was not said).
    pub fn ended_ms(&self, round: u64) -> u64 {
        self.last
            .as_ref()
            .filter(|e| e.round == round)
            .map_or_else(wall_ms, |e| e.at_ms)
    }

    /// This node leaves: what it found of its last round's end goes to the run's notes,
    /// since it will not report in the next round.
    pub async fn leaving<S: Source>(&self, source: &S) {
        let (Some(e), Some(run)) = (&self.last, source.run_store().await) else {
            return;
        };
        if let Some(found) = &e.found {
            let mut found = found.clone();
            found["round"] = json!(e.round);
            let _ = run
                .compare_set(
                    &incidents::found_key(e.round),
                    b"",
                    found.to_string().as_bytes(),
                )
                .await;
        }
    }

    /// This node's entry in round `round` (formed here at `formed_ms`, workers running at
    /// `running_ms`), but for its first step.
    pub fn entry(&self, formed_ms: u64, running_ms: u64) -> Value {
        let mut entry = json!({"formed_ms": formed_ms, "running_ms": running_ms,
            "started_ms": self.started_ms});
        if let Some(e) = &self.last {
            entry["previous"] = json!({"round": e.round, "kind": e.kind, "why": e.why,
                "at_ms": e.at_ms, "found": e.found, "members": e.members.as_deref()});
        }
        entry
    }
}

/// What a round's end was, as this node saw it: its kind and why.
pub(super) fn seen(outcome: &super::Outcome) -> (&'static str, String) {
    use super::{Event, Outcome};
    use crate::agent::source::Stop;
    match outcome {
        Outcome::Succeeded => ("succeeded", String::new()),
        Outcome::Failed => ("crash", "a worker failed".into()),
        Outcome::Event(Event::Hung(h)) => ("hang", h.describe()),
        Outcome::Event(Event::PeerHung(what)) => ("hang", what.what.clone()),
        Outcome::Event(Event::Unhealthy(why)) => ("health", why.0.clone()),
        Outcome::Event(Event::Stop(Stop::Changed(why))) if why.contains("waiting") => {
            ("admitted", why.clone())
        }
        Outcome::Event(Event::Stop(Stop::Changed(why))) => ("lost", why.clone()),
        Outcome::Event(Event::Stop(Stop::Drained)) => ("drained", "drained".into()),
        Outcome::Event(Event::Stop(_)) => ("stopped", String::new()),
    }
}

/// In a running round: waits for every worker of this node to step, reports it, and, as the
/// last node to report, writes the record. Never resolves (it runs beside the round's
/// watch, which ends it with the round).
pub(super) async fn report<S: Source>(
    source: &S,
    round: &Round,
    workers: &[Watched],
    mut entry: Value,
    record: &Recorder,
) -> super::Event {
    entry["stepping_ms"] = json!(stepped(workers).await);
    let entries = match source.shared(round) {
        Some(store) => gather(store, round, &entry).await,
        None => Some(vec![entry]),
    };
    if let (Some(entries), Some(run)) = (entries, source.run_store().await) {
        if let Err(e) = write(&run, source, round, &entries, record).await {
            crate::output::debug(format_args!("incident record not written: {}", e.message()));
        }
    }
    std::future::pending().await
}

/// When every worker of this node had stepped: its first heartbeat after this round began
/// (kept workers, `--in-process-restart`, beat on from their count at the round's start).
/// None when one sent none within `NO_STEP_WAIT`, or at once when the workers have no pages.
pub(super) async fn stepped(workers: &[Watched]) -> Option<u64> {
    // No pages (no monitor reads them, no events recorded): no step will show.
    if workers.iter().all(|w| w.reader.is_none()) {
        return None;
    }
    let beats = |w: &Watched| match w.read() {
        Read::Page(s) => Some((s.beats, s.since_beat)),
        _ => None,
    };
    let baseline: Vec<u64> = workers
        .iter()
        .map(|w| beats(w).map_or(0, |(b, _)| b))
        .collect();
    let mut first: Vec<Option<u64>> = vec![None; workers.len()];
    let deadline = tokio::time::Instant::now() + NO_STEP_WAIT;
    let mut read_before = wall_ms();
    while first.iter().any(Option::is_none) {
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(STEP_POLL).await;
        let now = wall_ms();
        for (i, w) in workers.iter().enumerate() {
            if first[i].is_some() {
                continue;
            }
            if let Some((b, since)) = beats(w).filter(|(b, _)| *b > baseline[i]) {
                // One beat since the last read: its time is exact; more: the read before.
                first[i] = Some(match (b == baseline[i] + 1, since) {
                    (true, Some(ago)) => now.saturating_sub(ago.as_millis() as u64),
                    _ => read_before,
                });
            }
        }
        read_before = now;
    }
    first.into_iter().flatten().max().or(Some(read_before))
}

/// Puts this node's entry in the round's store; returns every node's when this node is the
/// last to report.
async fn gather(store: &Store, round: &Round, entry: &Value) -> Option<Vec<Value>> {
    let key = format!("incident/entry/{}", round.group_rank);
    store.set(&key, entry.to_string().as_bytes()).await.ok()?;
    let reported = store.add("incident/reported", 1).await.ok()?;
    if reported != i64::from(round.group_world_size) {
        return None;
    }
    let keys: Vec<String> = (0..round.group_world_size)
        .map(|rank| format!("incident/entry/{rank}"))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = store
        .multi_get(&keys, Some(Duration::from_secs(5)))
        .await
        .ok()?;
    Some(
        values
            .iter()
            .filter_map(|v| serde_json::from_slice(v).ok())
            .collect(),
    )
}

/// The record of the previous round's end, from every node's entry of this round, and the
/// ledger after it.
async fn write<S: Source>(
    run: &Store,
    source: &S,
    round: &Round,
    entries: &[Value],
    record: &Recorder,
) -> rdzv::Result<()> {
    let most = |name: &str| entries.iter().filter_map(|e| e[name].as_u64()).max();
    let every_stepped = entries.iter().all(|e| e["stepping_ms"].is_u64());
    let stepping = most("stepping_ms").filter(|_| every_stepped);
    let from = stepping.or(most("running_ms")).unwrap_or_else(wall_ms);
    let now = json!({"round": round.number, "from_ms": from, "stepping": stepping.is_some()});
    let previous: Vec<&Value> = entries
        .iter()
        .map(|e| &e["previous"])
        .filter(|p| p.is_object())
        .collect();
    // The ledger starts with the first record written (the first round's, unless that round
    // ended before every node reported).
    let began = entries
        .iter()
        .filter_map(|e| e["started_ms"].as_u64())
        .min();
    let began = began.unwrap_or(from).to_string();
    run.compare_set(incidents::BEGAN, b"", began.as_bytes())
        .await?;
    let Some(ended) = previous.iter().filter_map(|p| p["round"].as_u64()).max() else {
        return run.set(incidents::NOW, now.to_string().as_bytes()).await;
    };
    let seen: Vec<&&Value> = previous.iter().filter(|p| p["round"] == ended).collect();
    // The first-hand view: a node's entry, a departed node's note, an eviction's note; else
    // the earliest node's view of the change.
    let mut found = seen
        .iter()
        .map(|p| &p["found"])
        .find(|f| f.is_object())
        .cloned();
    if found.is_none() {
        found = read_json(run, &incidents::found_key(ended)).await;
    }
    if found.is_none() {
        found = eviction(run, source, &seen).await;
    }
    let earliest = seen
        .iter()
        .min_by_key(|p| p["at_ms"].as_u64().unwrap_or(u64::MAX));
    let mut rec = found.unwrap_or_else(|| {
        let p = earliest.expect("one node saw the round end");
        json!({"kind": p["kind"], "why": p["why"], "detected_ms": p["at_ms"],
            "decided_ms": p["at_ms"]})
    });
    rec["round"] = json!(ended);
    rec["next_round"] = json!(round.number);
    rec["reformed_ms"] = json!(most("formed_ms"));
    rec["running_ms"] = json!(most("running_ms"));
    rec["stepping_ms"] = json!(stepping);
    let rec = incidents::with_durations(rec);
    // The ledger's counters first, then the record with the ledger's `now` in one write: a
    // reader that sees the record sees the ledger after it.
    let end = rec["fault_ms"].as_u64().or(rec["detected_ms"].as_u64());
    if let (Some(last), Some(end)) = (read_json(run, incidents::NOW).await, end) {
        // The ended round trained from its `now` to the fault.
        if let (Some(r), Some(from)) = (last["round"].as_u64(), last["from_ms"].as_u64()) {
            if r == ended && end > from {
                run.add(incidents::TRAINED, (end - from) as i64).await?;
            }
        }
    }
    run.add(incidents::COUNT, 1).await?;
    let (key, now) = (incidents::record_key(ended), now.to_string());
    let (text, keys) = (rec.to_string(), [key.as_str(), incidents::NOW]);
    run.multi_set(&keys, &[text.as_bytes(), now.as_bytes()])
        .await?;
    let _ = run.delete_key(&incidents::found_key(ended)).await;
    if ended >= incidents::KEPT {
        let _ = run
            .delete_key(&incidents::record_key(ended - incidents::KEPT))
            .await;
    }
    record.event("rdzv.incident", EventSource::Agent, rec);
    Ok(())
}

/// A key of the run's store as JSON, if it is there.
async fn read_json(run: &Store, key: &str) -> Option<Value> {
    if !run.check(&[key]).await.ok()? {
        return None;
    }
    let got = run
        .multi_get(&[key], Some(Duration::from_secs(2)))
        .await
        .ok()?;
    serde_json::from_slice(got.first()?).ok()
}

/// The peer watch's note of a member of the ended round evicted in it (`notes/evicted/`).
async fn eviction<S: Source>(run: &Store, source: &S, seen: &[&&Value]) -> Option<Value> {
    let before: Vec<String> = seen.iter().find_map(|p| p["members"].as_array()).map(|m| {
        m.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    })?;
    let now = source.members().await.unwrap_or_default();
    let round = seen.first()?["round"].as_u64()?;
    for gone in before.iter().filter(|m| !now.contains(m)).take(16) {
        let Some(note) = read_json(run, &format!("notes/evicted/{gone}")).await else {
            continue;
        };
        if note["round"].as_u64() != Some(round) {
            continue;
        }
        return Some(json!({"kind": "lost", "why": note["why"], "node": gone,
            "evicted_by": note["by"], "fault_ms": note["answered_ms"],
            "detected_ms": note["suspected_ms"], "decided_ms": note["evicted_ms"]}));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_finding_of_a_rounds_end_stays_and_travels_in_the_next_entry() {
        let mut log = Log::new();
        log.ended(3, "hang", "rank 1 made no progress");
        let seen_at = log.ended_ms(3);
        let hang = Found {
            rank: Some(1),
            suspect: Some(1),
            fault_ms: Some(seen_at - 2000),
            ..Found::of("hang", "rank 1 made no progress".into())
        };
        log.found(3, "h/n1", hang);
        // The hang is then charged as a failure: the hang's finding stays.
        log.found(3, "h/n1", Found::crash(1, "rank 1 failed"));
        let entry = log.entry(10, 20);
        let p = &entry["previous"];
        assert_eq!(
            (p["round"].as_u64(), p["kind"].as_str()),
            (Some(3), Some("hang"))
        );
        let f = &p["found"];
        assert_eq!(f["kind"], "hang");
        assert_eq!(f["fault_ms"].as_u64(), Some(seen_at - 2000));
        assert_eq!(f["detected_ms"].as_u64(), Some(seen_at));
        assert!(f["decided_ms"].as_u64().unwrap() >= seen_at);
        assert_eq!(
            (entry["formed_ms"].as_u64(), entry["running_ms"].as_u64()),
            (Some(10), Some(20))
        );
    }

    #[test]
    fn a_failure_a_loss_explained_is_recorded_as_the_loss() {
        let mut log = Log::new();
        log.ended(5, "crash", "a worker failed");
        log.lost("1 member(s) of the round lost or leaving");
        let entry = log.entry(0, 0);
        assert_eq!(entry["previous"]["kind"], "lost");
        assert!(entry["previous"]["found"].is_null());
        // A second end of the same round (seen again) keeps the first time.
        let first = log.ended_ms(5);
        log.ended(5, "lost", "again");
        assert_eq!(log.ended_ms(5), first);
    }
}
