//! What `rdzv run` watches beyond exits: progress (hang timeouts, given or learned), restarts
//! that make no progress, and the node's health command.

use crate::args::monitor::{MonitorFlags, Timeout};
use crate::exit::{usage, Usage};
use std::time::Duration;

/// `--pace-interval` when progress is watched and the flag is not given.
const PACE_DEFAULT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default)]
pub struct MonitorConfig {
    /// `--hang-timeout`: for heartbeats (and any section without a timeout of its own).
    pub hang: Option<Timeout>,
    /// `--section-timeout`: per section name.
    pub sections: Vec<(String, Timeout)>,
    /// `--hang-initial-timeout`: with `auto`, until a timeout is learned.
    pub initial: Option<Duration>,
    pub max_no_progress_restarts: Option<u32>,
    pub health: Option<HealthCheck>,
    /// `--pace-interval` (None: 0, never).
    pub pace: Option<Duration>,
}

/// `--health-check` and its interval and timeout.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    pub command: String,
    pub interval: Duration,
    pub timeout: Duration,
}

impl MonitorConfig {
    pub fn from_flags(f: MonitorFlags) -> Result<MonitorConfig, Usage> {
        if f.hang_initial_timeout.is_some() && f.hang_timeout != Some(Timeout::Auto) {
            return Err(usage(
                "--hang-initial-timeout: only with --hang-timeout auto (a given timeout applies from the first heartbeat)",
            ));
        }
        // Progress is watched at all: the pace is then measured by default too.
        let watching = f.hang_timeout.is_some()
            || !f.section_timeout.is_empty()
            || f.max_no_progress_restarts.is_some();
        let mut sections: Vec<(String, Timeout)> = Vec::new();
        for (name, timeout) in f.section_timeout {
            if sections.iter().any(|(n, _)| *n == name) {
                return Err(usage(format!(
                    "--section-timeout: section {name:?} is given twice"
                )));
            }
            sections.push((name, timeout));
        }
        let health = match f.health_check {
            Some(command) if command.trim().is_empty() => {
                return Err(usage(
                    "--health-check: expected a command, got an empty one",
                ))
            }
            Some(command) => Some(HealthCheck {
                command,
                interval: f.health_check_interval,
                timeout: f.health_check_timeout,
            }),
            None => None,
        };
        Ok(MonitorConfig {
            hang: f.hang_timeout,
            sections,
            initial: f.hang_initial_timeout,
            max_no_progress_restarts: f.max_no_progress_restarts,
            health,
            pace: match f.pace_interval {
                Some(p) => Some(p).filter(|p| !p.is_zero()),
                None if watching => Some(PACE_DEFAULT),
                None => None,
            },
        })
    }

    /// Whether hangs are watched (a timeout is given or learned).
    pub fn watches_progress(&self) -> bool {
        self.hang.is_some() || !self.sections.is_empty()
    }

    /// Whether a timeout is learned (`auto`, for heartbeats or a section).
    pub fn learns(&self) -> bool {
        self.hang == Some(Timeout::Auto) || self.sections.iter().any(|(_, t)| *t == Timeout::Auto)
    }

    /// Whether workers get progress pages (RDZV_PROGRESS_FILE): only when a monitor reads
    /// them, so that a plain `rdzv run` gives workers torchrun's environment and log layout.
    pub fn pages(&self) -> bool {
        self.watches_progress() || self.max_no_progress_restarts.is_some() || self.pace.is_some()
    }
}
