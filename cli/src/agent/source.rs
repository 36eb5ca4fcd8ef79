//! Where the agent's rounds come from: a `Source`. The agent's loop is written once against
//! it; what differs between a job on etcd (`etcd::Etcd`) and one without a rendezvous
//! (`fixed::Fixed`: `--standalone`, torchrun's static backend) lives in the two
//! implementations, never in the loop.
//!
//! A source forms rounds, assigns worker ranks in each, tells the agent when a round must end
//! from outside it (the membership changed, another node's job failed), carries the launchers'
//! job-failure protocol (`failure.rs`) and holds the exit barrier. A fixed layout has no one to
//! talk to: its rounds are all the same, nothing ends them from outside, a failure is this
//! node's alone, and nobody is waited for at the end.

use super::signals::Signals;
use crate::exit::Exit;
use crate::ranks::{NodeInfo, WorkerRanks};
use std::sync::Arc;
use std::time::Duration;

/// What the exchange gives: this node's workers' ranks, and the restarts the job had spent
/// when the round formed (`ranks::job_restarts`), the same on every node of the round.
pub struct Exchanged {
    pub workers: Vec<WorkerRanks>,
    pub restarts: Option<u32>,
}

/// A formed round, as the workers need it.
pub struct Round {
    pub number: u64,
    pub group_rank: u32,
    pub group_world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
}

/// Why the agent stops waiting for something.
pub enum Stop {
    Signal(i32),
    /// The run is closed: by an operator or a finished job (None), or because the job failed
    /// on some node (why, as `Rendezvous::set_failed` recorded it).
    Closed(Option<String>),
    /// Another node's restart budget is spent and no member was lost: the job failed there
    /// (why), so it fails here too, at once, whatever this node's workers do.
    JobFailed(String),
    /// Members were lost or nodes wait: form a new round.
    Changed(String),
    /// This node was drained (a planned departure): stop the workers and leave, exit 0.
    Drained,
    Error(String),
}

/// A source of rounds. The agent runs on one thread (`block_on` on the main thread, which
/// spawns the workers), so its futures need not be `Send`.
pub trait Source {
    /// Whether a job failure here ends the run for every launcher (on etcd), not only this one.
    const SHARED: bool;

    /// RENDEZVOUS: the next round. `Err`: stop instead (a signal, the run closed, this node
    /// drained, an error).
    async fn next_round(&mut self, signals: &mut Signals) -> Result<Round, Stop>;

    /// EXCHANGE: publishes this node's entry (`me`), reads every node's, and assigns the
    /// workers' ranks. A member lost meanwhile is `Stop::Changed`.
    async fn exchange(
        &self,
        round: &Round,
        me: NodeInfo,
        signals: &mut Signals,
    ) -> Result<Exchanged, Stop>;

    /// Resolves when the round must be re-formed (members lost, or with `waiting` also nodes
    /// waiting to join), the run was closed or this node drained. Never resolves on a fixed
    /// layout.
    async fn membership_change(&self, waiting: bool) -> Stop;

    /// Resolves when another node declares the job failed (`failure.rs`), having answered its
    /// question first. Never resolves for a round of one node or on a fixed layout.
    async fn peer_failed(&self, round: &Round) -> Stop;

    /// The current round's members, when there is a rendezvous to ask.
    async fn members(&self) -> Option<Arc<[String]>>;

    /// A loss of a member already seen (free: from a watch), which would explain a failure.
    async fn loss_seen(&self) -> Option<String>;

    /// With no restart left: waits for a loss that would explain the failure `why`, asking
    /// the other launchers (`failure.rs`). `None`: none was lost, the job failed;
    /// `Some(Stop::Changed)`: one was; any other stop ends the wait.
    async fn wait_for_loss(&self, round: &Round, why: &str, signals: &mut Signals) -> Option<Stop>;

    /// Ends the job as failed for every launcher of the run (`why`: the root cause).
    async fn fail_job(&self, why: &str);

    /// The round's store, when other launchers share it (the hang monitor's protocol and
    /// learned timeouts go through it). None on a fixed layout or in a round of one node.
    fn shared(&self, round: &Round) -> Option<&rdzv::Store>;

    /// This launcher as the run's notes name it: `HOST/NODE_ID` (two launchers may share a
    /// host).
    fn who(&self) -> String;

    /// The run's store (the incident records go there), when there is a rendezvous to ask.
    async fn run_store(&self) -> Option<rdzv::Store>;

    /// Leaves a note for operators: `notes/{key}` in the run's store, shown by `rdzv status`
    /// (best effort: a note is never worth failing for). Nothing on a fixed layout.
    async fn note(&self, key: &str, value: &str);

    /// Charges one restart to the job's budget in the run's store, once per round however many
    /// nodes charge it (`round`: the round that failed); returns the restarts the job has
    /// spent. None on a fixed layout or when etcd cannot say.
    async fn charge_job(&self, round: &Round) -> Option<u32>;

    /// Gives back the restart charged for round `charged` (a member's loss explained the
    /// failure), once however many nodes give it back; returns the restarts the job has spent.
    async fn refund_job(&self, charged: u64) -> Option<u32>;

    /// The restarts the job has spent, as the run's store says (None on a fixed layout).
    async fn job_restarts(&self) -> Option<u32>;

    /// Drains this node with `why` (a failed health check): the others re-form without it at
    /// once. Nothing to do on a fixed layout.
    async fn drain_self(&self, why: &str);

    /// EXIT BARRIER: keeps a node whose workers all succeeded until every node's did, or
    /// `timeout` passes, or the job fails elsewhere. Returns the launcher's exit status.
    async fn exit_barrier(&self, round: &Round, timeout: Duration, signals: &mut Signals) -> Exit;
}
