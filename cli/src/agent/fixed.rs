//! The rounds of a job without a rendezvous (`--standalone`, or torchrun's static backend):
//! every round is the same fixed layout, with a fresh free port for rank 0's store when none
//! was given. There is no one to talk to: every node runs as many workers as this one, nothing
//! ends a round from outside, a failure is this node's alone, and nobody is waited for.

use super::signals::Signals;
use super::source::{Exchanged, Round, Source, Stop};
use crate::exit::Exit;
use crate::ranks::{self, NodeInfo};
use crate::settings::rendezvous::StaticRound;
use std::sync::Arc;
use std::time::Duration;

pub struct Fixed {
    layout: StaticRound,
    /// Rounds formed so far (the next one's number).
    rounds: u64,
}

impl Fixed {
    pub fn new(layout: StaticRound) -> Fixed {
        Fixed { layout, rounds: 0 }
    }
}

impl Source for Fixed {
    const SHARED: bool = false;

    async fn next_round(&mut self, _signals: &mut Signals) -> Result<Round, Stop> {
        let number = self.rounds;
        self.rounds += 1;
        Ok(Round {
            number,
            group_rank: self.layout.node_rank,
            group_world_size: self.layout.nnodes,
            master_addr: self.layout.master_addr.clone(),
            master_port: self
                .layout
                .master_port
                .unwrap_or_else(rdzv::free_master_port),
        })
    }

    async fn exchange(
        &self,
        round: &Round,
        me: NodeInfo,
        _signals: &mut Signals,
    ) -> Result<Exchanged, Stop> {
        let nodes: Vec<NodeInfo> = (0..round.group_world_size)
            .map(|group_rank| NodeInfo {
                group_rank,
                ..me.clone()
            })
            .collect();
        Ok(Exchanged {
            workers: ranks::assign(&nodes, round.group_rank),
            restarts: None,
        })
    }

    async fn membership_change(&self, _waiting: bool) -> Stop {
        std::future::pending().await
    }

    async fn peer_failed(&self, _round: &Round) -> Stop {
        std::future::pending().await
    }

    async fn members(&self) -> Option<Arc<[String]>> {
        None
    }

    async fn loss_seen(&self) -> Option<String> {
        None
    }

    async fn wait_for_loss(&self, _: &Round, _: &str, _: &mut Signals) -> Option<Stop> {
        None
    }

    async fn fail_job(&self, _why: &str) {}

    fn shared(&self, _round: &Round) -> Option<&rdzv::Store> {
        None
    }

    async fn drain_self(&self, _why: &str) {}

    async fn run_store(&self) -> Option<rdzv::Store> {
        None
    }

    async fn note(&self, _key: &str, _value: &str) {}

    fn who(&self) -> String {
        crate::host::hostname()
    }

    async fn charge_job(&self, _round: &Round) -> Option<u32> {
        None
    }

    async fn refund_job(&self, _charged: u64) -> Option<u32> {
        None
    }

    async fn job_restarts(&self) -> Option<u32> {
        None
    }

    async fn exit_barrier(&self, _: &Round, _: Duration, _: &mut Signals) -> Exit {
        Exit::Success
    }
}
