//! A hang, found by this node's monitor or announced by another node's: the agent's side of
//! the hang protocol (`monitor::respond`). Without `--in-process-restart` this node's group is
//! killed once its evidence is taken; with it, only the hung worker is, and the others leave
//! their training function and stay for the next round (`inprocess`).

use super::source::Round;
use super::{failure, incident, place, Agent, Carried, Signals, Source};
use crate::exit::Exit;
use crate::host::hostname;
use crate::monitor::evidence;
use crate::monitor::hang::{self, HangNotice, Hung};
use crate::monitor::pages::Watched;
use crate::monitor::respond::{self, Found};
use crate::output::say;
use crate::workers::Group;
use std::time::Duration;

impl Agent {
    /// A worker of this node hung: the finding side of the protocol, then the failure costs
    /// what a failure costs. Another node may have announced the hang first (a victim timed
    /// out here too): this node then answers it as a peer does, and spends no restart.
    /// Returns the next step and whether the group's processes are kept.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn on_hang<S: Source>(
        &mut self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        hung: Hung,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> (Result<(), Exit>, bool) {
        let certain = match self
            .after_hang(source, group, workers, round, &hung, signals)
            .await
        {
            Ok(Some(certain)) => certain,
            Ok(None) => {
                return self
                    .on_peer_hang_answered(group, round, carried, signals)
                    .await
            }
            Err(exit) => return (Err(exit), false),
        };
        // In process: every worker here is asked to leave; the hung one does not and is stopped
        // alone (`leave_after_hang`).
        let kept = self.cfg.in_process.is_some()
            && self
                .leave_after_hang(group, workers, round, &hung, certain)
                .await;
        let next = self
            .after_failure(
                source,
                group,
                workers,
                round,
                carried,
                (kept, Some(hung.global_rank)),
                signals,
            )
            .await;
        let keep = kept && next.is_ok();
        (next, keep)
    }

    /// Another node found a hung worker: answers the launchers' failure protocol and the hang
    /// protocol, then forms a new round (no restart spent here: the finding node spends it).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn on_peer_hang<S: Source>(
        &mut self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        what: HangNotice,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> (Result<(), Exit>, bool) {
        if let Err(exit) = self
            .after_peer_hang(source, group, workers, round, &what, signals)
            .await
        {
            return (Err(exit), false);
        }
        self.on_peer_hang_answered(group, round, carried, signals)
            .await
    }

    /// After a peer's hang was answered: in process, the workers leave their function (their
    /// collectives wait on the hung worker, which the finding node kills); otherwise the group
    /// was killed with the answer.
    async fn on_peer_hang_answered(
        &mut self,
        group: &mut Group,
        round: &Round,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> (Result<(), Exit>, bool) {
        carried.failed = None;
        if self.cfg.in_process.is_none() {
            return (Ok(()), false);
        }
        let why = format!("a hang elsewhere in round {}", round.number);
        self.leave_in_process(group, &why, true, carried, signals)
            .await
    }

    /// In process, after this node announced the hang of `hung`: every worker here is asked to
    /// leave. One that waits on the hung worker in a collective leaves within milliseconds (the
    /// wrapper breaks the wait); the hung one does not and is stopped (`leave`: once the others
    /// have left, or at the bound). The worker the monitor timed out first is not always the
    /// hung one: if it left, its error file (`respond::found` wrote it) goes to the one stopped.
    /// When the verdict is certain that the worker timed out is the hung one, it is stopped
    /// first. False when no worker could be asked.
    async fn leave_after_hang(
        &mut self,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        hung: &Hung,
        certain: bool,
    ) -> bool {
        if certain {
            group
                .stop_worker(hung.global_rank, libc::SIGKILL, Duration::ZERO)
                .await;
        }
        if group.running() == 0 {
            return false;
        }
        say("asking this node's workers to leave their training function (in process): the hung one cannot");
        let Some(stopped) = self.leave(group, true).await else {
            return false;
        };
        if !certain && !stopped.contains(&hung.global_rank) {
            let here = |rank: u32| workers.iter().find(|w| w.global_rank == rank);
            if let Some(w) = here(hung.global_rank) {
                let _ = std::fs::remove_file(&w.error_file);
            }
            for w in stopped.iter().filter_map(|&rank| here(rank)) {
                let stacks = std::fs::read_to_string(evidence::kept_stacks(w, round.number)).ok();
                let why = format!(
                    "rank {} (local rank {}, pid {}) did not leave its training function after the hang was found (the timeout fell first on rank {}, which left)",
                    w.global_rank, w.local_rank, w.pid, hung.global_rank
                );
                hang::write_error_file_why(&w.error_file, &why, stacks.as_deref());
            }
        }
        true
    }

    /// The finding side (`respond::found`), with the whole group killed once the evidence is
    /// taken (not in process: then `leave_after_hang`). Some: this node announced the hang,
    /// true when the verdict across nodes is certain the worker timed out here is the hung
    /// one; None: another node had announced it, and this node answered it.
    async fn after_hang<S: Source>(
        &mut self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        hung: &Hung,
        signals: &mut Signals,
    ) -> Result<Option<bool>, Exit> {
        let host = hostname();
        let place = place(source, round, &host);
        let in_process = self.cfg.in_process.is_some();
        let kill = async {
            if in_process {
                // Not yet: the worker the timeout fell on first may only wait on the hung one
                // (every rank stops in the same step); `leave_after_hang` tells them apart.
                return Ok(());
            }
            self.stop_group(group, libc::SIGKILL, signals).await
        };
        match respond::found(&place, workers, hung, kill).await? {
            Found::First(note) => {
                let certain = note
                    .verdict
                    .as_ref()
                    .is_some_and(|v| !v.uncertain() && v.suspect.rank == hung.global_rank);
                let found =
                    incident::Found::hang(hung, &note, self.incidents.ended_ms(round.number));
                self.incidents.found(round.number, &source.who(), found);
                let json = note.to_json();
                let parsed: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
                self.rdzv_event(
                    "rdzv.hang.found",
                    serde_json::json!({"round": round.number, "note": parsed}),
                );
                source.note("hang", &json).await;
                Ok(Some(certain))
            }
            Found::Second(first) => {
                self.after_peer_hang(source, group, workers, round, &first, signals)
                    .await?;
                Ok(None)
            }
        }
    }

    /// The answering side (`respond::answer`): this node's progress and evidence, then the
    /// group killed (not in process: its workers leave their function afterwards).
    async fn after_peer_hang<S: Source>(
        &mut self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        what: &HangNotice,
        signals: &mut Signals,
    ) -> Result<(), Exit> {
        self.rdzv_event(
            "rdzv.hang.peer",
            serde_json::json!({"round": round.number, "node": what.node, "host": what.host,
                "rank": what.rank, "what": what.what}),
        );
        let host = hostname();
        let place = place(source, round, &host);
        if let Some(store) = place.store {
            // The detecting node may have no restart left: it then asks whether a member was
            // lost, and this node, off to the next round, would not be there to say no.
            failure::answer(store, round.group_rank).await;
        }
        let in_process = self.cfg.in_process.is_some();
        let kill = async {
            if in_process {
                return Ok(());
            }
            self.stop_group(group, libc::SIGKILL, signals).await
        };
        respond::answer(&place, workers, what, kill).await
    }
}
