//! `rdzv run`'s flags for what no exit reports: hung workers (heartbeats and sections, with
//! timeouts given or learned), jobs that restart without progress, and sick nodes (a health
//! command). None of them is torchrun's; NVRx's `ft_launcher` has the same ideas under other
//! names (docs/LAUNCHER.md maps them).

use super::values::seconds;
use crate::exit::{usage, Usage};
use clap::Args;
use std::time::Duration;

#[derive(Args, Debug, Clone, Default)]
pub struct MonitorFlags {
    /// A worker that has made no progress (no heartbeat, no section begun or ended) for this
    /// many seconds is hung: its stacks are collected, the workers stopped and the group
    /// restarted (it spends a restart). `auto` learns the timeout from the job's own
    /// heartbeats, job-wide. Only workers that call rdzv's heartbeat are watched, from their
    /// first call.
    #[arg(
        long,
        env = "RDZV_HANG_TIMEOUT",
        value_name = "SECONDS|auto",
        value_parser = hang_timeout
    )]
    pub hang_timeout: Option<Timeout>,
    /// A timeout for one named section, NAME=SECONDS or NAME=auto (repeat the flag, or
    /// separate with commas); while a section with a timeout is open, it replaces
    /// --hang-timeout.
    #[arg(
        long,
        env = "RDZV_SECTION_TIMEOUT",
        value_name = "NAME=SECONDS|auto",
        value_delimiter = ',',
        value_parser = section_timeout
    )]
    pub section_timeout: Vec<(String, Timeout)>,
    /// With --hang-timeout auto: the timeout until one is learned (by default nothing is
    /// watched until a worker's first heartbeats have been timed).
    #[arg(long, env = "RDZV_HANG_INITIAL_TIMEOUT", value_name = "SECONDS", value_parser = initial_timeout)]
    pub hang_initial_timeout: Option<Duration>,
    /// Stop the job after this many restarts in a row in which no worker progressed past the
    /// best an earlier attempt reached (its step, with rdzv's heartbeat_step; else any
    /// heartbeat past the warm-up).
    #[arg(long, env = "RDZV_MAX_NO_PROGRESS_RESTARTS", value_name = "K")]
    pub max_no_progress_restarts: Option<u32>,
    /// How often each launcher measures its workers' pace (seconds per heartbeat) for
    /// `rdzv status`'s straggler flag; it writes a note only when the pace changed by a fifth.
    /// Default: 60 with --hang-timeout, --section-timeout or --max-no-progress-restarts, else
    /// off (0: off).
    #[arg(
        long,
        env = "RDZV_PACE_INTERVAL",
        value_name = "SECONDS",
        value_parser = pace_interval
    )]
    pub pace_interval: Option<Duration>,
    /// A command (run with sh -c) that says whether this node is healthy: run before every
    /// join and every --health-check-interval while training. Failing before a join, the
    /// node takes no rank and exits 1; failing while training, the node drains itself, so the
    /// others re-form without it at once.
    #[arg(long, env = "RDZV_HEALTH_CHECK", value_name = "CMD")]
    pub health_check: Option<String>,
    /// Seconds between two health checks while training.
    #[arg(
        long,
        env = "RDZV_HEALTH_CHECK_INTERVAL",
        default_value = "60",
        value_name = "SECONDS",
        value_parser = health_check_interval
    )]
    pub health_check_interval: Duration,
    /// Seconds a health check may take; a longer one fails.
    #[arg(
        long,
        env = "RDZV_HEALTH_CHECK_TIMEOUT",
        default_value = "30",
        value_name = "SECONDS",
        value_parser = health_check_timeout
    )]
    pub health_check_timeout: Duration,
}

/// A timeout given in seconds, or learned from the job (`auto`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timeout {
    Given(Duration),
    Auto,
}

fn timeout(flag: &str, s: &str) -> Result<Timeout, Usage> {
    match s.trim() {
        "auto" => Ok(Timeout::Auto),
        t => seconds(flag, t, false).map(Timeout::Given).map_err(|_| {
            usage(format!(
                "{flag}: expected a number of seconds above 0 or `auto`, got {s:?}"
            ))
        }),
    }
}

pub fn hang_timeout(s: &str) -> Result<Timeout, Usage> {
    timeout("--hang-timeout", s)
}

pub fn section_timeout(s: &str) -> Result<(String, Timeout), Usage> {
    let Some((name, value)) = s.split_once('=') else {
        return Err(usage(format!(
            "--section-timeout: expected NAME=SECONDS or NAME=auto, got {s:?}"
        )));
    };
    let name = name.trim();
    if rdzv::progress::MAX_SECTION_NAME < name.len() || name.is_empty() {
        return Err(usage(format!(
            "--section-timeout: a section name has 1 to {} bytes, got {name:?}",
            rdzv::progress::MAX_SECTION_NAME
        )));
    }
    Ok((name.to_string(), timeout("--section-timeout", value)?))
}

pub fn initial_timeout(s: &str) -> Result<Duration, Usage> {
    seconds("--hang-initial-timeout", s, false)
}

pub fn pace_interval(s: &str) -> Result<Duration, Usage> {
    seconds("--pace-interval", s, true)
}

pub fn health_check_interval(s: &str) -> Result<Duration, Usage> {
    seconds("--health-check-interval", s, false)
}

pub fn health_check_timeout(s: &str) -> Result<Duration, Usage> {
    seconds("--health-check-timeout", s, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_seconds_or_auto_and_say_what_was_wrong() {
        assert_eq!(hang_timeout("auto"), Ok(Timeout::Auto));
        assert_eq!(
            hang_timeout("2.5"),
            Ok(Timeout::Given(Duration::from_millis(2500)))
        );
        let err = hang_timeout("0").unwrap_err().0;
        assert!(
            err.contains("--hang-timeout") && err.contains("`auto`"),
            "{err}"
        );
        assert_eq!(
            section_timeout("allreduce=30"),
            Ok((
                "allreduce".to_string(),
                Timeout::Given(Duration::from_secs(30))
            ))
        );
        assert_eq!(
            section_timeout("ckpt=auto"),
            Ok(("ckpt".to_string(), Timeout::Auto))
        );
        for bad in ["allreduce", "=3", "x=-1", &format!("{}=1", "n".repeat(40))] {
            let err = section_timeout(bad).unwrap_err().0;
            assert!(err.starts_with("--section-timeout:"), "{bad}: {err}");
        }
    }
}
