//! The launcher's side: a read-only mapping of a worker's page, and what it says now.

use super::layout::{self, Mapping};
use super::monotonic_ns;
use std::path::Path;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::time::Duration;

/// A worker's page, mapped read-only.
pub struct Reader {
    map: Mapping,
}

/// What a worker's page says at one moment. Times are "how long ago" (or how long).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The process that mapped the page.
    pub pid: u32,
    pub beats: u64,
    /// The last step a heartbeat gave, if any did.
    pub step: Option<u64>,
    /// Since the last heartbeat (None before the first).
    pub since_beat: Option<Duration>,
    /// Since the last heartbeat, section begin or section end (None before the first).
    pub since_event: Option<Duration>,
    /// The longest interval between two heartbeats after the warm-up (`WARMUP_BEATS`).
    pub max_interval: Option<Duration>,
    /// The innermost open section, and how many are open.
    pub open: Option<Section>,
    /// The signal that makes the worker write its stacks (0: none registered).
    pub stack_signal: i32,
    /// Every section that ended at least once.
    pub sections: Vec<SectionStats>,
}

/// The innermost open section.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub name: String,
    /// How long it has been open.
    pub open_for: Duration,
    /// Sections open, this one included.
    pub depth: u32,
}

/// The record of a section name: how often it ended and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct SectionStats {
    pub name: String,
    pub count: u64,
    pub max: Duration,
    pub total: Duration,
}

impl Reader {
    /// Maps the page at `path` (made by `create_page`).
    pub fn open(path: &Path) -> std::io::Result<Reader> {
        Ok(Reader {
            map: Mapping::open(path, false)?,
        })
    }

    /// The page now; None until the worker has mapped it (its first call into rdzv's progress
    /// API), or if it holds a layout this version does not know.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let map = &self.map;
        if map.word(layout::MAGIC_AT).load(Acquire) != layout::MAGIC {
            return None;
        }
        let version_pid = map.word(layout::VERSION_PID_AT).load(Relaxed);
        if version_pid as u32 != layout::VERSION {
            return None;
        }
        let now = monotonic_ns();
        let ago = |at: u64| (at != 0).then(|| Duration::from_nanos(now.saturating_sub(at)));
        let last_event = map.word(layout::LAST_EVENT_AT).load(Acquire);
        let step = map.word(layout::STEP_AT).load(Relaxed);
        let max_interval = map.word(layout::MAX_INTERVAL_AT).load(Relaxed);
        Some(Snapshot {
            pid: (version_pid >> 32) as u32,
            beats: map.word(layout::BEATS_AT).load(Relaxed),
            step: step.checked_sub(1),
            since_beat: ago(map.word(layout::LAST_BEAT_AT).load(Relaxed)),
            since_event: ago(last_event),
            max_interval: (max_interval != 0).then(|| Duration::from_nanos(max_interval)),
            open: self.open_section(now),
            stack_signal: map.word(layout::STACK_SIGNAL_AT).load(Relaxed) as i32,
            sections: self.sections(),
        })
    }

    /// The open-section fields, read under their sequence number.
    fn open_section(&self, now: u64) -> Option<Section> {
        let map = &self.map;
        let seq = map.word(layout::OPEN_SEQ_AT);
        for _ in 0..100 {
            let before = seq.load(Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let depth = map.word(layout::OPEN_DEPTH_AT).load(Relaxed);
            let started = map.word(layout::OPEN_STARTED_AT).load(Relaxed);
            let name = layout::load_name(map, layout::OPEN_NAME_AT, layout::NAME_BYTES);
            std::sync::atomic::fence(Acquire);
            if seq.load(Relaxed) != before {
                continue;
            }
            return (depth > 0).then(|| Section {
                name,
                open_for: Duration::from_nanos(now.saturating_sub(started)),
                depth: depth as u32,
            });
        }
        None
    }

    fn sections(&self) -> Vec<SectionStats> {
        let map = &self.map;
        (0..layout::SECTIONS)
            .map_while(|slot| {
                let at = layout::SECTIONS_AT + slot * layout::SECTION_BYTES;
                let count = map.word(at + layout::SECTION_COUNT_OFF).load(Acquire);
                (count > 0).then(|| SectionStats {
                    name: layout::load_name(map, at, layout::SECTION_NAME_BYTES),
                    count,
                    max: Duration::from_nanos(map.word(at + layout::SECTION_MAX_OFF).load(Relaxed)),
                    total: Duration::from_nanos(
                        map.word(at + layout::SECTION_TOTAL_OFF).load(Relaxed),
                    ),
                })
            })
            .collect()
    }
}
