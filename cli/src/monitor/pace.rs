//! Stragglers: each launcher measures its workers' pace (seconds per heartbeat over a period,
//! its slowest worker's) and leaves it as a note (`pace/HOST/NODE`) when it changed by more than a
//! fifth since the last one, at most once per `--pace-interval`. A steady job writes nothing
//! after its first notes; `rdzv status` flags the nodes much slower than the median.

use super::pages::Watched;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A node is flagged when its step takes longer than this many times the median node's.
pub const SLOW_FACTOR: f64 = 1.5;

/// How much a node's pace must change before it is written again.
const CHANGE: f64 = 0.2;

/// One node's pace, measured over periods.
pub struct Meter {
    last: Option<(Instant, Vec<u64>)>,
    published: Option<f64>,
}

impl Meter {
    pub fn new() -> Meter {
        Meter {
            last: None,
            published: None,
        }
    }

    /// Samples the workers' heartbeat counts; returns the note to write when the pace of the
    /// period since the last sample differs from the last note by more than `CHANGE`.
    pub fn sample(&mut self, workers: &[Watched]) -> Option<String> {
        let now = Instant::now();
        let beats: Vec<u64> = workers
            .iter()
            .map(|w| w.snapshot().map_or(0, |s| s.beats))
            .collect();
        let (then, before) = self.last.replace((now, beats.clone()))?;
        let period = now.duration_since(then).as_secs_f64();
        // The slowest worker that heartbeat in the period sets the node's pace; a worker that
        // had not heartbeat before the period was still starting (its imports, its first
        // collectives), which says nothing of its pace.
        let step = beats
            .iter()
            .zip(&before)
            .filter(|(now, before)| **before > 0 && now > before)
            .map(|(now, before)| period / (now - before) as f64)
            .fold(None, |slowest: Option<f64>, s| {
                Some(slowest.map_or(s, |m| m.max(s)))
            })?;
        let changed = self.published.is_none_or(|p| (step - p).abs() > p * CHANGE);
        if !changed {
            return None;
        }
        self.published = Some(step);
        Some(json!({"step_s": (step * 1e4).round() / 1e4, "workers": workers.len()}).to_string())
    }
}

/// A node flagged as slow: its launcher (`HOST/NODE`), its step and the median node's.
#[derive(Debug, PartialEq)]
pub struct Slow {
    pub host: String,
    pub step: Duration,
    pub median: Duration,
}

/// The nodes of a run's notes (`pace/HOST/NODE`) whose step is more than `SLOW_FACTOR` times the
/// median node's (the lower median, so that one slow node of two is flagged).
pub fn stragglers(notes: &BTreeMap<String, String>) -> Vec<Slow> {
    let paces: Vec<(String, f64)> = notes
        .iter()
        .filter_map(|(k, v)| {
            let host = k.strip_prefix("pace/")?;
            let v: serde_json::Value = serde_json::from_str(v).ok()?;
            Some((host.to_string(), v["step_s"].as_f64().filter(|s| *s > 0.0)?))
        })
        .collect();
    let mut sorted: Vec<f64> = paces.iter().map(|(_, s)| *s).collect();
    sorted.sort_by(f64::total_cmp);
    let Some(&median) = sorted.get(sorted.len().saturating_sub(1) / 2) else {
        return Vec::new();
    };
    paces
        .into_iter()
        .filter(|(_, s)| *s > median * SLOW_FACTOR)
        .map(|(host, s)| Slow {
            host,
            step: Duration::from_secs_f64(s),
            median: Duration::from_secs_f64(median),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_much_slower_than_the_median_are_flagged() {
        let notes = |paces: &[(&str, f64)]| -> BTreeMap<String, String> {
            let mut n: BTreeMap<String, String> = paces
                .iter()
                .map(|(h, s)| (format!("pace/{h}"), json!({"step_s": s}).to_string()))
                .collect();
            n.insert("hang".into(), "{}".into());
            n
        };
        let slow = stragglers(&notes(&[("a", 0.1), ("b", 0.11), ("c", 0.3), ("d", 0.1)]));
        assert_eq!(
            slow,
            [Slow {
                host: "c".into(),
                step: Duration::from_secs_f64(0.3),
                median: Duration::from_secs_f64(0.1)
            }]
        );
        assert_eq!(
            stragglers(&notes(&[("a", 0.1), ("b", 0.2)])).len(),
            1,
            "one of two"
        );
        assert!(stragglers(&notes(&[("a", 0.1), ("b", 0.14)])).is_empty());
        assert!(stragglers(&BTreeMap::new()).is_empty());
    }
}
