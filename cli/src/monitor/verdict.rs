//! Suspect versus victims: when one rank hangs, its peers soon block in a collective and stop
//! making progress too, so the first rank to time out is not necessarily the cause.
//!
//! Every launcher shares what its workers' pages say (`WorkerProgress`, through the round's
//! store), and the launcher that found the hang names the suspect from all of them, with the
//! strongest evidence first (`verdict`):
//! 1. a worker the kernel shows stopped (state `T`: SIGSTOP, a debugger) cannot make progress
//!    and is the cause of the others' wait;
//! 2. when the ranks mark their collectives as sections, the ranks wait in the section most
//!    of them are in; a rank outside it is the one they wait for;
//! 3. otherwise, the rank whose last progress is the oldest. Ranks that stopped in the same
//!    step are then told apart only by milliseconds: the verdict says it is uncertain when
//!    others stopped within `ALIKE` of the suspect in the same place.
//!
//! Comparing last progress across nodes relies on their clocks agreeing to well under a step
//! (NTP does); rules 1 and 2 need no clock.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Ranks that stopped within this of the suspect, in the same section, make a verdict by time
/// uncertain.
const ALIKE: Duration = Duration::from_millis(100);

/// One worker's progress as its launcher shares it with the others: the wire record of the
/// hang protocol (`PROGRESS/{node rank}` holds a list of them).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkerProgress {
    pub rank: u32,
    pub local_rank: u32,
    pub host: String,
    pub pid: u32,
    /// The worker has exited: neither suspect nor victim.
    pub ended: bool,
    pub beats: u64,
    pub step: Option<u64>,
    /// Its last progress, wall-clock milliseconds since the epoch (None: never).
    pub last_progress_ms: Option<u64>,
    /// How long it has made no progress, when its launcher looked.
    pub silent_s: Option<f64>,
    /// The innermost open section, and for how long.
    pub section: Option<String>,
    pub section_open_s: Option<f64>,
    /// The process's state as the kernel shows it (`R`, `S`, `D`, `T`, ...).
    pub state: Option<char>,
}

impl WorkerProgress {
    pub fn to_json(&self) -> Value {
        json!({
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "pid": self.pid,
            "ended": self.ended,
            "beats": self.beats,
            "step": self.step,
            "last_progress_ms": self.last_progress_ms,
            "silent_s": self.silent_s,
            "section": self.section,
            "section_open_s": self.section_open_s,
            "state": self.state.map(String::from),
        })
    }

    /// None for a record that lacks its rank (written by something else).
    pub fn from_json(v: &Value) -> Option<WorkerProgress> {
        let u32_of = |k: &str| v[k].as_u64().and_then(|n| u32::try_from(n).ok());
        Some(WorkerProgress {
            rank: u32_of("rank")?,
            local_rank: u32_of("local_rank").unwrap_or(0),
            host: v["host"].as_str().unwrap_or("?").to_string(),
            pid: u32_of("pid").unwrap_or(0),
            ended: v["ended"].as_bool().unwrap_or(false),
            beats: v["beats"].as_u64().unwrap_or(0),
            step: v["step"].as_u64(),
            last_progress_ms: v["last_progress_ms"].as_u64(),
            silent_s: v["silent_s"].as_f64(),
            section: v["section"].as_str().map(str::to_string),
            section_open_s: v["section_open_s"].as_f64(),
            state: v["state"].as_str().and_then(|s| s.chars().next()),
        })
    }

    /// A list of records, as one launcher publishes them.
    pub fn list_to_bytes(all: &[WorkerProgress]) -> Vec<u8> {
        Value::from(all.iter().map(Self::to_json).collect::<Vec<_>>())
            .to_string()
            .into_bytes()
    }

    pub fn list_from_bytes(bytes: &[u8]) -> Vec<WorkerProgress> {
        match serde_json::from_slice(bytes) {
            Ok(Value::Array(all)) => all.iter().filter_map(Self::from_json).collect(),
            _ => Vec::new(),
        }
    }

    fn stopped(&self) -> bool {
        matches!(self.state, Some('T' | 't'))
    }

    fn who(&self) -> String {
        format!(
            "rank {} (local rank {} on {})",
            self.rank, self.local_rank, self.host
        )
    }

    fn place(&self) -> String {
        match &self.section {
            Some(s) => format!("in section {s:?}"),
            None => "outside any section".to_string(),
        }
    }
}

/// What names the suspect.
#[derive(Debug, Clone, PartialEq)]
pub enum Because {
    /// The kernel shows it stopped.
    Stopped,
    /// The others wait in this section, and it is not in it.
    NotIn { section: String, waiting: usize },
    /// Its last progress is the oldest (uncertain when `alike` is not empty).
    Oldest { alike: Vec<u32> },
}

/// The suspect and its victims, from every node's workers' progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub suspect: WorkerProgress,
    pub because: Because,
    /// The others, each with how long after the suspect it stopped (zero when it stopped
    /// first: by rules 1 and 2 a victim may have stopped before the suspect did).
    pub victims: Vec<(WorkerProgress, Duration)>,
}

/// Names the suspect among the workers that reported progress and had not exited (module
/// comment); None when none did.
pub fn verdict(all: &[WorkerProgress]) -> Option<Verdict> {
    let mut seen: Vec<&WorkerProgress> = all
        .iter()
        .filter(|w| w.last_progress_ms.is_some() && !w.ended)
        .collect();
    // Oldest progress first, then the lowest rank: each rule picks the first that fits.
    seen.sort_by_key(|w| (w.last_progress_ms, w.rank));
    let first = *seen.first()?;
    let (suspect, because) = if let Some(stopped) = seen.iter().find(|w| w.stopped()) {
        (*stopped, Because::Stopped)
    } else if let Some((section, waiting, outside)) = waited_in(&seen) {
        (outside, Because::NotIn { section, waiting })
    } else {
        let at = first.last_progress_ms.unwrap_or(0);
        let alike: Vec<u32> = seen[1..]
            .iter()
            .filter(|w| {
                w.last_progress_ms.unwrap_or(at) - at < ALIKE.as_millis() as u64
                    && w.section == first.section
            })
            .map(|w| w.rank)
            .collect();
        (first, Because::Oldest { alike })
    };
    let at = suspect.last_progress_ms.unwrap_or(0);
    let victims = seen
        .iter()
        .filter(|w| w.rank != suspect.rank)
        .map(|w| {
            let after = w.last_progress_ms.unwrap_or(at).saturating_sub(at);
            ((*w).clone(), Duration::from_millis(after))
        })
        .collect();
    Some(Verdict {
        suspect: suspect.clone(),
        because,
        victims,
    })
}

/// The section most ranks wait in, how many do, and the rank outside it that stopped first:
/// only when one section holds more ranks than any other and some rank is outside it.
fn waited_in<'a>(seen: &[&'a WorkerProgress]) -> Option<(String, usize, &'a WorkerProgress)> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for w in seen {
        if let Some(s) = &w.section {
            *counts.entry(s.as_str()).or_default() += 1;
        }
    }
    let most = *counts.values().max()?;
    let mut tops = counts.iter().filter(|(_, n)| **n == most);
    let (section, _) = tops.next()?;
    if tops.next().is_some() {
        return None;
    }
    let outside = seen
        .iter()
        .find(|w| w.section.as_deref() != Some(*section))?;
    Some((section.to_string(), most, outside))
}

impl Verdict {
    /// Whether the rules could not tell the suspect from other ranks.
    pub fn uncertain(&self) -> bool {
        matches!(&self.because, Because::Oldest { alike } if !alike.is_empty())
    }

    /// The report's lines: the suspect and why, then the victims grouped by section.
    pub fn lines(&self) -> Vec<String> {
        let s = &self.suspect;
        let why = match &self.because {
            Because::Stopped => format!(
                "the kernel shows it stopped (state {}: a signal or a debugger stopped it)",
                s.state.unwrap_or('T')
            ),
            Because::NotIn { section, waiting } => format!(
                "it is not in section {section:?}, where {waiting} rank(s) wait"
            ),
            Because::Oldest { alike } if alike.is_empty() => "it stopped first".to_string(),
            Because::Oldest { alike } => format!(
                "it stopped first, but uncertain: rank(s) {} stopped within {:.1} s of it in the same place; marking collectives with rdzv sections tells them apart",
                compress(alike),
                ALIKE.as_secs_f64()
            ),
        };
        let mut lines = vec![format!(
            "suspect: {} {}, {:.1} s without progress{}: {why}",
            s.who(),
            s.place(),
            s.silent_s.unwrap_or(0.0),
            s.step.map(|n| format!(", at step {n}")).unwrap_or_default(),
        )];
        let mut by_place: BTreeMap<String, Vec<(u32, Duration)>> = BTreeMap::new();
        for (w, after) in &self.victims {
            by_place
                .entry(w.place())
                .or_default()
                .push((w.rank, *after));
        }
        for (place, ranks) in by_place {
            let latest = ranks.iter().map(|(_, a)| *a).max().unwrap_or_default();
            let mut ranks: Vec<u32> = ranks.into_iter().map(|(r, _)| r).collect();
            ranks.sort_unstable();
            lines.push(format!(
                "waiting on it: rank(s) {} {place}, stopped up to {:.1} s later",
                compress(&ranks),
                latest.as_secs_f64()
            ));
        }
        lines
    }

    pub fn to_json(&self) -> Value {
        let because = match &self.because {
            Because::Stopped => json!({"rule": "stopped"}),
            Because::NotIn { section, waiting } => {
                json!({"rule": "not_in_section", "section": section, "waiting": waiting})
            }
            Because::Oldest { alike } => json!({"rule": "oldest_progress", "alike": alike}),
        };
        json!({
            "suspect": self.suspect.to_json(),
            "because": because,
            "uncertain": self.uncertain(),
            "victims": self.victims.iter().map(|(w, after)| {
                let mut w = w.to_json();
                w["stopped_after_suspect_s"] = json!(after.as_secs_f64());
                w
            }).collect::<Vec<_>>(),
        })
    }
}

/// 0,1,2,5 → "0-2,5".
pub fn compress(ranks: &[u32]) -> String {
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
mod tests {
    use super::*;

    fn w(rank: u32, last: u64, section: Option<&str>, state: char) -> WorkerProgress {
        WorkerProgress {
            rank,
            local_rank: rank % 2,
            host: format!("h{}", rank / 2),
            last_progress_ms: Some(last),
            section: section.map(str::to_string),
            state: Some(state),
            ..WorkerProgress::default()
        }
    }

    #[test]
    fn a_stopped_rank_is_the_suspect_whenever_it_stopped() {
        // Rank 3 was SIGSTOPped a millisecond after rank 0's last progress.
        let all = [
            w(0, 1000, None, 'S'),
            w(1, 1002, None, 'S'),
            w(2, 1003, None, 'S'),
            w(3, 1001, None, 'T'),
        ];
        let v = verdict(&all).unwrap();
        assert_eq!((v.suspect.rank, &v.because), (3, &Because::Stopped));
        assert_eq!(v.victims.len(), 3);
        assert!(v.victims.iter().all(|(w, _)| w.rank != 3));
        assert!(!v.uncertain());
    }

    #[test]
    fn the_rank_outside_the_section_the_others_wait_in_is_the_suspect() {
        // Rank 3 hangs outside any section; the others entered "allreduce" before its last
        // progress (so it is not the oldest) and wait there.
        let all = [
            w(0, 1000, Some("allreduce"), 'S'),
            w(1, 1001, Some("allreduce"), 'S'),
            w(2, 1002, Some("allreduce"), 'S'),
            w(3, 1005, None, 'S'),
        ];
        let v = verdict(&all).unwrap();
        assert_eq!(v.suspect.rank, 3);
        assert_eq!(
            v.because,
            Because::NotIn {
                section: "allreduce".into(),
                waiting: 3
            }
        );
        let lines = v.lines();
        assert!(
            lines[1].contains(r#"rank(s) 0-2 in section "allreduce""#),
            "{lines:?}"
        );
        // Two ranks in two sections: no majority, the oldest progress decides.
        let two = [
            w(0, 1000, Some("step"), 'S'),
            w(1, 1400, Some("allreduce"), 'S'),
        ];
        let v = verdict(&two).unwrap();
        assert_eq!((v.suspect.rank, v.uncertain()), (0, false));
    }

    #[test]
    fn with_heartbeats_alone_ranks_that_stopped_together_make_it_uncertain() {
        let all = [
            w(0, 1000, None, 'S'),
            w(1, 1030, None, 'S'),
            w(2, 1900, None, 'S'),
        ];
        let v = verdict(&all).unwrap();
        assert_eq!(v.suspect.rank, 0);
        assert_eq!(v.because, Because::Oldest { alike: vec![1] });
        assert!(v.uncertain());
        assert!(
            v.lines()[0].contains("uncertain: rank(s) 1"),
            "{:?}",
            v.lines()
        );
        assert_eq!(v.to_json()["uncertain"], true);
    }

    #[test]
    fn exited_ranks_and_foreign_records_are_left_out() {
        let mut gone = w(0, 10, None, 'S');
        gone.ended = true;
        let all = [gone, w(1, 1000, None, 'S')];
        let bytes = WorkerProgress::list_to_bytes(&all);
        let back = WorkerProgress::list_from_bytes(&bytes);
        assert_eq!(back, all);
        assert_eq!(verdict(&back).unwrap().suspect.rank, 1);
        assert!(WorkerProgress::list_from_bytes(b"[{\"no\": 1}, 3]").is_empty());
        assert!(WorkerProgress::list_from_bytes(b"garbage").is_empty());
        assert_eq!(compress(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }
}
