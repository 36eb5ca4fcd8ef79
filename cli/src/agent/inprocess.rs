//! `--in-process-restart`: the workers leave their training function and stay for the next
//! round, after a membership change or this node's own worker failing
//! (`crate::workers::inprocess`, docs/LAUNCHER.md "Recovery: in-process restart").

use super::{Agent, Carried};
use crate::agent::Signals;
use crate::events::Source as EventSource;
use crate::exit::Exit;
use crate::host::hostname;
use crate::output::say;
use crate::workers::Group;

impl Agent {
    /// `--in-process-restart`, after a membership change: the workers leave their training
    /// function and stay for the next round; one that does not within the bound has the group
    /// stopped (and started again next round), as without the flag.
    pub(super) async fn leave_in_process(
        &mut self,
        group: &mut Group,
        why: &str,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> (Result<(), Exit>, bool) {
        let bound = self.cfg.in_process.expect("in-process restart is on");
        say(format_args!(
            "{why}: asking the workers to leave their training function for a new round (in process, no restart spent)"
        ));
        carried.failed = None;
        let asked = std::time::Instant::now();
        let left = group.leave(bound).await;
        self.record.event(
            "rdzv.inprocess.left",
            EventSource::Agent,
            serde_json::json!({"run_id": self.cfg.run_id, "left": left,
                "left_ms": asked.elapsed().as_millis() as u64, "hostname": hostname()}),
        );
        if left {
            say(format_args!(
                "the workers left in {} ms: they stay in their processes for the next round",
                asked.elapsed().as_millis()
            ));
            return (Ok(()), true);
        }
        say(format_args!(
            "a worker did not leave its function within {:.1} s: stopping the group to start it again",
            bound.as_secs_f64()
        ));
        (self.stop_group(group, libc::SIGTERM, signals).await, false)
    }

    /// `--in-process-restart`, after a worker of this node failed: the others leave their
    /// training function (their collectives with it have failed), so that only the failed
    /// worker is started again. False without the flag, or when one did not leave in time.
    pub(super) async fn leave_after_failure(&mut self, group: &mut Group) -> bool {
        let Some(bound) = self.cfg.in_process else {
            return false;
        };
        if group.running() == 0 {
            return false;
        }
        say("asking this node's other workers to leave their training function (in process)");
        let left = group.leave(bound).await;
        if !left {
            say(format_args!(
                "a worker did not leave its function within {:.1} s: stopping the group",
                bound.as_secs_f64()
            ));
        }
        left
    }
}
