//! The worker's side: one page per process, mapped on first use from `RDZV_PROGRESS_FILE`.
//! Heartbeats are lock-free (any thread); sections take a process-wide lock, held for a few
//! stores, because nested sections are a stack.

use super::layout::{self, Mapping};
use super::{check_name, monotonic_ns, PROGRESS_FILE_ENV, WARMUP_BEATS};
use crate::{Error, Result};
use once_cell::sync::Lazy;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Mutex;

/// A mapped page and the open sections behind it. The process has one (`PAGE`); tests make
/// their own.
pub(crate) struct Page {
    map: Mapping,
    /// Open sections, innermost last: name and start.
    open: Mutex<Vec<(String, u64)>>,
}

impl Page {
    /// Maps the page at `path` and marks it as this process's.
    pub(crate) fn open(path: &std::path::Path) -> std::io::Result<Page> {
        let map = Mapping::open(path)?;
        let pid = std::process::id() as u64;
        map.word(layout::VERSION_PID_AT)
            .store(layout::VERSION as u64 | pid << 32, Relaxed);
        map.word(layout::MAGIC_AT).store(layout::MAGIC, Release);
        Ok(Page {
            map,
            open: Mutex::new(Vec::new()),
        })
    }
}

/// The page, or None outside `rdzv run` (or if the page cannot be mapped: progress is never
/// worth failing a worker for; the launcher then sees a page that was never opened).
static PAGE: Lazy<Option<Page>> = Lazy::new(|| {
    let path = std::env::var_os(PROGRESS_FILE_ENV)?;
    match Page::open(std::path::Path::new(&path)) {
        Ok(page) => {
            OWNER.store(std::process::id(), Relaxed);
            // The program's end is not a hang: exit() pauses monitoring before the handlers
            // registered earlier and the C++ destructors run (they can take long).
            // SAFETY: registers a function with no arguments that only touches atomics.
            unsafe { libc::atexit(pause_at_exit) };
            Some(page)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot map the progress page: heartbeats are not seen");
            None
        }
    }
});

/// The process that mapped the page: a child forked from it inherits the mapping and the exit
/// handler, and must not pause its parent's monitoring when it exits.
static OWNER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn pause_at_exit() {
    if OWNER.load(Relaxed) == std::process::id() {
        pause();
    }
}

/// Pauses monitoring until this process's next heartbeat or section begin or end: `rdzv run`
/// no longer takes its silence for a hang. For work without steps that may outlast the hang
/// timeout: a final checkpoint, an evaluation, the program's teardown. The program's exit
/// pauses by itself (an `atexit` handler; rdzv's Python module pauses when the interpreter
/// starts to exit). A no-op outside `rdzv run`. Never fails, any thread.
pub fn pause() {
    if let Some(page) = PAGE.as_ref() {
        pause_page(page);
    }
}

pub(crate) fn pause_page(page: &Page) {
    // Never 0, which means "not paused".
    let now = monotonic_ns().max(1);
    page.map.word(layout::PAUSED_AT).store(now, Release);
}

/// Whether this process runs under `rdzv run`'s progress monitoring (its calls are seen).
pub fn is_monitored() -> bool {
    PAGE.is_some()
}

/// One heartbeat: the worker made progress (a step, say). A no-op outside `rdzv run`.
pub fn heartbeat() {
    if let Some(page) = PAGE.as_ref() {
        beat(page, None);
    }
}

/// A heartbeat that also says which step the worker reached (a global iteration that goes on
/// from a checkpoint across restarts): the launcher's no-progress check compares steps across
/// attempts instead of counting heartbeats. Negative steps are refused.
pub fn heartbeat_step(step: i64) -> Result<()> {
    if step < 0 {
        return Err(Error::invalid(format!(
            "step: expected a non-negative step, got {step}"
        )));
    }
    if let Some(page) = PAGE.as_ref() {
        beat(page, Some(step));
    }
    Ok(())
}

pub(crate) fn beat(page: &Page, step: Option<i64>) {
    let now = monotonic_ns();
    let map = &page.map;
    if let Some(step) = step {
        map.word(layout::STEP_AT).store(step as u64 + 1, Relaxed);
    }
    let before = map.word(layout::LAST_BEAT_AT).swap(now, Relaxed);
    let beats = map.word(layout::BEATS_AT).fetch_add(1, Relaxed) + 1;
    if beats > WARMUP_BEATS && before != 0 && now > before {
        let longest = map.word(layout::MAX_INTERVAL_AT);
        if now - before > longest.load(Relaxed) {
            longest.fetch_max(now - before, Relaxed);
        }
    }
    map.word(layout::PAUSED_AT).store(0, Relaxed);
    map.word(layout::LAST_EVENT_AT).store(now, Release);
}

/// Opens the section `name` (nested sections are fine): the launcher's per-section timeout
/// runs from now until `section_end(name)`. A no-op outside `rdzv run`, but the name is
/// checked everywhere (1 to 39 bytes, no NUL), so a bad one is found before a real run.
pub fn section_begin(name: &str) -> Result<()> {
    check_name(name)?;
    match PAGE.as_ref() {
        Some(page) => begin(page, name),
        None => Ok(()),
    }
}

pub(crate) fn begin(page: &Page, name: &str) -> Result<()> {
    let now = monotonic_ns();
    let mut open = page.open.lock().unwrap_or_else(|e| e.into_inner());
    open.push((name.to_string(), now));
    publish_open(page, &open);
    page.map.word(layout::PAUSED_AT).store(0, Relaxed);
    page.map.word(layout::LAST_EVENT_AT).store(now, Release);
    Ok(())
}

/// Closes the innermost open section called `name`, and records its duration. Closing a
/// section that is not open is an error under `rdzv run` (a no-op outside it).
pub fn section_end(name: &str) -> Result<()> {
    check_name(name)?;
    match PAGE.as_ref() {
        Some(page) => end(page, name),
        None => Ok(()),
    }
}

pub(crate) fn end(page: &Page, name: &str) -> Result<()> {
    let now = monotonic_ns();
    let mut open = page.open.lock().unwrap_or_else(|e| e.into_inner());
    let Some(at) = open.iter().rposition(|(n, _)| n == name) else {
        return Err(Error::invalid(format!(
            "section_end: no section {name:?} is open (open: {:?})",
            open.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
        )));
    };
    let (_, started) = open.remove(at);
    record(page, name, now.saturating_sub(started));
    publish_open(page, &open);
    page.map.word(layout::PAUSED_AT).store(0, Relaxed);
    page.map.word(layout::LAST_EVENT_AT).store(now, Release);
    Ok(())
}

/// Says which signal makes this process write its thread stacks to `RDZV_STACKS_FILE` (a
/// handler it installed, such as Python's `faulthandler.register`): the launcher sends it
/// before stopping a hung worker. 0 takes it back. Only the worker knows it is safe to send.
pub fn set_stack_signal(signal: i32) -> Result<()> {
    if !(0..=64).contains(&signal) {
        return Err(Error::invalid(format!(
            "signal: expected 0 (none) or a signal number up to 64, got {signal}"
        )));
    }
    if let Some(page) = PAGE.as_ref() {
        page.map
            .word(layout::STACK_SIGNAL_AT)
            .store(signal as u64, Release);
    }
    Ok(())
}

/// Publishes the innermost open section under the sequence number (odd while it changes).
fn publish_open(page: &Page, open: &[(String, u64)]) {
    let map = &page.map;
    let seq = map.word(layout::OPEN_SEQ_AT);
    let s = seq.load(Relaxed);
    seq.store(s + 1, Relaxed);
    std::sync::atomic::fence(Release);
    let (name, started) = open.last().map_or(("", 0), |(n, t)| (n.as_str(), *t));
    map.word(layout::OPEN_DEPTH_AT)
        .store(open.len() as u64, Relaxed);
    map.word(layout::OPEN_STARTED_AT).store(started, Relaxed);
    layout::store_name(map, layout::OPEN_NAME_AT, layout::NAME_BYTES, name);
    seq.store(s + 2, Release);
}

/// Adds one ended section of `name` to its record, claiming a free slot for a new name.
/// Called with the sections' lock held: one writer.
fn record(page: &Page, name: &str, took_ns: u64) {
    let map = &page.map;
    for slot in 0..layout::SECTIONS {
        let at = layout::SECTIONS_AT + slot * layout::SECTION_BYTES;
        let count = map.word(at + layout::SECTION_COUNT_OFF);
        let seen = count.load(Relaxed);
        if seen == 0 {
            // A free slot: the name first, then the count that makes it visible.
            layout::store_name(map, at, layout::SECTION_NAME_BYTES, name);
        } else if layout::load_name(map, at, layout::SECTION_NAME_BYTES) != name {
            continue;
        }
        map.word(at + layout::SECTION_MAX_OFF)
            .fetch_max(took_ns, Relaxed);
        map.word(at + layout::SECTION_TOTAL_OFF)
            .fetch_add(took_ns, Relaxed);
        count.store(seen + 1, Release);
        return;
    }
}
