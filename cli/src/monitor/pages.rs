//! A group's workers as the monitors see them: each one's progress page, mapped read-only, and
//! what it says in a form other nodes can read (wall-clock times, for comparing across nodes).

use super::verdict::WorkerProgress;
use crate::output::say;
use crate::workers::env::progress_files;
use crate::workers::Group;
use rdzv::progress::{reader::Reader, Read, Snapshot};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    /// When its page last showed progress (or when it started): where a damaged page's
    /// silence is counted from.
    last_progress: Mutex<Instant>,
    /// The page was found damaged (and that was said).
    damaged: AtomicBool,
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
                last_progress: Mutex::new(Instant::now()),
                damaged: AtomicBool::new(false),
            }
        })
        .collect()
}

impl Watched {
    /// What the page says now, when it can be believed.
    pub fn snapshot(&self) -> Option<Snapshot> {
        match self.read() {
            Read::Page(s) => Some(s),
            Read::NotYet | Read::Damaged(_) => None,
        }
    }

    /// Reads the page: remembers when it last showed progress, and says once when it is
    /// damaged (the hang monitor then counts silence from that last progress: `silent_since`).
    pub fn read(&self) -> Read {
        let Some(reader) = &self.reader else {
            return Read::NotYet;
        };
        let mut read = reader.read();
        match &mut read {
            Read::Page(s) => {
                // A worker kept in its process for this round (`--in-process-restart`) shows
                // the last round's progress: that is none in this one, so it is watched as a
                // new worker is, from its first heartbeat here (its process group's init can
                // wait longer than the hang timeout for a peer that starts again).
                if s.since_event.is_some_and(|ago| ago > self.started.elapsed()) {
                    s.since_event = None;
                    s.since_beat = None;
                }
                if let Some(ago) = s.since_event {
                    let at = Instant::now().checked_sub(ago).unwrap_or(self.started);
                    let mut last = self.last_progress.lock().unwrap_or_else(|e| e.into_inner());
                    *last = (*last).max(at);
                }
            }
            Read::Damaged(why) if !self.damaged.swap(true, Ordering::Relaxed) => say(format_args!(
                "warning: rank {} (local rank {}, pid {}): its progress page is damaged ({why}); it is held to the hang timeout from its last progress seen",
                self.global_rank, self.local_rank, self.pid
            )),
            _ => {}
        }
        read
    }

    /// How long since the page last showed progress (since the worker started, if never).
    pub fn silent_since(&self) -> Duration {
        self.last_progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    pub fn has_exited(&self) -> bool {
        self.exited.load(Ordering::Relaxed)
    }

    /// What this worker's page says, for other nodes and the report: its last progress as
    /// wall-clock milliseconds since the epoch, so that nodes can compare, and the kernel's
    /// view of the process (a stopped one is evidence).
    pub fn progress(&self, host: &str) -> WorkerProgress {
        let s = self.snapshot();
        let now = SystemTime::now();
        let wall = |ago: Duration| {
            now.checked_sub(ago)
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
        };
        let open = s.as_ref().and_then(|s| s.open.as_ref());
        WorkerProgress {
            rank: self.global_rank,
            local_rank: self.local_rank,
            host: host.to_string(),
            pid: self.pid,
            ended: self.has_exited(),
            beats: s.as_ref().map_or(0, |s| s.beats),
            step: s.as_ref().and_then(|s| s.step),
            last_progress_ms: s.as_ref().and_then(|s| s.since_event).and_then(wall),
            silent_s: s
                .as_ref()
                .and_then(|s| s.since_event)
                .map(|d| d.as_secs_f64()),
            section: open.map(|o| o.name.clone()),
            section_open_s: open.map(|o| o.open_for.as_secs_f64()),
            state: process_state(self.pid),
        }
    }
}

/// The state letter of process `pid` (`R`, `S`, `D`, `T` stopped, `Z`, ...), as the kernel
/// shows it; None when the process is gone.
pub fn process_state(pid: u32) -> Option<char> {
    state_letter(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter in a `/proc/.../stat` line: after the name in parentheses, which may
/// hold spaces.
pub fn state_letter(stat: &str) -> Option<char> {
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .and_then(|s| s.chars().next())
}
