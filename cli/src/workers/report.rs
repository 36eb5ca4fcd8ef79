//! The report of a failed group, as torchrun's `ChildFailedError` lays it out, and what it
//! is made of: each failure with its time and error file (torchelastic's `error.json`, written
//! by the worker: `error_file`), and the copy of the root cause's error file into the
//! launcher's own `TORCHELASTIC_ERROR_FILE` when a scheduler set one.

use super::error_file;
use super::process::Ended;
use crate::exit::signal_name;
use crate::host::hostname;
use crate::output::{plain, say};
use std::path::PathBuf;
use std::time::SystemTime;

/// A worker's failure, as reported when the restart budget is spent; also the workers the
/// launcher stopped because of it (`stopped`).
pub struct Failure {
    pub global_rank: u32,
    pub local_rank: u32,
    pub pid: u32,
    pub ended: Ended,
    /// When it failed: the error file's timestamp if it wrote one, else when it exited.
    pub at: SystemTime,
    pub error_file: Option<(PathBuf, String)>,
    /// The traceback its error file holds (torch's `py_callstack`).
    pub traceback: Option<String>,
    /// Stopped by the launcher after another worker failed: not a failure of its own.
    pub stopped: bool,
}

/// One line saying what failed, for the other nodes and `rdzv status`: the root cause's rank,
/// how it ended and where.
pub fn summary(failures: &[Failure]) -> String {
    match failures.first() {
        Some(f) => format!(
            "rank {} (local rank {} on {}) failed with {}",
            f.global_rank,
            f.local_rank,
            hostname(),
            f.ended
        ),
        None => format!("a worker on {} failed", hostname()),
    }
}

/// The report of a failed job, as torchrun's `ChildFailedError` lays it out: the root cause
/// (the first failure by the time it happened) with its host, time, rank, exit code or signal,
/// error file and traceback; the other failures; and the ranks the launcher stopped. When the
/// launcher has a `TORCHELASTIC_ERROR_FILE` of its own (a scheduler set it), the root cause's
/// error file is copied there, as torchrun does. True if the report named an error file.
pub fn report(program: &str, failures: &[Failure]) -> bool {
    let Some(root) = failures.first().filter(|f| !f.stopped) else {
        return false;
    };
    say(format_args!(
        "first failure: rank {} (local rank {}, pid {}) ended with {}",
        root.global_rank, root.local_rank, root.pid, root.ended
    ));
    match &root.error_file {
        Some((path, message)) => say(format_args!(
            "rank {} error file {}: {}",
            root.global_rank,
            path.display(),
            message.lines().next().unwrap_or("")
        )),
        None => say(format_args!(
            "rank {} wrote no error file (TORCHELASTIC_ERROR_FILE; torch's @record writes one)",
            root.global_rank
        )),
    }
    // torchrun prints socket.getfqdn() there.
    let host = crate::host::fqdn();
    let rule = "=".repeat(60);
    let thin = "-".repeat(60);
    // torchrun's ChildFailedError block, line for line and unprefixed, as parsers read it.
    plain(&rule);
    plain(format_args!("{program} FAILED"));
    plain(&thin);
    plain("Failures:");
    let others: Vec<&Failure> = failures[1..].iter().filter(|f| !f.stopped).collect();
    if others.is_empty() {
        plain("  <NO_OTHER_FAILURES>");
    }
    for (i, f) in others.iter().enumerate() {
        describe(i + 1, f, &host);
    }
    plain(&thin);
    plain("Root Cause (first observed failure):");
    describe(0, root, &host);
    plain(&rule);
    // rdzv's addition, after the block: the workers stopped because of the failure.
    let stopped: Vec<String> = failures
        .iter()
        .filter(|f| f.stopped)
        .map(|f| format!("{} ({})", f.global_rank, f.ended))
        .collect();
    if !stopped.is_empty() {
        say(format_args!(
            "stopped by the launcher after the failure: rank {}",
            stopped.join(", rank ")
        ));
    }
    if let Some(own) = std::env::var_os("TORCHELASTIC_ERROR_FILE").filter(|v| !v.is_empty()) {
        let own = PathBuf::from(own);
        let code = root.ended.exitcode();
        let why = format!(
            "ChildFailedError: rank {} (local rank {}, pid {}) ended with {}",
            root.global_rank, root.local_rank, root.pid, root.ended
        );
        let from = root.error_file.as_ref().map(|(path, _)| path.as_path());
        match error_file::copy_with_code(from, &own, code, &why, root.at) {
            Ok(()) => say(format_args!(
                "root cause's error copied to {}",
                own.display()
            )),
            Err(e) => say(format_args!("could not write {}: {e}", own.display())),
        }
    }
    root.error_file.is_some()
}

/// One failure of the report, as torchrun prints it.
fn describe(index: usize, f: &Failure, host: &str) {
    plain(format_args!("[{index}]:"));
    plain(format_args!("  time      : {}", utc(f.at)));
    plain(format_args!("  host      : {host}"));
    plain(format_args!(
        "  rank      : {} (local_rank: {})",
        f.global_rank, f.local_rank
    ));
    let code = f.ended.exitcode();
    // torchrun's template: `${exitcode} (pid: ${pid}) ${signal_name}`, the name (` (SIGSEGV)`)
    // only for a signal; the space before it either way.
    let signal = match f.ended {
        Ended::Signal(s) => format!(" ({})", signal_name(s)),
        Ended::Code(_) => String::new(),
    };
    plain(format_args!(
        "  exitcode  : {code} (pid: {}) {signal}",
        f.pid
    ));
    match &f.error_file {
        Some((path, _)) => plain(format_args!("  error_file: {}", path.display())),
        None => plain("  error_file: <N/A>"),
    }
    let traceback = match (&f.traceback, &f.error_file, f.ended) {
        (Some(tb), _, _) => tb.clone(),
        (None, Some((_, message)), _) => message.clone(),
        (None, None, Ended::Signal(s)) => {
            format!("Signal {s} ({}) received by PID {}", signal_name(s), f.pid)
        }
        (None, None, Ended::Code(_)) => {
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html".into()
        }
    };
    let mut lines = traceback.lines();
    plain(format_args!("  traceback : {}", lines.next().unwrap_or("")));
    for line in lines {
        plain(format_args!("    {line}"));
    }
}

/// `YYYY-MM-DD_HH:MM:SS` in UTC, torchrun's format for failure times.
fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}_{:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn failure_times_read_as_torchrun_prints_them() {
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01_00:00:00");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(utc(t), "2024-02-29_23:59:59");
    }
}
