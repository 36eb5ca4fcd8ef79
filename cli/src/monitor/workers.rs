//! A group's workers as the monitors see them: each one's progress page, mapped read-only, and
//! what it says in a form other nodes can read (wall-clock times, for comparing across nodes).

use crate::workers::env::progress_files;
use crate::workers::Group;
use rdzv::progress::{reader::Reader, Snapshot};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// One worker of the group, and its page.
pub struct Watched {
    pub global_rank: u32,
    pub local_rank: u32,
    pub pid: u32,
    pub started: Instant,
    pub reader: Option<Reader>,
    pub stacks: PathBuf,
    pub error_file: PathBuf,
    /// Set once the worker has exited: nothing to watch any more.
    pub exited: Arc<AtomicBool>,
}

/// The group's workers, their pages mapped (a page that cannot be mapped is not watched).
pub fn watch(group: &Group) -> Vec<Watched> {
    group
        .workers
        .iter()
        .map(|w| {
            let (page, stacks) = progress_files(&w.error_file);
            Watched {
                global_rank: w.ranks.global_rank,
                local_rank: w.ranks.local_rank,
                pid: w.pid,
                started: Instant::now(),
                reader: Reader::open(&page).ok(),
                stacks,
                error_file: w.error_file.clone(),
                exited: w.exited.clone(),
            }
        })
        .collect()
}

impl Watched {
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.reader.as_ref()?.snapshot()
    }

    pub fn has_exited(&self) -> bool {
        self.exited.load(Ordering::Relaxed)
    }

    /// What this worker's page says, for other nodes and the report: its last progress as
    /// wall-clock milliseconds since the epoch, so that nodes can compare. A worker that has
    /// exited (`ended`) is neither suspect nor victim.
    pub fn progress(&self, host: &str) -> Value {
        let ended = self.has_exited();
        let s = self.snapshot();
        let now = SystemTime::now();
        let wall = |ago: Duration| {
            now.checked_sub(ago)
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
        };
        json!({
            "rank": self.global_rank,
            "ended": ended,
            "local_rank": self.local_rank,
            "host": host,
            "pid": self.pid,
            "beats": s.as_ref().map_or(0, |s| s.beats),
            "step": s.as_ref().and_then(|s| s.step),
            "last_progress_ms": s.as_ref().and_then(|s| s.since_event).and_then(wall),
            "silent_s": s.as_ref().and_then(|s| s.since_event).map(|d| d.as_secs_f64()),
            "section": s.as_ref().and_then(|s| s.open.as_ref()).map(|o| o.name.clone()),
            "section_open_s": s.as_ref().and_then(|s| s.open.as_ref()).map(|o| o.open_for.as_secs_f64()),
        })
    }
}
