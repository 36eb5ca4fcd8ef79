//! `--in-process-restart`: the workers leave their training function and stay for the next
//! round, after a membership change, a hang or this node's own worker failing
//! (`crate::workers::inprocess`, docs/LAUNCHER.md "Recovery: in-process restart"). A worker
//! that does not leave within the bound is stopped alone and started again next round.

use super::{Agent, Carried};
use crate::agent::Signals;
use crate::events::Source as EventSource;
use crate::exit::Exit;
use crate::host::hostname;
use crate::output::say;
use crate::workers::Group;
use std::time::Duration;

/// After a hang, every worker still running waits in a collective on the hung one, or is it:
/// the wrapper breaks such a wait within milliseconds of the leave (6-18 ms in the recovery
/// benchmark), so a worker that has not left within this is taken for hung, stopped and
/// started again, instead of waiting out the whole `--in-process-timeout` (a worker elsewhere
/// may be the one that hung: the finding node kills the worker its own monitor found, which
/// is not always the cause). Kept short so that this node is back before the others' next
/// round forms without it (the recovery benchmark's last call is 1 s: at 1 s, it missed it in
/// 2 runs of 6).
const AFTER_A_HANG: Duration = Duration::from_millis(500);

impl Agent {
    /// `--in-process-restart`, after a membership change or another node's hang (`hang`): the
    /// workers leave their training function and stay for the next round. Those that do not
    /// within the bound are stopped and start again next round; the group is stopped (and
    /// started again), as without the flag, only when no worker could be asked.
    pub(super) async fn leave_in_process(
        &mut self,
        group: &mut Group,
        why: &str,
        hang: bool,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> (Result<(), Exit>, bool) {
        say(format_args!(
            "{why}: asking the workers to leave their training function for a new round (in process, no restart spent)"
        ));
        carried.failed = None;
        if self.leave(group, hang).await.is_some() {
            return (Ok(()), true);
        }
        say("no worker could be asked to leave: stopping the group to start it again");
        (self.stop_group(group, libc::SIGTERM, signals).await, false)
    }

    /// `--in-process-restart`, after a worker of this node failed or hung (`hang`): the others
    /// leave their training function (their collectives with it have failed), so that only the
    /// failed worker, and any that did not leave in time, is started again. False without the
    /// flag, or when none could be asked.
    pub(super) async fn leave_after_failure(&mut self, group: &mut Group, hang: bool) -> bool {
        if self.cfg.in_process.is_none() || group.running() == 0 {
            return false;
        }
        say("asking this node's other workers to leave their training function (in process)");
        self.leave(group, hang).await.is_some()
    }

    /// Asks the running workers to leave, and stops those that do not within the bound
    /// (`--in-process-timeout`, or `AFTER_A_HANG` when shorter): they start again next round.
    /// Returns the global ranks stopped; None when no worker could be asked.
    pub(super) async fn leave(&mut self, group: &mut Group, hang: bool) -> Option<Vec<u32>> {
        let mut bound = self.cfg.in_process.expect("in-process restart is on");
        if hang {
            bound = bound.min(AFTER_A_HANG);
        }
        let asked = std::time::Instant::now();
        let left = group.leave(bound, hang).await;
        let others_left_ms = left
            .as_ref()
            .and_then(|l| l.others_left_in)
            .map(|d| d.as_millis() as u64);
        let late = left.map(|l| l.late);
        self.record.event(
            "rdzv.inprocess.left",
            EventSource::Agent,
            serde_json::json!({"run_id": self.cfg.run_id, "left": late.as_ref().is_some_and(Vec::is_empty),
                "late": late, "left_ms": asked.elapsed().as_millis() as u64,
                "others_left_ms": others_left_ms, "hostname": hostname()}),
        );
        let late = late?;
        if late.is_empty() {
            say(format_args!(
                "the workers left in {} ms: they stay in their processes for the next round",
                asked.elapsed().as_millis()
            ));
            return Some(late);
        }
        let ranks: Vec<String> = late.iter().map(u32::to_string).collect();
        match others_left_ms {
            Some(ms) => say(format_args!(
                "rank {} is still in the training function {} ms after the leave, when this node's other workers left in {ms} ms: it is the hung one, stopping it alone to start again in the next round; the others stay in their processes",
                ranks.join(","),
                asked.elapsed().as_millis()
            )),
            None => say(format_args!(
                "rank(s) {} did not leave the training function within {:.1} s: stopping them alone, to start again in the next round; the others stay in their processes",
                ranks.join(","),
                bound.as_secs_f64()
            )),
        }
        // One that hung gets SIGKILL; one that knows nothing of the wrapper gets the grace a
        // stopped group gets.
        let (signal, grace) = match hang {
            true => (libc::SIGKILL, Duration::ZERO),
            false => (libc::SIGTERM, self.cfg.shutdown_timeout),
        };
        for &rank in &late {
            group.stop_worker(rank, signal, grace).await;
        }
        Some(late)
    }
}
