//! `--max-no-progress-restarts`: a job that restarts again and again without training is
//! stopped instead of burning its restart budget (or forever, with a large one).
//!
//! An attempt made progress when a worker's step (rdzv's `heartbeat_step`) went past the best
//! step of every earlier attempt, or, for workers that give no step, when a worker heartbeat
//! past the warm-up (`rdzv::progress::WARMUP_BEATS`). Only restarts after a failure or a hang
//! count; membership changes do not. The count is this launcher's: every node's workers reach
//! the same steps, so the nodes agree, and the first node to stop fails the job everywhere.

use super::workers::Watched;
use rdzv::progress::WARMUP_BEATS;

/// Restarts without progress so far, and the best step reached.
#[derive(Debug, Default)]
pub struct NoProgress {
    pub best_step: Option<u64>,
    pub in_a_row: u32,
}

impl NoProgress {
    /// Counts an attempt that ended in a restart; returns whether it made progress.
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
        self.in_a_row = match progressed {
            true => 0,
            false => self.in_a_row + 1,
        };
        progressed
    }

    /// What made no progress, for the line that stops the job.
    pub fn describe(&self) -> String {
        match self.best_step {
            Some(step) => format!(
                "{} restart(s) in a row without a worker passing step {step}",
                self.in_a_row
            ),
            None => format!(
                "{} restart(s) in a row without a worker heartbeating past its warm-up ({WARMUP_BEATS} heartbeats)",
                self.in_a_row
            ),
        }
    }
}
