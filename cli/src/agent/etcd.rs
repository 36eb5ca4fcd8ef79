//! The rounds of a job on etcd: one `Rendezvous` handle for the launcher's whole life (the
//! library keeps a node's rank stable across rounds while it lives, so global rank 0 stays
//! put), the round's store for the exchange, the failure protocol and the exit barrier, and
//! the watchdog that releases the node if the launcher is killed.
//!
//! Leaving (`leave`) releases this node only: the run goes on for the others. Only a spent
//! budget (`fail_job`) or an operator's `rdzv close` closes it.

use super::barrier;
use super::connect::connect;
use super::failure;
use super::signals::Signals;
use super::source::{Exchanged, Round, Source, Stop};
use crate::exit::Exit;
use crate::output::say;
use crate::ranks::{self, NodeInfo};
use crate::watchdog::Watchdog;
use rdzv::{ErrorKind, Params, Rendezvous, Store};
use std::sync::Arc;
use std::time::Duration;

/// How much longer than `lease_ttl` a node whose restart budget is spent waits, after a
/// worker failure, for a lost member to explain it: etcd expires leases on a 500 ms tick, and
/// the expiry reaches the watch a moment later.
const LOSS_GRACE_MARGIN: Duration = Duration::from_secs(1);

pub struct Etcd {
    rdzv: Rendezvous,
    /// Releases this node if the launcher is killed (`watchdog.rs`).
    watchdog: Option<Watchdog>,
    /// This node has been a member of a round of the run.
    took_part: bool,
    /// How often the membership is checked (`--monitor-interval`).
    monitor_interval: Duration,
    /// The store of the round last formed.
    store: Option<Store>,
}

impl Etcd {
    /// Connects (waiting for etcd, `connect.rs`) and starts the watchdog when asked to.
    /// `Err`: the launcher's exit status.
    pub async fn connect(
        params: Params,
        watchdog: bool,
        monitor_interval: Duration,
        signals: &mut Signals,
    ) -> Result<Etcd, Exit> {
        let rdzv = connect(params.clone(), signals).await?;
        let watchdog = match watchdog {
            true => match Watchdog::spawn(&params) {
                Ok(mut w) => {
                    w.arm(rdzv.release_ticket().await);
                    Some(w)
                }
                Err(e) => {
                    say(format_args!(
                        "cannot start the watchdog ({e}): if this launcher is killed, the others notice when its lease expires"
                    ));
                    None
                }
            },
            false => None,
        };
        Ok(Etcd {
            rdzv,
            watchdog,
            took_part: false,
            monitor_interval,
            store: None,
        })
    }

    /// Releases this node (its keys go with its lease); the run goes on for the others.
    pub async fn leave(self) {
        match self.rdzv.shutdown().await {
            Ok(()) => {
                if let Some(w) = self.watchdog {
                    w.dismiss();
                }
            }
            // The watchdog, left to see the pipe close, tries once more.
            Err(e) => say(format_args!(
                "could not release this node cleanly: {}",
                e.message()
            )),
        }
    }

    fn ticker(&self) -> tokio::time::Interval {
        let mut tick = tokio::time::interval(self.monitor_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    }

    /// The round's store, when the round has other nodes to talk to.
    fn shared_store(&self, round: &Round) -> Option<&Store> {
        self.store.as_ref().filter(|_| round.group_world_size > 1)
    }
}

/// The job's restart count in the run's store, and the marks that make each charge and each
/// refund count once per round.
const RESTARTS: &str = "rdzv/agent/restarts";

impl Etcd {
    /// Adds `delta` to the job's restart count if this node is the first to set `mark`;
    /// returns the count either way.
    async fn count_once(&self, mark: &str, delta: i64) -> Option<u32> {
        let run = self.rdzv.run_store().await.ok()?;
        let me = self.rdzv.node_id().as_bytes();
        let first = run.compare_set(mark, b"", me).await.ok()?;
        let delta = if first == me { delta } else { 0 };
        u32::try_from(run.add(RESTARTS, delta).await.ok()?).ok()
    }
}

impl Source for Etcd {
    const SHARED: bool = true;

    async fn next_round(&mut self, signals: &mut Signals) -> Result<Round, Stop> {
        let rdzv = &self.rdzv;
        let p = rdzv.params();
        say(format_args!(
            "joining run {:?} on {} as node {} ({}..{} nodes)",
            p.run_id(),
            p.endpoints().join(","),
            rdzv.node_id(),
            p.min_nodes(),
            p.max_nodes()
        ));
        let next = rdzv.next();
        tokio::pin!(next);
        let mut interrupted = None;
        // A signal cancels the join; next then withdraws its request before returning, so no
        // round is sealed with a node that is leaving.
        let result = loop {
            tokio::select! {
                r = &mut next => break r,
                sig = signals.recv(), if interrupted.is_none() => {
                    interrupted = Some(sig);
                    rdzv.cancel();
                }
            }
        };
        if let Some(sig) = interrupted {
            return Err(Stop::Signal(sig));
        }
        match result {
            Ok((info, store)) => {
                self.took_part = true;
                self.store = Some(store);
                // The lease changes when etcd dropped the old one: keep the watchdog current.
                if let Some(w) = self.watchdog.as_mut() {
                    w.arm(self.rdzv.release_ticket().await);
                }
                Ok(Round {
                    number: info.round,
                    group_rank: info.rank,
                    group_world_size: info.world_size,
                    master_addr: info.master_addr,
                    master_port: info.master_port,
                })
            }
            // A run closed before this node ever took part is a run id in use by a job that
            // ended: an error, not the end of this job.
            Err(e) if e.kind() == ErrorKind::Closed && !self.took_part => {
                Err(Stop::Error(format!("rendezvous: {}", e.message())))
            }
            // A graceful exit ends a drained node's join, or a late node's in a closed run.
            Err(e)
                if e.kind() == ErrorKind::GracefulExit
                    && rdzv.is_draining().await.unwrap_or(false) =>
            {
                Err(Stop::Drained)
            }
            Err(e) if matches!(e.kind(), ErrorKind::Closed | ErrorKind::GracefulExit) => {
                Err(Stop::Closed(rdzv.failure().await.ok().flatten()))
            }
            Err(e) => Err(Stop::Error(format!("rendezvous: {}", e.message()))),
        }
    }

    async fn exchange(
        &self,
        round: &Round,
        me: NodeInfo,
        signals: &mut Signals,
    ) -> Result<Exchanged, Stop> {
        let Some(store) = &self.store else {
            return Err(Stop::Error(
                "exchanging worker counts: no round formed".into(),
            ));
        };
        let store_error = |e: rdzv::Error| match e.kind() {
            ErrorKind::Closed => Stop::Closed(None),
            _ => Stop::Error(format!("exchanging worker counts: {}", e.message())),
        };
        store
            .set(&ranks::key(me.group_rank), &me.to_json())
            .await
            .map_err(store_error)?;
        let keys: Vec<String> = (0..round.group_world_size).map(ranks::key).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = tokio::select! {
            r = store.multi_get(&keys, None) => r.map_err(store_error)?,
            change = self.membership_change(false) => return Err(change),
            sig = signals.recv() => return Err(Stop::Signal(sig)),
        };
        let infos = values
            .iter()
            .map(|v| NodeInfo::parse(v))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Stop::Error("exchanging worker counts: a node published an unreadable entry".into())
            })?;
        Ok(Exchanged {
            workers: ranks::assign(&infos, round.group_rank),
            restarts: ranks::job_restarts(&infos),
        })
    }

    /// Every monitor interval: `num_lost` (answered from a watch, free), with `waiting` also
    /// `num_waiting` (one count read), and at most once a second `is_closed`.
    async fn membership_change(&self, waiting: bool) -> Stop {
        let rdzv = &self.rdzv;
        let mut tick = self.ticker();
        let mut complained = false;
        loop {
            tick.tick().await;
            let counts = async {
                let lost = rdzv.num_lost().await?;
                let waiting = match waiting {
                    true => rdzv.num_waiting().await?,
                    false => 0,
                };
                // All three answer from the library's membership watch: a tick costs etcd
                // nothing while it is in sync.
                let closed = rdzv.is_closed().await?;
                Ok::<_, rdzv::Error>((lost, waiting, closed))
            };
            match counts.await {
                Ok((_, _, true)) => return Stop::Closed(rdzv.failure().await.ok().flatten()),
                // A drained node counts itself lost: it leaves instead of re-forming.
                Ok((lost, _, _)) if lost > 0 => match rdzv.is_draining().await {
                    Ok(true) => return Stop::Drained,
                    _ => {
                        return Stop::Changed(format!(
                            "{lost} member(s) of the round lost or leaving"
                        ))
                    }
                },
                Ok((_, waiting, _)) if waiting > 0 => {
                    return Stop::Changed(format!("{waiting} node(s) waiting to join"))
                }
                Ok(_) => complained = false,
                Err(e) if !complained => {
                    complained = true;
                    say(format_args!(
                        "cannot check the membership (will keep trying): {}",
                        e.message()
                    ));
                }
                Err(_) => {}
            }
        }
    }

    async fn peer_failed(&self, round: &Round) -> Stop {
        match self.shared_store(round) {
            Some(store) => failure::answer_and_await(store, round.group_rank).await,
            None => std::future::pending().await,
        }
    }

    async fn members(&self) -> Option<Arc<[String]>> {
        self.rdzv.members().await.ok()
    }

    fn shared(&self, round: &Round) -> Option<&Store> {
        self.shared_store(round)
    }

    fn who(&self) -> String {
        format!("{}/{}", crate::host::hostname(), self.rdzv.node_id())
    }

    async fn run_store(&self) -> Option<rdzv::Store> {
        self.rdzv.run_store().await.ok()
    }

    async fn note(&self, key: &str, value: &str) {
        let written = match self.rdzv.run_store().await {
            Ok(run) => run.set(&format!("notes/{key}"), value.as_bytes()).await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            say(format_args!(
                "could not leave the note {key:?} for rdzv status: {}",
                e.message()
            ));
        }
    }

    async fn charge_job(&self, round: &Round) -> Option<u32> {
        self.count_once(&format!("{RESTARTS}/round/{}", round.number), 1)
            .await
    }

    async fn refund_job(&self, charged: u64) -> Option<u32> {
        self.count_once(&format!("{RESTARTS}/refund/{charged}"), -1)
            .await
    }

    async fn job_restarts(&self) -> Option<u32> {
        let run = self.rdzv.run_store().await.ok()?;
        u32::try_from(run.add(RESTARTS, 0).await.ok()?).ok()
    }

    async fn drain_self(&self, why: &str) {
        if let Err(e) = self.rdzv.drain(why).await {
            say(format_args!("could not drain this node: {}", e.message()));
        }
    }

    async fn loss_seen(&self) -> Option<String> {
        match self.rdzv.num_lost().await {
            Ok(lost) if lost > 0 => Some(format!("{lost} member(s) of the round were lost")),
            _ => None,
        }
    }

    async fn wait_for_loss(&self, round: &Round, why: &str, signals: &mut Signals) -> Option<Stop> {
        let store = self.shared_store(round)?;
        let grace = self.rdzv.params().lease_ttl() + LOSS_GRACE_MARGIN;
        say(format_args!(
            "no restart left: asking the other {} node(s) whether one was lost, which would explain the failure (up to {:.0} s, lease_ttl)",
            round.group_world_size - 1,
            grace.as_secs_f64()
        ));
        tokio::select! {
            change = self.membership_change(false) => Some(change),
            sig = signals.recv() => Some(Stop::Signal(sig)),
            r = failure::ask_others(store, round, why, grace) => {
                match r {
                    Ok(()) => say("every other node answered: none was lost"),
                    Err(e) => say(format_args!("not every node answered ({}): the job failed", e.message())),
                }
                None
            }
        }
    }

    /// The verdict in the round's store (the other launchers wait on it), then the run closed
    /// as failed, so that a node in another state (in a rendezvous, its workers done) learns it
    /// too.
    async fn fail_job(&self, why: &str) {
        let why = match &self.store {
            Some(store) => failure::declare(store, why).await,
            None => why.to_string(),
        };
        if let Err(e) = self.rdzv.set_failed(&why).await {
            say(format_args!("could not close the run: {}", e.message()));
        }
    }

    async fn exit_barrier(&self, round: &Round, timeout: Duration, signals: &mut Signals) -> Exit {
        match self.shared_store(round) {
            Some(store) => {
                let peer_failed = self.peer_failed(round);
                barrier::wait(store, round.group_world_size, timeout, peer_failed, signals).await
            }
            None => Exit::Success,
        }
    }
}
