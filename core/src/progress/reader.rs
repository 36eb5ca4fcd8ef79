//! The launcher's side: a worker's page read with `pread`, and what it says now.
//!
//! The page is the worker's memory: the launcher never maps it. A mapped file that its owner
//! truncates faults every reader (SIGBUS), and a worker must not be able to crash its
//! launcher. A read copies the page; two reads in a row that agree byte for byte are a
//! consistent copy (no word torn by a store in the middle of the copy). What the copy says is
//! checked before it is believed: a page whose magic, version or clock readings cannot be
//! right is `Damaged`, with the reason, and the monitor says so (`rdzv run` then holds the
//! worker to its hang timeout from the last progress it could read).

use super::layout;
use super::monotonic_ns;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// A worker's page, open for reading.
pub struct Reader {
    file: std::fs::File,
    /// The last consistent snapshot, for a page that changes faster than it can be copied.
    last: Mutex<Option<Snapshot>>,
}

/// What a read of a page found.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// The worker has not mapped its page yet (no call into rdzv's progress API so far).
    NotYet,
    Page(Snapshot),
    /// The page holds what no worker writes: why, for the launcher's warning.
    Damaged(String),
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
    /// Since the worker paused monitoring (`pause`), while it is paused.
    pub paused_for: Option<Duration>,
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

/// A clock reading this far ahead of the reader's clock cannot have been written by a worker
/// on the same machine (the two share `CLOCK_MONOTONIC`).
const AHEAD: u64 = 1_000_000_000;

/// Copies of the page taken before giving up on two that agree.
const COPIES: usize = 8;

type Page = [u8; layout::PAGE_BYTES];

impl Reader {
    /// Opens the page at `path` (made by `create_page`). The file stays open: a worker that
    /// unlinks or replaces it changes nothing for the reader.
    pub fn open(path: &Path) -> std::io::Result<Reader> {
        Ok(Reader {
            file: std::fs::File::open(path)?,
            last: Mutex::new(None),
        })
    }

    /// The page now, when it can be believed (`read`).
    pub fn snapshot(&self) -> Option<Snapshot> {
        match self.read() {
            Read::Page(s) => Some(s),
            Read::NotYet | Read::Damaged(_) => None,
        }
    }

    /// Reads the page and checks what it says.
    pub fn read(&self) -> Read {
        let mut before: Box<Page> = Box::new([0; layout::PAGE_BYTES]);
        let mut now: Box<Page> = Box::new([0; layout::PAGE_BYTES]);
        if let Err(why) = self.copy(&mut before) {
            return Read::Damaged(why);
        }
        let mut agreed = false;
        for _ in 0..COPIES {
            if let Err(why) = self.copy(&mut now) {
                return Read::Damaged(why);
            }
            agreed = now == before;
            // An odd sequence number: the open section is being written (or its writer
            // stopped in the middle): copy again.
            if agreed && word(&now, layout::OPEN_SEQ_AT).is_multiple_of(2) {
                let read = parse(&now, monotonic_ns());
                if let Read::Page(s) = &read {
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.clone());
                }
                return read;
            }
            std::mem::swap(&mut now, &mut before);
        }
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if agreed {
            // Steady, but stopped in the middle of naming a section: everything but the open
            // section is as the page says (a stopped worker stays silent), that one as before.
            return match parse(&before, monotonic_ns()) {
                Read::Page(mut s) => {
                    s.open = last.and_then(|l| l.open);
                    Read::Page(s)
                }
                other => other,
            };
        }
        // Changing under every copy: the worker is making progress right now.
        match last {
            Some(mut s) => {
                s.since_event = Some(Duration::ZERO);
                s.paused_for = None;
                Read::Page(s)
            }
            None => Read::NotYet,
        }
    }

    /// One copy of the whole page; an error says why there is none.
    fn copy(&self, into: &mut Page) -> Result<(), String> {
        let mut got = 0;
        while got < into.len() {
            match self.file.read_at(&mut into[got..], got as u64) {
                Ok(0) => {
                    return Err(format!(
                        "the page is {got} bytes, a progress page has {} (something truncated it)",
                        layout::PAGE_BYTES
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("the page cannot be read: {e}")),
            }
        }
        Ok(())
    }
}

fn word(page: &Page, at: usize) -> u64 {
    u64::from_ne_bytes(page[at..at + 8].try_into().expect("8 bytes"))
}

/// What a consistent copy of a page says, read at `now` (`CLOCK_MONOTONIC` ns).
fn parse(page: &Page, now: u64) -> Read {
    let magic = word(page, layout::MAGIC_AT);
    let beats = word(page, layout::BEATS_AT);
    let last_event = word(page, layout::LAST_EVENT_AT);
    if magic == 0 {
        // The writer stores the magic last when it maps the page: zero before that.
        return match beats == 0 && last_event == 0 {
            true => Read::NotYet,
            false => Read::Damaged("its magic number was overwritten with zeros".into()),
        };
    }
    if magic != layout::MAGIC {
        return Read::Damaged(format!("its magic number is {magic:#018x}, not RDZVPRG1's"));
    }
    let version_pid = word(page, layout::VERSION_PID_AT);
    if version_pid as u32 != layout::VERSION {
        return Read::Damaged(format!(
            "its layout version is {}, this launcher reads version {}",
            version_pid as u32,
            layout::VERSION
        ));
    }
    // Clock readings: none after now, no duration longer than the clock has run.
    let at = |name: &str, offset: usize| -> Result<Option<Duration>, String> {
        match word(page, offset) {
            0 => Ok(None),
            t if t > now.saturating_add(AHEAD) => Err(format!(
                "its {name} is {:.0} s ahead of the clock",
                (t - now) as f64 / 1e9
            )),
            t => Ok(Some(Duration::from_nanos(now.saturating_sub(t)))),
        }
    };
    let span = |name: &str, ns: u64| -> Result<Duration, String> {
        match ns > now {
            true => Err(format!(
                "its {name} is {:.0} s, longer than the machine has been up",
                ns as f64 / 1e9
            )),
            false => Ok(Duration::from_nanos(ns)),
        }
    };
    let checked = || -> Result<Snapshot, String> {
        let stack_signal = word(page, layout::STACK_SIGNAL_AT);
        if stack_signal > 64 {
            return Err(format!("its stack signal is {stack_signal}"));
        }
        let max_interval = match word(page, layout::MAX_INTERVAL_AT) {
            0 => None,
            ns => Some(span("longest heartbeat interval", ns)?),
        };
        let mut sections = Vec::new();
        for slot in 0..layout::SECTIONS {
            let base = layout::SECTIONS_AT + slot * layout::SECTION_BYTES;
            let count = word(page, base + layout::SECTION_COUNT_OFF);
            if count == 0 {
                break;
            }
            sections.push(SectionStats {
                name: layout::name_of(&page[base..base + layout::SECTION_NAME_BYTES]),
                count,
                max: span(
                    "longest section",
                    word(page, base + layout::SECTION_MAX_OFF),
                )?,
                // A running total may exceed the uptime only when a page is damaged; it is
                // shown, never used for a timeout.
                total: Duration::from_nanos(word(page, base + layout::SECTION_TOTAL_OFF)),
            });
        }
        let depth = word(page, layout::OPEN_DEPTH_AT);
        let open = match depth {
            0 => None,
            depth => Some(Section {
                name: layout::name_of(
                    &page[layout::OPEN_NAME_AT..layout::OPEN_NAME_AT + layout::NAME_BYTES],
                ),
                open_for: at("open section's start", layout::OPEN_STARTED_AT)?.unwrap_or_default(),
                depth: u32::try_from(depth).unwrap_or(u32::MAX),
            }),
        };
        let step = word(page, layout::STEP_AT);
        Ok(Snapshot {
            pid: (version_pid >> 32) as u32,
            beats,
            step: step.checked_sub(1),
            since_beat: at("last heartbeat", layout::LAST_BEAT_AT)?,
            since_event: at("last progress", layout::LAST_EVENT_AT)?,
            max_interval,
            open,
            paused_for: at("pause", layout::PAUSED_AT)?,
            stack_signal: stack_signal as i32,
            sections,
        })
    };
    match checked() {
        Ok(s) => Read::Page(s),
        Err(why) => Read::Damaged(why),
    }
}
