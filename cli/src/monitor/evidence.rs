//! Evidence from a hung group, collected before it is stopped, each step bounded in time:
//! - the worker's thread stacks: the signal it registered for that (rdzv's Python module
//!   registers `faulthandler`), else `py-spy dump` when it is installed;
//! - torch's Flight Recorder, for workers on NCCL: a write to the pipe torch watches
//!   (`TORCH_NCCL_DEBUG_INFO_PIPE_FILE`, which the launcher points into the worker's
//!   directory) makes it dump the last collectives there;
//! - the kernel's view of every thread (`/proc/PID/task/*`: state and wait channel), for any
//!   worker in any language.

use super::pages::{state_letter, Watched};
use crate::workers::env::flight_recorder_prefix;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// Where a worker's evidence went.
#[derive(Debug, Default, Clone)]
pub struct Evidence {
    /// Its thread stacks, when it wrote them.
    pub stacks: Option<PathBuf>,
    /// The kernel's view of its threads.
    pub kernel: Option<PathBuf>,
    /// torch's Flight Recorder dump was asked for (it writes it there).
    pub flight_recorder: Option<PathBuf>,
}

/// Collects one worker's evidence, in at most about `bound`, into files named for `round`
/// (`stacks.roundN.txt`, `kernel.roundN.txt`): a group that restarts without spending a
/// restart reuses the worker's directory, and its worker's stacks file starts empty.
pub async fn collect(w: &Watched, round: u64, bound: Duration) -> Evidence {
    let deadline = Instant::now() + bound;
    let mut evidence = Evidence {
        flight_recorder: ask_flight_recorder(w),
        ..Evidence::default()
    };
    // The kernel's view first: it is the state the hang left (a stack signal then wakes the
    // worker), and it costs no waiting.
    let kernel = w.stacks.with_file_name(format!("kernel.round{round}.txt"));
    if std::fs::write(&kernel, kernel_view(w.pid)).is_ok() {
        evidence.kernel = Some(kernel);
    }
    let signal = w.snapshot().map_or(0, |s| s.stack_signal);
    let stacks = match signal {
        0 => py_spy(w, deadline).await,
        sig => dumped_on_signal(w, sig, deadline).await,
    };
    let kept = kept_stacks(w, round);
    evidence.stacks = (stacks && std::fs::rename(&w.stacks, &kept).is_ok()).then_some(kept);
    evidence
}

/// Where the stacks `collect` took of `w` in `round` are kept.
pub fn kept_stacks(w: &Watched, round: u64) -> std::path::PathBuf {
    w.stacks.with_file_name(format!("stacks.round{round}.txt"))
}

/// Sends the worker its stack signal and waits until the stacks file stops growing.
async fn dumped_on_signal(w: &Watched, signal: i32, deadline: Instant) -> bool {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let before = size(&w.stacks);
    // SAFETY: kill has no memory effects; the worker asked for this signal (its page says so).
    if unsafe { libc::kill(w.pid as i32, signal) } != 0 {
        return false;
    }
    let mut last = before;
    let mut steady = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = size(&w.stacks);
        match now > before && now == last {
            true => steady += 1,
            false => steady = 0,
        }
        // Unchanged for 20 ms after it grew: faulthandler writes a dump in one go.
        if steady >= 2 {
            return true;
        }
        last = now;
    }
    size(&w.stacks) > before
}

/// `py-spy dump` of the worker into its stacks file, when py-spy is on PATH.
async fn py_spy(w: &Watched, deadline: Instant) -> bool {
    let Ok(out) = std::fs::File::create(&w.stacks) else {
        return false;
    };
    let child = tokio::process::Command::new("py-spy")
        .args(["dump", "--pid", &w.pid.to_string()])
        .stdout(out)
        .stderr(std::process::Stdio::null())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let Ok(mut child) = child else {
        let _ = std::fs::remove_file(&w.stacks);
        return false;
    };
    match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(Ok(status)) if status.success() => true,
        _ => {
            let _ = std::fs::remove_file(&w.stacks);
            false
        }
    }
}

/// Writes to torch's Flight Recorder pipe if the worker opened one (a FIFO torch makes when
/// `TORCH_NCCL_DEBUG_INFO_PIPE_FILE` is set and NCCL is in use); returns where the dump goes.
fn ask_flight_recorder(w: &Watched) -> Option<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let prefix = flight_recorder_prefix(&w.error_file);
    let pipe = PathBuf::from(format!("{}{}.pipe", prefix.display(), w.global_rank));
    if !std::fs::metadata(&pipe).ok()?.file_type().is_fifo() {
        return None;
    }
    let mut fifo = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&pipe)
        .ok()?;
    fifo.write_all(b"1\n").ok()?;
    Some(PathBuf::from(format!(
        "{}{}",
        prefix.display(),
        w.global_rank
    )))
}

/// Every thread of `pid`: its id, name, state and what it waits on in the kernel.
pub fn kernel_view(pid: u32) -> String {
    let mut text = format!("# pid {pid}: thread, name, state, wait channel\n");
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        text.push_str("(the process is gone)\n");
        return text;
    };
    let mut tids: Vec<u32> = tasks
        .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    for tid in tids {
        let dir = format!("/proc/{pid}/task/{tid}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).unwrap_or_default();
        let state = state_letter(&read("stat")).unwrap_or('?');
        let wchan = match read("wchan").trim() {
            "" | "0" => "-".to_string(),
            w => w.to_string(),
        };
        let _ = writeln!(text, "{tid} {} {state} {wchan}", read("comm").trim());
    }
    text
}

/// Where each worker's evidence went, by rank, as the hang's note names it.
pub fn by_rank(
    workers: &[Watched],
    evidence: &[Evidence],
    host: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    workers
        .iter()
        .zip(evidence)
        .map(|(w, e)| {
            let entry = serde_json::json!({
                "host": host,
                "stacks": path(&e.stacks),
                "kernel": path(&e.kernel),
                "flight_recorder": path(&e.flight_recorder),
            });
            (w.global_rank.to_string(), entry)
        })
        .collect()
}

/// How long evidence may take per worker before the workers are stopped.
pub const EVIDENCE_BOUND: Duration = Duration::from_secs(2);

/// Every worker's evidence, collected at once, each bounded (`EVIDENCE_BOUND`).
pub async fn collect_all(workers: &[Watched], round: u64) -> Vec<Evidence> {
    // Concurrently: one after the other would multiply the bound.
    super::join_all(workers.iter().map(|w| collect(w, round, EVIDENCE_BOUND))).await
}

/// One line per worker saying where its evidence is.
pub fn say(w: &Watched, e: &Evidence) {
    let mut parts = Vec::new();
    if let Some(p) = &e.stacks {
        parts.push(format!("stacks {}", p.display()));
    }
    if let Some(p) = &e.flight_recorder {
        parts.push(format!("flight recorder {}", p.display()));
    }
    if let Some(p) = &e.kernel {
        parts.push(format!("threads {}", p.display()));
    }
    if !parts.is_empty() {
        crate::output::say(format_args!(
            "rank {} evidence: {}",
            w.global_rank,
            parts.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_view_lists_every_thread_of_a_process() {
        let _t = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(300)));
        let view = kernel_view(std::process::id());
        let threads = view.lines().skip(1).count();
        assert!(threads >= 2, "{view}");
        let gone = kernel_view(u32::MAX - 1);
        assert!(gone.contains("gone"), "{gone}");
    }
}
