//! Progress: a worker's heartbeats and named sections, for the launcher's hang monitor.
//!
//! A worker calls [`heartbeat`] (every step, say) and brackets phases with
//! [`section_begin`]/[`section_end`] ("forward", "allreduce", "checkpoint"). Under `rdzv run`
//! each call is a few stores to a shared page that the launcher reads on its own schedule: no
//! message, no system call (the clock is read through the vDSO), about 20-60 ns. Outside
//! `rdzv run` (no `RDZV_PROGRESS_FILE` in the environment) every call returns at once.
//!
//! The page (`RDZV_PROGRESS_FILE`, one per worker, made by the launcher before the worker
//! starts) has a fixed layout (`layout`), written by the worker (`writer`) and read by the
//! launcher (`reader`) at any time without locks: counters are single atomic words, and the
//! open section's name and start are published under a sequence number that is odd while
//! they change, so a reader retries instead of seeing half of a name.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds: the worker and its launcher share the machine's
//! clock, and the launcher turns them into "how long ago" (and, for other nodes, wall time).

mod layout;
pub mod reader;
mod writer;

pub use reader::{Read, Section, SectionStats, Snapshot};
pub use writer::{
    heartbeat, heartbeat_step, is_monitored, pause, section_begin, section_end, set_stack_signal,
};

/// The environment variable naming a worker's progress page; set by `rdzv run`.
pub const PROGRESS_FILE_ENV: &str = "RDZV_PROGRESS_FILE";

/// The environment variable naming where a worker writes its thread stacks when its launcher
/// asks for them (the signal it registered with [`set_stack_signal`]); set by `rdzv run`.
pub const STACKS_FILE_ENV: &str = "RDZV_STACKS_FILE";

/// Heartbeats whose intervals are not counted in the longest interval (`max_interval`): the
/// first steps of a job (compilation, warm-up, the first collectives) are slow and say
/// nothing about how long a step takes (NVRx skips its first iterations the same way).
pub const WARMUP_BEATS: u64 = 5;

/// The longest section name the page holds, in bytes.
pub const MAX_SECTION_NAME: usize = layout::SECTION_NAME_BYTES - 1;

/// How many distinct section names get a duration record (`SectionStats`); sections beyond
/// them are still shown while open, but their durations are not learned.
pub const MAX_SECTIONS: usize = layout::SECTIONS;

/// Makes (or empties) a progress page at `path` for a worker about to start: zeroed, the size
/// the layout needs. The launcher calls it; a worker only ever maps an existing page.
pub fn create_page(path: &std::path::Path) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    file.set_len(layout::PAGE_BYTES as u64)
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of every time on the page.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Checks a section name: 1 to `MAX_SECTION_NAME` bytes, no NUL.
pub(crate) fn check_name(name: &str) -> crate::Result<()> {
    if name.is_empty() || name.len() > MAX_SECTION_NAME || name.contains('\0') {
        return Err(crate::Error::invalid(format!(
            "section name: expected 1 to {MAX_SECTION_NAME} bytes without NUL, got {:?}",
            name.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
