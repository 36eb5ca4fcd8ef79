//! `--max-no-progress-restarts`: a job that restarts again and again without training is
//! stopped instead of burning its restart budget (or forever, with a large one).
//!
//! An attempt made progress when a worker's step (rdzv's `heartbeat_step`) went past the best
//! step of every earlier attempt, or, for workers that give no step, when a worker heartbeat
//! past the warm-up (`rdzv::progress::WARMUP_BEATS`). What is counted is restarts: attempts
//! that a failure or a hang restarted and that failed again without progress (the first
//! attempt is no restart; an attempt that a membership change started is none either). With
//! K, the job stops when K restarts in a row made none (K = 0 as K = 1: a restart has to run
//! to show it). The count is this launcher's: every node's workers reach the same steps, so
//! the nodes agree, and the first node to stop fails the job everywhere.

use super::pages::Watched;
use rdzv::progress::WARMUP_BEATS;

/// Restarts without progress so far, and the best step reached.
#[derive(Debug, Default)]
pub struct NoProgress {
    pub best_step: Option<u64>,
    pub in_a_row: u32,
    /// The next attempt is a restart after a failure (`restarted`).
    next_is_restart: bool,
    /// The running attempt is one (`attempt_started`).
    is_restart: bool,
}

impl NoProgress {
    /// A failure was charged a restart: the next attempt is a restart.
    pub fn restarted(&mut self) {
        self.next_is_restart = true;
    }

    /// An attempt started (after a restart, or a round formed for another reason).
    pub fn attempt_started(&mut self) {
        self.is_restart = std::mem::take(&mut self.next_is_restart);
    }

    /// Whether the job must stop: `max` restarts in a row made no progress.
    pub fn spent(&self, max: u32) -> bool {
        self.in_a_row >= max.max(1)
    }

    /// Counts an attempt that failed; returns whether it made progress.
    pub fn attempt_ended(&mut self, workers: &[Watched]) -> bool {
        let pages: Vec<_> = workers.iter().filter_map(Watched::snapshot).collect();
        let step = pages.iter().filter_map(|s| s.step).max();
        let progressed = match step {
            Some(step) => self.best_step.is_none_or(|best| step > best),
            None => pages.iter().any(|s| s.beats > WARMUP_BEATS),
        };
        if step > self.best_step {
            self.best_step = step;
        }
        self.in_a_row = match (progressed, self.is_restart) {
            (true, _) => 0,
            (false, true) => self.in_a_row + 1,
            (false, false) => self.in_a_row,
        };
        progressed
    }

    /// What made no progress, for the line that stops the job.
    pub fn describe(&self) -> String {
        match self.best_step {
            Some(step) => format!(
                "{} restart(s) in a row made no progress (no worker passed step {step})",
                self.in_a_row
            ),
            None => format!(
                "{} restart(s) in a row made no progress (no worker heartbeat past its warm-up of {WARMUP_BEATS})",
                self.in_a_row
            ),
        }
    }
}
