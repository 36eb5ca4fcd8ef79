//! The job's incident records, as `rdzv run` keeps them in the run's notes and `rdzv status`
//! reads them (`docs/EVENTS.md`, "Incidents"): one record for each round that ended for a
//! failure or a membership change, with the durations from the fault to its detection, to the
//! decision, to the next round and to every rank stepping in it, and the ledger the job's
//! effective training time comes from.
//!
//! Keys, under the run's notes (`notes/` of the run's store, bound to the run's lease):
//!
//! ```text
//! incident/round/{R:010}   the record of round R's end (the newest KEPT are kept)
//! incident/found/{R:010}   what a node that left saw of round R's end (a drain, a failed
//!                          health check), until the record is written
//! incident/began_ms        when the job began: the first node's launcher started
//! incident/count           incidents since the job began (a store counter)
//! incident/trained_ms      milliseconds in which every rank was stepping, in rounds that ended
//! incident/now             {"round": R, "from_ms": t, "stepping": bool}: since when the current
//!                          round has had every rank stepping (or its workers running, when
//!                          they send no heartbeats)
//! ```

use serde_json::{json, Value};
use std::collections::BTreeMap;

/// How many records the run keeps: the newest, as the notes are bounded.
pub const KEPT: u64 = 64;

/// The prefix of every incident key in the run's store (under the notes).
pub const PREFIX: &str = "notes/incident/";

/// The key of round `round`'s record, in the run's store.
pub fn record_key(round: u64) -> String {
    format!("{PREFIX}round/{round:010}")
}

/// The key of what a departing node saw of round `round`'s end, in the run's store.
pub fn found_key(round: u64) -> String {
    format!("{PREFIX}found/{round:010}")
}

/// The ledger's keys, in the run's store.
pub const BEGAN: &str = "notes/incident/began_ms";
pub const COUNT: &str = "notes/incident/count";
pub const TRAINED: &str = "notes/incident/trained_ms";
pub const NOW: &str = "notes/incident/now";

/// The wall clock, in milliseconds since the epoch (the unit of every time in a record: nodes
/// compare them).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Adds the durations from the fault to each later moment (`detect_ms`, `decide_ms`,
/// `reform_ms`, `first_step_ms`; from the detection where the fault's time is unknown).
pub fn with_durations(mut record: Value) -> Value {
    let at = |record: &Value, name: &str| record[name].as_u64();
    let Some(from) = at(&record, "fault_ms").or(at(&record, "detected_ms")) else {
        return record;
    };
    for (moment, duration) in [
        ("detected_ms", "detect_ms"),
        ("decided_ms", "decide_ms"),
        ("reformed_ms", "reform_ms"),
        ("stepping_ms", "first_step_ms"),
    ] {
        if let Some(t) = at(&record, moment) {
            record[duration] = json!(t.saturating_sub(from));
        }
    }
    record
}

/// The job's incidents and effective training time as `rdzv status` shows them, from the
/// run's notes (without their `notes/` prefix) and its current round; `now_ms`: the time to
/// count wall time to.
pub struct Summary {
    /// Records, oldest first.
    pub records: Vec<Value>,
    /// Incidents whose record is not written yet (what a departing node saw).
    pub open: Vec<Value>,
    /// Incidents since the job began (more than `records` once old ones were dropped).
    pub count: u64,
    /// The share of wall time since the job began in which every rank was stepping, and that
    /// wall time in milliseconds; None before the first round stepped.
    pub effective: Option<(f64, u64)>,
    /// Whether the effective time counts from heartbeats (false: from workers running).
    pub from_steps: bool,
}

impl Summary {
    pub fn read(notes: &BTreeMap<String, String>, round: Option<u64>, now_ms: u64) -> Summary {
        let short = |key: &str| key.trim_start_matches("notes/").to_string();
        let under = |prefix: String| -> Vec<Value> {
            notes
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .filter_map(|(_, v)| serde_json::from_str(v).ok())
                .collect()
        };
        let number = |key: &str| {
            notes
                .get(&short(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let records = under(short(&format!("{PREFIX}round/")));
        let open = under(short(&format!("{PREFIX}found/")));
        let current: Option<Value> = notes
            .get(&short(NOW))
            .and_then(|v| serde_json::from_str(v).ok());
        let mut trained = number(TRAINED).unwrap_or(0);
        let from_steps = current
            .as_ref()
            .is_none_or(|c| c["stepping"].as_bool() == Some(true));
        if let Some(c) = &current {
            // The current round is training still: its time so far counts.
            let live = c["round"].as_u64().is_some_and(|r| Some(r) == round);
            if let (true, Some(from)) = (live, c["from_ms"].as_u64()) {
                trained += now_ms.saturating_sub(from);
            }
        }
        let effective = number(BEGAN).filter(|_| current.is_some()).map(|began| {
            let wall = now_ms.saturating_sub(began).max(1);
            ((trained as f64 / wall as f64).min(1.0), wall)
        });
        Summary {
            count: number(COUNT).unwrap_or(records.len() as u64),
            records,
            open,
            effective,
            from_steps,
        }
    }

    /// For `rdzv status --json`.
    pub fn to_json(&self) -> Value {
        json!({
            "count": self.count,
            "records": self.records,
            "open": self.open,
            "effective_training": self.effective.map(|(share, wall)| json!({
                "share": share,
                "wall_ms": wall,
                "from": if self.from_steps { "steps" } else { "workers running" },
            })),
        })
    }

    /// For `rdzv status`: a line for the count and the effective time, and one per record.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some((share, wall)) = self.effective {
            lines.push(format!(
                "training {:.1}% of {} since the job began{}",
                share * 100.0,
                span(wall),
                match self.from_steps {
                    true => "",
                    false => " (from workers running: they send no heartbeats)",
                }
            ));
        }
        if self.count > 0 {
            lines.push(format!(
                "incidents {}{}",
                self.count,
                match self.count > self.records.len() as u64 {
                    true => format!(" (the last {} kept)", self.records.len()),
                    false => String::new(),
                }
            ));
        }
        for r in &self.records {
            lines.push(format!("  {}", describe(r)));
        }
        for r in &self.open {
            lines.push(format!("  {} (no next round yet)", describe(r)));
        }
        lines
    }
}

/// One record on one line: what ended which round, where, and when each moment came.
pub fn describe(r: &Value) -> String {
    let mut what = format!(
        "round {}: {}",
        r["round"].as_u64().unwrap_or(0),
        r["kind"].as_str().unwrap_or("?")
    );
    if let Some(rank) = r["rank"].as_u64() {
        what.push_str(&format!(" of rank {rank}"));
    }
    if let Some(node) = r["node"].as_str() {
        what.push_str(&format!(" on {node}"));
    }
    if let Some(suspect) = r["suspect"].as_u64() {
        what.push_str(&format!(", suspect rank {suspect}"));
    }
    if let Some(why) = r["why"].as_str().filter(|w| !w.is_empty()) {
        what.push_str(&format!(" ({why})"));
    }
    let from = match r["fault_ms"].is_u64() {
        true => "from the fault",
        false => "from its detection",
    };
    let moments: Vec<String> = [
        ("detected", "detect_ms"),
        ("decided", "decide_ms"),
        ("round formed", "reform_ms"),
        ("every rank stepping", "first_step_ms"),
    ]
    .iter()
    .filter_map(|(name, key)| r[*key].as_u64().map(|ms| format!("{name} +{ms} ms")))
    .collect();
    match moments.is_empty() {
        true => what,
        false => format!("{what}; {from}: {}", moments.join(", ")),
    }
}

/// A wall time as hours, minutes and seconds.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{}.{} s", s, (ms % 1000) / 100),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notes(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.trim_start_matches("notes/").to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn durations_count_from_the_fault_or_else_from_the_detection() {
        let r = with_durations(json!({"fault_ms": 1000, "detected_ms": 1010,
            "decided_ms": 1050, "reformed_ms": 1300, "stepping_ms": 2000}));
        assert_eq!(
            (r["detect_ms"].as_u64(), r["decide_ms"].as_u64()),
            (Some(10), Some(50))
        );
        assert_eq!(
            (r["reform_ms"].as_u64(), r["first_step_ms"].as_u64()),
            (Some(300), Some(1000))
        );
        let lost = with_durations(json!({"detected_ms": 500, "reformed_ms": 700}));
        assert_eq!(lost["reform_ms"].as_u64(), Some(200));
        assert!(lost["first_step_ms"].is_null());
    }

    #[test]
    fn the_effective_time_counts_ended_rounds_and_the_current_one_while_it_trains() {
        // Began at 0; 6 s trained in ended rounds; the current round (3) stepping since 9 s.
        let n = notes(&[
            (BEGAN, "0".into()),
            (TRAINED, "6000".into()),
            (COUNT, "2".into()),
            (
                NOW,
                json!({"round": 3, "from_ms": 9000, "stepping": true}).to_string(),
            ),
        ]);
        let s = Summary::read(&n, Some(3), 10_000);
        assert_eq!(s.effective, Some((0.7, 10_000)));
        assert!(s.from_steps);
        // Round 3 ended and round 4 has not stepped yet: only the ended rounds count.
        let s = Summary::read(&n, Some(4), 10_000);
        assert_eq!(s.effective, Some((0.6, 10_000)));
        assert_eq!(s.count, 2);
    }

    #[test]
    fn records_are_read_oldest_first_and_said_on_a_line_each() {
        let crash = with_durations(json!({"round": 2, "kind": "crash", "rank": 1,
            "node": "h/n1", "fault_ms": 100, "detected_ms": 100, "decided_ms": 110,
            "reformed_ms": 400, "stepping_ms": 900}));
        let lost = with_durations(json!({"round": 10, "kind": "lost", "node": "h/n2",
            "detected_ms": 50, "reformed_ms": 80}));
        let n = notes(&[
            (&record_key(10), lost.to_string()),
            (&record_key(2), crash.to_string()),
            (COUNT, "70".into()),
        ]);
        let s = Summary::read(&n, Some(11), 1000);
        assert_eq!(s.records[0]["round"], 2);
        assert_eq!(s.effective, None, "no round stepped: nothing to count");
        let lines = s.lines();
        assert_eq!(lines[0], "incidents 70 (the last 2 kept)");
        assert_eq!(
            lines[1],
            "  round 2: crash of rank 1 on h/n1; from the fault: detected +0 ms, decided +10 ms, round formed +300 ms, every rank stepping +800 ms"
        );
        assert_eq!(
            lines[2],
            "  round 10: lost on h/n2; from its detection: detected +0 ms, round formed +30 ms"
        );
    }
}
