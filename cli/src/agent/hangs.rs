//! A hang, found by this node's monitor or announced by another node's: the agent's side of
//! the hang protocol (`monitor::respond`). Without `--in-process-restart` this node's group is
//! killed once its evidence is taken; with it, only the hung worker is, and the others leave
//! their training function and stay for the next round (`inprocess`).

use super::source::Round;
use super::{failure, incident, place, Agent, Carried, Signals, Source};
use crate::exit::Exit;
use crate::host::hostname;
use crate::monitor::hang::{HangNotice, Hung};
use crate::monitor::pages::Watched;
use crate::monitor::respond::{self, Found};
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
        match self
            .after_hang(source, group, workers, round, &hung, signals)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return self
                    .on_peer_hang_answered(group, round, carried, signals)
                    .await
            }
            Err(exit) => return (Err(exit), false),
        }
        // In process: the hung worker alone was killed; its peers here, whose collectives with
        // it have failed, leave their function as after a crash.
        let kept = self.cfg.in_process.is_some() && self.leave_after_failure(group, true).await;
        let next = self
            .after_failure(source, group, workers, round, carried, kept, signals)
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

    /// The finding side (`respond::found`), with the hung worker killed once the evidence is
    /// taken (in process), or the whole group (otherwise). True: this node announced the
    /// hang; false: another node had, and this node answered it.
    async fn after_hang<S: Source>(
        &mut self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        hung: &Hung,
        signals: &mut Signals,
    ) -> Result<bool, Exit> {
        let host = hostname();
        let place = place(source, round, &host);
        let in_process = self.cfg.in_process.is_some();
        let kill = async {
            if in_process {
                group
                    .stop_worker(hung.global_rank, libc::SIGKILL, Duration::ZERO)
                    .await;
                return Ok(());
            }
            self.stop_group(group, libc::SIGKILL, signals).await
        };
        match respond::found(&place, workers, hung, kill).await? {
            Found::First(note) => {
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
                Ok(true)
            }
            Found::Second(first) => {
                self.after_peer_hang(source, group, workers, round, &first, signals)
                    .await?;
                Ok(false)
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
