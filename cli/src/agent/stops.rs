//! Stopping: the group for a stop from outside it (a signal, the membership, the run, a
//! failure elsewhere), with its grace period, and the exit status each stop leaves with.

use super::source::Stop;
use super::{Agent, Carried};
use crate::agent::Signals;
use crate::exit::{signal_name, Exit};
use crate::output::{self, say};
use crate::workers::report::Failure;
use crate::workers::Group;

impl Agent {
    /// Something ended the round from outside the group: stops the workers (forwarding a
    /// signal, else SIGTERM), then forms a new round after a membership change, or leaves.
    pub(super) async fn stop_for(
        &mut self,
        group: &mut Group,
        stop: Stop,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> Result<(), Exit> {
        match &stop {
            Stop::Signal(sig) => {
                say(format_args!(
                    "received {}: forwarding it to the workers",
                    signal_name(*sig)
                ));
                // A second signal only cuts the grace short: the first one decides the status.
                let _ = self.stop_group(group, *sig, signals).await;
                return Err(Exit::Signal(*sig));
            }
            Stop::Changed(why) => say(format_args!(
                "{why}: stopping the workers to form a new round (no restart spent)"
            )),
            Stop::Drained => {
                self.rdzv_event("rdzv.node.drained", serde_json::json!({}));
                say("this node was drained (a planned departure): stopping the workers")
            }
            Stop::Closed(None) => say("the run was closed: stopping the workers"),
            Stop::Closed(Some(_)) | Stop::JobFailed(_) => {
                say("the job failed on another node: stopping the workers")
            }
            Stop::Error(_) => {}
        }
        self.stop_group(group, libc::SIGTERM, signals).await?;
        if let Stop::Changed(_) = stop {
            carried.failed = None;
            return Ok(());
        }
        Err(self.stopped(stop, None))
    }

    /// Stops the group with `signal` (grace period, then SIGKILL). A signal to the launcher
    /// meanwhile cuts the grace short, and the launcher then leaves with it (`Err`).
    pub(super) async fn stop_group(
        &self,
        group: &mut Group,
        signal: i32,
        signals: &mut Signals,
    ) -> Result<(), Exit> {
        let interrupted = group
            .stop(signal, self.cfg.shutdown_timeout, signals.recv())
            .await;
        match interrupted {
            Some(sig) => {
                say(format_args!(
                    "received {} while stopping the workers: leaving",
                    signal_name(sig)
                ));
                Err(Exit::Signal(sig))
            }
            None => Ok(()),
        }
    }

    /// The exit status for a stop outside a running group; `failed`: the last group's
    /// failures, reported when the job ends with them.
    pub(super) fn stopped(&mut self, stop: Stop, failed: Option<&[Failure]>) -> Exit {
        match stop {
            Stop::Signal(sig) => {
                say(format_args!("received {}: leaving", signal_name(sig)));
                Exit::Signal(sig)
            }
            Stop::Closed(None) => match failed {
                Some(failures) => {
                    say("the run was closed before the workers could be restarted");
                    self.report(failures);
                    Exit::Failure
                }
                None => {
                    say("the run was closed: exiting");
                    Exit::Success
                }
            },
            // The job failed elsewhere: a failure here too, so that a scheduler sees it on
            // every node, healthy ones included.
            Stop::Closed(Some(why)) | Stop::JobFailed(why) => {
                if let Some(failures) = failed {
                    self.report(failures);
                }
                output::error(format_args!("the job failed on another node: {why}"));
                Exit::Failure
            }
            Stop::Drained => {
                say("this node was drained: leaving the run, which goes on without it");
                Exit::Success
            }
            Stop::Changed(why) | Stop::Error(why) => {
                output::error(why);
                Exit::Failure
            }
        }
    }
}
