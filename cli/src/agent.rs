//! The elastic agent: torchelastic's `SimpleElasticAgent` loop on rdzv's rendezvous.
//!
//! ```text
//!   ┌─> RENDEZVOUS ──> EXCHANGE ──> RUNNING ──(all exit 0)──> EXIT BARRIER ──> exit 0
//!   │   (next)         (ranks via    │
//!   │                   the store)   ├─(a worker fails, budget left)──> stop, restart_count += 1 ─┐
//!   │                                ├─(nodes waiting or lost)────────> stop ────────────────────┤
//!   │                                ├─(a worker fails, budget spent)─> stop, close run, exit 1
//!   │                                ├─(run closed by someone else)───> stop, exit 0
//!   │                                └─(SIGINT/SIGTERM/SIGHUP/SIGQUIT)─> forward, grace, SIGKILL,
//!   │                                                                    release node, exit 128+N
//!   └────────────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Only failures spend the restart budget; membership changes do not, and neither does a
//! worker failure that a member's loss explains (`Agent::failed`: a peer's death makes this
//! node's workers fail on a broken connection, often before the loss is seen). The node keeps one
//! rendezvous handle for its whole life, so its node rank (and so global rank 0) stays put
//! across rounds. Leaving never closes the run for others; only a spent budget (or an
//! operator's `rdzv close`) does.

use crate::exit::Exit;
use crate::output::say;
use crate::ranks::{self, NodeInfo, WorkerRanks};
use crate::settings::rendezvous::Rendezvous as Mode;
use crate::settings::RunConfig;
use crate::watchdog::Watchdog;
use crate::workers::env::GroupSpec;
use crate::workers::logs::LogPlan;
use crate::workers::report::Failure;
use crate::workers::Group;
use rdzv::{ErrorKind, Rendezvous, Store};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

/// The signals the launcher handles and forwards (torchrun's `--signals-to-handle`).
pub struct Signals {
    streams: Vec<(i32, Signal)>,
}

impl Signals {
    /// Must be called inside the runtime, before anything that should be interruptible.
    pub fn install(which: &[i32]) -> std::io::Result<Signals> {
        let mut streams = Vec::new();
        for &sig in which {
            streams.push((sig, signal(SignalKind::from_raw(sig))?));
        }
        Ok(Signals { streams })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> i32 {
        let waits = self.streams.iter_mut().map(|(sig, s)| {
            let sig = *sig;
            Box::pin(async move {
                s.recv().await;
                sig
            })
        });
        futures_select_all(waits).await
    }
}

/// The first of several futures to finish (a small `select_all`, to avoid a dependency).
async fn futures_select_all<F: std::future::Future<Output = i32> + Unpin>(
    futures: impl IntoIterator<Item = F>,
) -> i32 {
    let mut futures: Vec<F> = futures.into_iter().collect();
    std::future::poll_fn(move |cx| {
        for f in futures.iter_mut() {
            if let std::task::Poll::Ready(v) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The closed flag is an etcd read: checked at most this often, whatever the monitor interval.
const CLOSED_CHECK: Duration = Duration::from_secs(1);

/// How much longer than `lease_ttl` a node whose restart budget is spent waits, after a
/// worker failure, for a lost member to explain it: etcd expires leases on a 500 ms tick, and
/// the expiry reaches the watch a moment later.
const LOSS_GRACE_MARGIN: Duration = Duration::from_secs(1);

/// Round-store keys of a failing job (`Agent::failed`, `Agent::peer_failed`): the first node
/// whose budget is spent writes why under `FAILING`; every live launcher answers under
/// `HERE/{node rank}`; the verdict, the job failed, goes under `FAILED` before the run is
/// closed as failed.
const FAILING: &str = "rdzv/agent/failing";
const HERE: &str = "rdzv/agent/here";
const FAILED: &str = "rdzv/agent/failed";

/// A store wait that stands for "until it happens": renewed when it times out.
const LONG_WAIT: Duration = Duration::from_secs(3600);

/// The store keys of the exit barrier (torchelastic's terminal-state prefix).
const BARRIER_COUNT: &str = "torchelastic/agent/terminal_state/count";
const BARRIER_DONE: &str = "torchelastic/agent/terminal_state/done";

/// A formed round, as the workers need it.
struct Round {
    number: u64,
    group_rank: u32,
    group_world_size: u32,
    master_addr: String,
    master_port: u16,
    store: Option<Store>,
}

/// Why the agent stops waiting for something.
enum Stop {
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

/// How a running group ended.
enum Outcome {
    Succeeded,
    Failed,
    Stop(Stop),
}

pub struct Agent {
    cfg: RunConfig,
    rdzv: Option<Rendezvous>,
    logs: LogPlan,
    /// The log directory was made up by the launcher (no --log-dir): removed after success.
    temporary_logs: bool,
    extra_env: Vec<(String, String)>,
    restart_count: u32,
    standalone_round: u64,
    /// This node has been a member of a round of the run.
    took_part: bool,
    /// The failure report named an error file (in the log directory, which is then kept).
    reported_error_file: bool,
    /// Releases this node if the launcher is killed (`watchdog.rs`).
    watchdog: Option<Watchdog>,
    /// `--numa-binding`: the CPUs of each local rank (empty: no binding).
    cpu_binding: Vec<crate::host::cpus::Cpus>,
}

/// What the agent does with a worker failure.
enum Verdict {
    /// A member of the round was lost: a membership change, no restart spent.
    Loss(String),
    /// A restart was spent; refunded if the next round shows that a member of these was lost.
    Charged(Option<Arc<[String]>>),
    /// No restart left and no loss to explain the failure: the job failed.
    Spent,
    Stop(Stop),
}

impl Agent {
    pub fn new(
        cfg: RunConfig,
        cpu_binding: Vec<crate::host::cpus::Cpus>,
    ) -> std::io::Result<Agent> {
        let tag = format!(
            "{}_{:08x}",
            sanitize(&cfg.run_id),
            crate::host::random_u64() as u32
        );
        let (run_dir, temporary_logs) = match &cfg.log_dir {
            Some(base) => (base.join(tag), false),
            None => (std::env::temp_dir().join(format!("rdzv_{tag}")), true),
        };
        std::fs::create_dir_all(&run_dir)?;
        if cfg.keeps_files() {
            say(format_args!("worker logs in {}", run_dir.display()));
        }
        let mut extra_env = Vec::new();
        if std::env::var_os("OMP_NUM_THREADS").is_none() && cfg.nproc_per_node > 1 {
            say("setting OMP_NUM_THREADS=1 for each worker so they do not overload the machine; set it to tune");
            extra_env.push(("OMP_NUM_THREADS".to_string(), "1".to_string()));
        }
        extra_env.push((
            "TORCHELASTIC_SIGNALS_TO_HANDLE".to_string(),
            cfg.signals_to_handle.clone(),
        ));
        let logs = LogPlan::new(&cfg, run_dir);
        Ok(Agent {
            cfg,
            rdzv: None,
            logs,
            temporary_logs,
            extra_env,
            restart_count: 0,
            standalone_round: 0,
            took_part: false,
            reported_error_file: false,
            watchdog: None,
            cpu_binding,
        })
    }

    /// Runs the job to its end and returns the launcher's exit status.
    pub async fn run(mut self, signals: &mut Signals) -> Exit {
        let status = self.connect_and_run(signals).await;
        // A made-up log directory goes, unless the report points into it.
        if self.temporary_logs && !self.reported_error_file {
            let _ = std::fs::remove_dir_all(&self.logs.run_dir);
        }
        status
    }

    async fn connect_and_run(&mut self, signals: &mut Signals) -> Exit {
        if let Mode::Etcd(params) = &self.cfg.rendezvous {
            let params = (**params).clone();
            match connect(params.clone(), signals).await {
                Ok(r) => {
                    if self.cfg.watchdog {
                        match Watchdog::spawn(&params) {
                            Ok(mut w) => {
                                w.arm(r.release_ticket().await);
                                self.watchdog = Some(w);
                            }
                            Err(e) => say(format_args!(
                                "cannot start the watchdog ({e}): if this launcher is killed, the others notice when its lease expires"
                            )),
                        }
                    }
                    self.rdzv = Some(r);
                }
                Err(status) => return status,
            }
        }
        let status = self.agent_loop(signals).await;
        if let Some(rdzv) = self.rdzv.take() {
            // Releases this node only: the run goes on for the others.
            match rdzv.shutdown().await {
                Ok(()) => {
                    if let Some(w) = self.watchdog.take() {
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
        status
    }

    async fn agent_loop(&mut self, signals: &mut Signals) -> Exit {
        // The last group's failures, reported if the job ends before a group succeeds.
        let mut failed: Option<Vec<Failure>> = None;
        // The members of the round whose failure spent the last restart.
        let mut charged: Option<Arc<[String]>> = None;
        loop {
            let round = match self.rendezvous(signals).await {
                Ok(round) => round,
                Err(stop) => return self.stopped(stop, failed.as_deref()),
            };
            if let Some(before) = charged.take() {
                self.refund_if_lost(&before).await;
            }
            let workers = match self.exchange(&round, signals).await {
                Ok(workers) => workers,
                Err(Stop::Changed(why)) => {
                    say(format_args!(
                        "{why} while exchanging worker counts: forming a new round"
                    ));
                    continue;
                }
                Err(stop) => return self.stopped(stop, failed.as_deref()),
            };
            let first = &workers[0];
            say(format_args!(
                "round {} formed: node rank {} of {}, world size {}, workers' ranks {}..{}, master {}:{}",
                round.number,
                round.group_rank,
                round.group_world_size,
                first.world_size,
                first.global_rank,
                first.global_rank + workers.len() as u32 - 1,
                round.master_addr,
                round.master_port
            ));
            let spec = GroupSpec {
                command: &self.cfg.program.command,
                role: &self.cfg.role,
                run_id: &self.cfg.run_id,
                group_rank: round.group_rank,
                group_world_size: round.group_world_size,
                master_addr: &round.master_addr,
                master_port: round.master_port,
                restart_count: self.restart_count,
                max_restarts: self.cfg.max_restarts,
                extra_env: &self.extra_env,
                framework: self.cfg.framework,
                virtual_local_rank: self.cfg.virtual_local_rank,
                cpu_binding: &self.cpu_binding,
            };
            let mut group = match Group::start(&spec, &workers, &self.logs) {
                Ok(group) => group,
                Err(e) => {
                    crate::output::error(e);
                    return Exit::Failure;
                }
            };
            let outcome = self.monitor(&mut group, &round, signals).await;
            match outcome {
                Outcome::Succeeded => {
                    group.finish().await;
                    say("all workers of this node finished successfully");
                    return self.exit_barrier(&round, signals).await;
                }
                Outcome::Failed => {
                    if let Some(sig) = self.stop(&mut group, libc::SIGTERM, signals).await {
                        return Exit::Signal(sig);
                    }
                    let failures = group.failures();
                    let why = crate::workers::report::summary(&failures);
                    match self.failed(&round, &why, signals).await {
                        Verdict::Loss(why) => {
                            say(format_args!(
                                "rank {} failed and {why}: a membership change, forming a new round (no restart spent)",
                                failures[0].global_rank
                            ));
                            failed = None;
                            continue;
                        }
                        Verdict::Charged(members) => {
                            say(format_args!(
                                "restarting the worker group (restart {} of {}) after rank {} failed",
                                self.restart_count, self.cfg.max_restarts, failures[0].global_rank
                            ));
                            charged = members;
                            failed = Some(failures);
                            continue;
                        }
                        Verdict::Stop(Stop::Signal(sig)) => {
                            return self.stopped(Stop::Signal(sig), None)
                        }
                        Verdict::Stop(Stop::Drained) => return self.stopped(Stop::Drained, None),
                        Verdict::Stop(_) | Verdict::Spent => {}
                    }
                    say(format_args!(
                        "restart budget spent ({} of {} restarts used): the job failed{}",
                        self.restart_count,
                        self.cfg.max_restarts,
                        if self.rdzv.is_some() {
                            "; closing the run as failed"
                        } else {
                            ""
                        }
                    ));
                    self.fail_job(&round, &why).await;
                    self.reported_error_file = report(&self.cfg.program, &failures);
                    return Exit::Failure;
                }
                Outcome::Stop(Stop::Changed(why)) => {
                    say(format_args!(
                        "{why}: stopping the workers to form a new round (no restart spent)"
                    ));
                    if let Some(sig) = self.stop(&mut group, libc::SIGTERM, signals).await {
                        return Exit::Signal(sig);
                    }
                    failed = None;
                }
                Outcome::Stop(Stop::Signal(sig)) => {
                    say(format_args!(
                        "received {}: forwarding it to the workers",
                        crate::exit::signal_name(sig)
                    ));
                    self.stop(&mut group, sig, signals).await;
                    return Exit::Signal(sig);
                }
                Outcome::Stop(Stop::Drained) => {
                    say("this node was drained (a planned departure): stopping the workers");
                    if let Some(sig) = self.stop(&mut group, libc::SIGTERM, signals).await {
                        return Exit::Signal(sig);
                    }
                    return self.stopped(Stop::Drained, None);
                }
                Outcome::Stop(stop @ (Stop::Closed(_) | Stop::JobFailed(_))) => {
                    say(match &stop {
                        Stop::Closed(None) => "the run was closed: stopping the workers",
                        _ => "the job failed on another node: stopping the workers",
                    });
                    if let Some(sig) = self.stop(&mut group, libc::SIGTERM, signals).await {
                        return Exit::Signal(sig);
                    }
                    return self.stopped(stop, None);
                }
                Outcome::Stop(stop @ Stop::Error(_)) => {
                    if let Some(sig) = self.stop(&mut group, libc::SIGTERM, signals).await {
                        return Exit::Signal(sig);
                    }
                    return self.stopped(stop, None);
                }
            }
        }
    }

    /// Decides what a worker failure costs (the group is stopped already). A member lost
    /// within `lease_ttl` of the failure explains it: a peer's death breaks this node's
    /// workers' connections, and that must not spend a restart. Which is seen first, the
    /// broken connection or the loss, is a race (the loss comes within a round trip when the
    /// peer's watchdog releases it, within `lease_ttl` when its machine vanished), so:
    /// - a loss seen already: no restart spent;
    /// - otherwise, with restarts left: one is spent at once (a real failure is not slowed)
    ///   and refunded when the next round shows that a member of this one was lost
    ///   (`refund_if_lost`);
    /// - with none left: the job fails unless a member is lost. Rather than wait `lease_ttl`
    ///   for a loss that will not come, the node asks the others' launchers through the
    ///   round's store (`FAILING`); each live one answers at once (`peer_failed`). When every
    ///   member has answered, none is lost and the job failed: within a round trip on a
    ///   healthy job. A member that cannot answer (its machine gone, its launcher killed
    ///   without a watchdog) is waited for until its lease expires, which is then the loss.
    async fn failed(&mut self, round: &Round, why: &str, signals: &mut Signals) -> Verdict {
        let Some(rdzv) = &self.rdzv else {
            return self.charge(None);
        };
        if let Ok(lost) = rdzv.num_lost().await {
            if lost > 0 {
                return Verdict::Loss(format!("{lost} member(s) of the round were lost"));
            }
        }
        if self.restart_count < self.cfg.max_restarts {
            let members = rdzv.members().await.ok();
            return self.charge(members);
        }
        let others = round.group_world_size.saturating_sub(1);
        let (Some(store), true) = (&round.store, others > 0) else {
            return Verdict::Spent;
        };
        let grace = rdzv.params().lease_ttl + LOSS_GRACE_MARGIN;
        say(format_args!(
            "no restart left: asking the other {others} node(s) whether one was lost, which would explain the failure (up to {:.0} s, lease_ttl)",
            grace.as_secs_f64()
        ));
        let here: Vec<String> = (0..round.group_world_size)
            .filter(|&r| r != round.group_rank)
            .map(here_key)
            .collect();
        let here: Vec<&str> = here.iter().map(String::as_str).collect();
        let answered = async {
            store.compare_set(FAILING, b"", why.as_bytes()).await?;
            store.set(&here_key(round.group_rank), b"1").await?;
            store.wait(&here, Some(grace)).await
        };
        let mut tick = self.ticker();
        tokio::select! {
            change = self.membership_change(&mut tick, false) => match change {
                Stop::Changed(why) => Verdict::Loss(why),
                other => Verdict::Stop(other),
            },
            sig = signals.recv() => Verdict::Stop(Stop::Signal(sig)),
            r = answered => {
                match r {
                    Ok(()) => say("every other node answered: none was lost"),
                    Err(e) => say(format_args!("not every node answered ({}): the job failed", e.message())),
                }
                Verdict::Spent
            }
        }
    }

    /// Ends the job as failed: the verdict in the round's store (the other launchers wait on
    /// it, `peer_failed`), then the run closed as failed, so that a node in another state (in
    /// a rendezvous, its workers done) learns it too.
    async fn fail_job(&self, round: &Round, why: &str) {
        let Some(rdzv) = &self.rdzv else { return };
        let mut why = why.to_string();
        if let Some(store) = &round.store {
            // The first verdict stands: every node reports the same failure.
            match store.compare_set(FAILED, b"", why.as_bytes()).await {
                Ok(first) => why = String::from_utf8_lossy(&first).into_owned(),
                Err(e) => say(format_args!(
                    "could not tell the other nodes: {}",
                    e.message()
                )),
            }
        }
        if let Err(e) = rdzv.set_failed(&why).await {
            say(format_args!("could not close the run: {}", e.message()));
        }
    }

    /// Resolves when another node declares the job failed (`failed`, `fail_job`): answers its
    /// question first (this launcher is alive), then waits for the verdict. Never resolves
    /// for a round without a store or of one node, or when the store fails (the run closed:
    /// the membership check sees that).
    async fn peer_failed(&self, round: &Round) -> Stop {
        let Some(store) = round.store.as_ref().filter(|_| round.group_world_size > 1) else {
            return std::future::pending().await;
        };
        let until = |key: &'static str| async move {
            loop {
                match store.get(key, Some(LONG_WAIT)).await {
                    Ok(value) => return String::from_utf8_lossy(&value).into_owned(),
                    Err(e) if e.kind() == ErrorKind::Timeout => continue,
                    Err(_) => std::future::pending::<()>().await,
                }
            }
        };
        let why = until(FAILING).await;
        say(format_args!(
            "another node's restart budget is spent ({why}): answering that this node is alive"
        ));
        if let Err(e) = store.set(&here_key(round.group_rank), b"1").await {
            say(format_args!("could not answer: {}", e.message()));
        }
        Stop::JobFailed(until(FAILED).await)
    }

    fn charge(&mut self, members: Option<Arc<[String]>>) -> Verdict {
        if self.restart_count < self.cfg.max_restarts {
            self.restart_count += 1;
            Verdict::Charged(members)
        } else {
            Verdict::Spent
        }
    }

    /// Gives back the restart the last failure spent if the round just formed lacks a member
    /// of the round that failed: that member's loss broke the workers.
    async fn refund_if_lost(&mut self, before: &[String]) {
        let Some(rdzv) = &self.rdzv else { return };
        let Ok(now) = rdzv.members().await else {
            return;
        };
        let now: HashSet<&str> = now.iter().map(String::as_str).collect();
        let gone = before.iter().filter(|m| !now.contains(m.as_str())).count();
        if gone > 0 && self.restart_count > 0 {
            self.restart_count -= 1;
            say(format_args!(
                "{gone} member(s) of the last round were lost: the failure is put down to that, restart refunded ({} of {} used)",
                self.restart_count, self.cfg.max_restarts
            ));
        }
    }

    /// Stops the group with `signal` (grace period, then SIGKILL). A signal to the launcher
    /// meanwhile cuts the grace short and is returned: the launcher then leaves.
    async fn stop(&self, group: &mut Group, signal: i32, signals: &mut Signals) -> Option<i32> {
        let interrupted = group
            .stop(signal, self.cfg.shutdown_timeout, signals.recv())
            .await;
        if let Some(sig) = interrupted {
            say(format_args!(
                "received {} while stopping the workers: leaving",
                crate::exit::signal_name(sig)
            ));
        }
        interrupted
    }

    /// The exit status for a stop outside a running group.
    fn stopped(&mut self, stop: Stop, failed: Option<&[Failure]>) -> Exit {
        match stop {
            Stop::Signal(sig) => {
                say(format_args!(
                    "received {}: leaving",
                    crate::exit::signal_name(sig)
                ));
                Exit::Signal(sig)
            }
            Stop::Closed(None) => match failed {
                Some(failures) => {
                    say("the run was closed before the workers could be restarted");
                    self.reported_error_file = report(&self.cfg.program, failures);
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
                    self.reported_error_file = report(&self.cfg.program, failures);
                }
                crate::output::error(format_args!("the job failed on another node: {why}"));
                Exit::Failure
            }
            Stop::Drained => {
                say("this node was drained: leaving the run, which goes on without it");
                Exit::Success
            }
            Stop::Changed(why) => {
                crate::output::error(why);
                Exit::Failure
            }
            Stop::Error(message) => {
                crate::output::error(message);
                Exit::Failure
            }
        }
    }

    async fn rendezvous(&mut self, signals: &mut Signals) -> Result<Round, Stop> {
        let Some(rdzv) = &self.rdzv else {
            // No rendezvous (standalone or static): the layout is fixed.
            let number = self.standalone_round;
            self.standalone_round += 1;
            let Mode::Static(fixed) = &self.cfg.rendezvous else {
                unreachable!("a node on etcd has a rendezvous handle")
            };
            return Ok(Round {
                number,
                group_rank: fixed.node_rank,
                group_world_size: fixed.nnodes,
                master_addr: fixed.master_addr.clone(),
                master_port: fixed.master_port.unwrap_or_else(rdzv::free_master_port),
                store: None,
            });
        };
        let p = rdzv.params();
        say(format_args!(
            "joining run {:?} on {} as node {} ({}..{} nodes)",
            p.run_id,
            p.endpoints.join(","),
            rdzv.node_id(),
            p.min_nodes,
            p.max_nodes
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
                // The lease changes when etcd dropped the old one: keep the watchdog current.
                if let Some(w) = self.watchdog.as_mut() {
                    w.arm(rdzv.release_ticket().await);
                }
                Ok(Round {
                    number: info.round,
                    group_rank: info.rank,
                    group_world_size: info.world_size,
                    master_addr: info.master_addr,
                    master_port: info.master_port,
                    store: Some(store),
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

    /// Publishes this node's worker count and role in the round's store, reads every node's,
    /// and assigns ranks. A member lost meanwhile sends the node back to the rendezvous.
    async fn exchange(
        &self,
        round: &Round,
        signals: &mut Signals,
    ) -> Result<Vec<WorkerRanks>, Stop> {
        let me = NodeInfo {
            role: self.cfg.role.clone(),
            group_rank: round.group_rank,
            local_world_size: self.cfg.nproc_per_node,
            coordinator_port: crate::workers::env::coordinator_port(
                self.cfg.framework,
                round.group_rank,
                round.master_port,
            ),
        };
        let Some(store) = &round.store else {
            // Static: every node runs as many workers as this one.
            let nodes: Vec<NodeInfo> = (0..round.group_world_size)
                .map(|group_rank| NodeInfo {
                    group_rank,
                    ..me.clone()
                })
                .collect();
            return Ok(ranks::assign(&nodes, round.group_rank));
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
        let mut tick = self.ticker();
        let values = tokio::select! {
            r = store.multi_get(&keys, None) => r.map_err(store_error)?,
            change = self.membership_change(&mut tick, false) => return Err(change),
            sig = signals.recv() => return Err(Stop::Signal(sig)),
        };
        let infos = values
            .iter()
            .map(|v| NodeInfo::parse(v))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Stop::Error("exchanging worker counts: a node published an unreadable entry".into())
            })?;
        Ok(ranks::assign(&infos, round.group_rank))
    }

    fn ticker(&self) -> tokio::time::Interval {
        let mut tick = tokio::time::interval(self.cfg.monitor_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    }

    /// Resolves when the round must be re-formed (members lost, or with `waiting` also nodes
    /// waiting to join) or the run was closed; checks every monitor interval. Never resolves
    /// for a standalone node.
    async fn membership_change(&self, tick: &mut tokio::time::Interval, waiting: bool) -> Stop {
        let Some(rdzv) = &self.rdzv else {
            return std::future::pending().await;
        };
        let mut next_closed_check = Instant::now() + CLOSED_CHECK;
        let mut complained = false;
        loop {
            tick.tick().await;
            let counts = async {
                let lost = rdzv.num_lost().await?;
                let waiting = match waiting {
                    true => rdzv.num_waiting().await?,
                    false => 0,
                };
                let closed = match Instant::now() >= next_closed_check {
                    true => {
                        next_closed_check = Instant::now() + CLOSED_CHECK;
                        rdzv.is_closed().await?
                    }
                    false => false,
                };
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

    /// Watches a running group: a worker's exit is seen at once, the membership every
    /// monitor interval.
    async fn monitor(&self, group: &mut Group, round: &Round, signals: &mut Signals) -> Outcome {
        let mut tick = self.ticker();
        let peer_failed = self.peer_failed(round);
        tokio::pin!(peer_failed);
        loop {
            tokio::select! {
                exit = group.next_exit() => {
                    let Some(index) = exit else { return Outcome::Succeeded };
                    let w = &group.workers[index];
                    let (ended, _) = w.ended.expect("just ended");
                    let r = &w.ranks;
                    if !ended.success() {
                        say(format_args!("worker rank {} (local rank {}, pid {}) failed: {ended}", r.global_rank, r.local_rank, w.pid));
                        return Outcome::Failed;
                    }
                    say(format_args!("worker rank {} (local rank {}) finished: exit code 0", r.global_rank, r.local_rank));
                    if group.running() == 0 {
                        return Outcome::Succeeded;
                    }
                }
                stop = self.membership_change(&mut tick, true) => return Outcome::Stop(stop),
                stop = &mut peer_failed => return Outcome::Stop(stop),
                sig = signals.recv() => return Outcome::Stop(Stop::Signal(sig)),
            }
        }
    }

    /// Keeps a node whose workers all succeeded until every node's did (or the bound passes),
    /// so a job does not look finished while some of it still runs.
    async fn exit_barrier(&self, round: &Round, signals: &mut Signals) -> Exit {
        let Some(store) = &round.store else {
            return Exit::Success;
        };
        if round.group_world_size == 1 {
            return Exit::Success;
        }
        let timeout = self.cfg.exit_barrier_timeout;
        say(format_args!(
            "waiting up to {:.0} s for the other nodes' workers to finish (exit barrier)",
            timeout.as_secs_f64()
        ));
        let started = Instant::now();
        let barrier = async {
            let arrived = store.add(BARRIER_COUNT, 1).await?;
            if arrived == i64::from(round.group_world_size) {
                store.set(BARRIER_DONE, b"1").await?;
            }
            store.wait(&[BARRIER_DONE], Some(timeout)).await
        };
        tokio::select! {
            stop = self.peer_failed(round) => {
                let (Stop::JobFailed(why) | Stop::Closed(Some(why))) = stop else { return Exit::Failure };
                crate::output::error(format_args!("the job failed on another node: {why}"));
                return Exit::Failure;
            }
            r = barrier => match r {
                Ok(()) => say(format_args!("every node finished ({:.1} s in the exit barrier)", started.elapsed().as_secs_f64())),
                Err(e) => say(format_args!("leaving the exit barrier without every node: {}", e.message())),
            },
            sig = signals.recv() => {
                say(format_args!("received {} in the exit barrier: leaving", crate::exit::signal_name(sig)));
                return Exit::Signal(sig);
            }
        }
        Exit::Success
    }
}

/// How often a launcher waiting for etcd to come up says so.
const CONNECT_NOTICE: Duration = Duration::from_secs(5);

/// Connects to the rendezvous. etcd often starts after the nodes (Kubernetes, Slurm), so a
/// refused or unanswered connection is retried until `join_timeout`, with a line every few
/// seconds naming the endpoint; a host name that does not resolve is a typo until proven
/// otherwise and fails at once. Err is the launcher's exit status.
async fn connect(params: rdzv::Params, signals: &mut Signals) -> Result<Rendezvous, Exit> {
    let endpoints = params.endpoints.join(",");
    let fail = |message: &str| {
        crate::output::error(format_args!("rendezvous on {endpoints}: {message}"));
        Exit::Failure
    };
    for endpoint in &params.endpoints {
        let host_port = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, rest)| rest)
            .trim_end_matches('/');
        let lookup = async {
            tokio::net::lookup_host(host_port)
                .await
                .map(|addrs| addrs.count())
        };
        let resolved = tokio::select! {
            r = tokio::time::timeout(params.connect_timeout, lookup) => r,
            sig = signals.recv() => return Err(Exit::Signal(sig)),
        };
        match resolved {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) | Ok(Err(_)) => {
                let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
                return Err(fail(&format!(
                    "cannot resolve the host name {host:?} of endpoint {host_port} (a typo?)"
                )));
            }
            // A name server that does not answer is not a typo: the retries below wait for it.
            Err(_) => {}
        }
    }
    let started = Instant::now();
    let deadline = started + params.join_timeout;
    let mut next_notice = started;
    loop {
        let connected = tokio::select! {
            r = Rendezvous::new(params.clone()) => r,
            sig = signals.recv() => return Err(Exit::Signal(sig)),
        };
        let e = match connected {
            Ok(r) => {
                if next_notice > started {
                    say(format_args!(
                        "connected to etcd at {endpoints} after {:.1} s",
                        started.elapsed().as_secs_f64()
                    ));
                }
                return Ok(r);
            }
            Err(e) if e.kind() == ErrorKind::Connection && Instant::now() < deadline => e,
            Err(e) => return Err(fail(e.message())),
        };
        if Instant::now() >= next_notice {
            say(format_args!(
                "waiting for etcd at {endpoints} ({}); retrying until join_timeout, {:.0} s left",
                e.message(),
                deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64()
            ));
            next_notice = Instant::now() + CONNECT_NOTICE;
        }
        // A retry interval, not a wait for an event: nothing tells us when etcd comes up.
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(250))) => {}
            sig = signals.recv() => return Err(Exit::Signal(sig)),
        }
    }
}

/// The failure report (workers.rs), named by the program the workers ran. True if it named
/// an error file.
fn report(program: &crate::settings::program::Program, failures: &[Failure]) -> bool {
    crate::workers::report::report(program.name(), failures)
}

/// A run id as a directory name.
fn sanitize(run_id: &str) -> String {
    run_id
        .chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                true => c,
                false => '_',
            },
        )
        .collect()
}

/// The round-store key where the launcher of node rank `group_rank` answers a failing node.
fn here_key(group_rank: u32) -> String {
    format!("{HERE}/{group_rank}")
}
