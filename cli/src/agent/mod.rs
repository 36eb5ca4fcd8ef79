//! The elastic agent: torchelastic's `SimpleElasticAgent` loop on rdzv's rendezvous.
//!
//! ```text
//!   ┌─> RENDEZVOUS ──> EXCHANGE ──> RUNNING ──(all exit 0)──> EXIT BARRIER ──> exit 0
//!   │   (next)         (ranks via    │
//!   │                   the store)   ├─(a worker fails, budget left)──> stop, restart_count += 1 ─┐
//!   │                                ├─(a worker fails, a member lost)> stop (no restart spent) ──┤
//!   │                                ├─(nodes waiting or lost)────────> stop ────────────────────┤
//!   │                                ├─(a worker fails, budget spent)─> stop, fail the job, exit 1
//!   │                                ├─(the job failed on another node)> stop, exit 1
//!   │                                ├─(run closed by someone else)───> stop, exit 0
//!   │                                ├─(this node drained)────────────> stop, exit 0
//!   │                                └─(SIGINT/SIGTERM/SIGHUP/SIGQUIT)─> forward, grace, SIGKILL,
//!   │                                                                    release node, exit 128+N
//!   └────────────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! The loop (`round`) is written once against a `Source` of rounds (`source.rs`): `etcd::Etcd`
//! for a job on etcd, `fixed::Fixed` for one without a rendezvous. Only failures spend the
//! restart budget; membership changes do not, and neither does a worker failure that a
//! member's loss explains (`failure.rs`). Leaving never closes the run for others; only a
//! spent budget (or an operator's `rdzv close`) does.
//!
//! While a group runs (`monitor`), three things can end it: a worker's exit (seen at once),
//! a handled signal, and whatever `watch` resolves first: the membership check and the
//! peer-failure check of the source, and the monitors of `crate::monitor` (this node's hang
//! monitor, another node's hang announcement, the health check, the pace meter). Each
//! resolves to an `Event`; a stop goes through `stop_for` and `stopped` as any other, a hang
//! through `monitor::respond` (the hang protocol, evidence, verdict) and then costs what a
//! failure costs, a failed health check drains this node.
//!
//! Submodules, each using only those listed before it: `signals`, `source` (the trait, rounds,
//! stops), `connect` (waiting for etcd at start), `failure` (what a failure costs, the
//! launchers' failure protocol), `barrier` (the exit barrier), `etcd` and `fixed` (the two
//! sources), `outcome_file` (`--outcome-file`); and parts of the agent itself: `record` (its
//! events and metrics), `inprocess` (`--in-process-restart`), `hangs` (a hang found here or
//! elsewhere), `stops` (stopping the group and the exit status of a stop), `watch` (what ends
//! a running round beside its group), `incident` (how its rounds ended, for the job's incident
//! records).

mod signals;

mod source;

mod connect;

mod failure;

mod barrier;

mod etcd;

mod fixed;

mod outcome_file;

mod record;

mod inprocess;

mod hangs;

mod stops;

mod watch;

mod incident;

pub use signals::Signals;
use watch::{place, watch};

use crate::events::{Recorder, Source as EventSource};
use crate::exit::Exit;
use crate::host::cpus::Cpus;
use crate::host::hostname;
use crate::monitor::hang::{self, HangMonitor, HangNotice, Hung, Learned};
use crate::monitor::health::{self, Unhealthy};
use crate::monitor::pages::{self, Watched};
use crate::monitor::progress::NoProgress;
use crate::output::{self, say};
use crate::ranks::NodeInfo;
use crate::settings::rendezvous::Venue;
use crate::settings::RunConfig;
use crate::workers::env::{coordinator_port, GroupSpec};
use crate::workers::logs::LogPlan;
use crate::workers::report::{self, Failure};
use crate::workers::Group;
use failure::{Budget, Charged, Cost};
use source::{Exchanged, Round, Source, Stop};

/// How a running group ended: every worker succeeded, one failed, or something beside the
/// group ended it (`Event`).
enum Outcome {
    Succeeded,
    Failed,
    Event(Event),
}

/// What ends a running group from beside it: a stop (a signal, the membership, the run, a
/// failure elsewhere: `watch`) or what a monitor found.
enum Event {
    Stop(Stop),
    /// A worker of this node made no progress for longer than its timeout.
    Hung(Hung),
    /// Another node found a hung worker (what it announced).
    PeerHung(HangNotice),
    /// This node's health check failed while training.
    Unhealthy(Unhealthy),
}

impl Outcome {
    fn name(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "every worker succeeded",
            Outcome::Failed => "a worker failed",
            Outcome::Event(Event::Stop(_)) => "stopped from outside the group",
            Outcome::Event(Event::Hung(_)) => "a worker of this node hung",
            Outcome::Event(Event::PeerHung(_)) => "another node found a hang",
            Outcome::Event(Event::Unhealthy(_)) => "this node's health check failed",
        }
    }
}

/// What one round leaves for the next.
#[derive(Default)]
struct Carried {
    /// The last group's failures, reported if the job ends before a group succeeds.
    failed: Option<Vec<Failure>>,
    /// The round whose failure spent the last restart, and its members.
    charged: Option<Charged>,
    /// `--in-process-restart`: the group whose workers left their function, for the next
    /// round to hand its place to.
    kept: Option<Group>,
}

pub struct Agent {
    cfg: RunConfig,
    logs: LogPlan,
    /// The log directory was made up by the launcher (no --log-dir): removed after success.
    temporary_logs: bool,
    extra_env: Vec<(String, String)>,
    restarts: Budget,
    /// The failure report named an error file (in the log directory, which is then kept).
    reported_error_file: bool,
    /// What `--outcome-file` will say.
    outcome: outcome_file::OutcomeFile,
    /// `--numa-binding`: the CPUs of each local rank (empty: no binding).
    cpu_binding: Vec<Cpus>,
    /// What `--hang-timeout auto` learned in earlier attempts (smoothed).
    learned: Learned,
    /// `--max-no-progress-restarts`: restarts in a row without progress.
    no_progress: NoProgress,
    /// `--events-file`, `--metrics-file`.
    record: Recorder,
    /// When the agent started, for the events' `total_run_time`.
    started: std::time::Instant,
    /// This node's place in its last round (group rank, group world size), for the events.
    place: (u32, u32),
    /// `--metrics-port`: the series Prometheus scrapes.
    prom: Option<std::sync::Arc<crate::prometheus::Metrics>>,
    /// When the last round ended to form another (for the recovery time).
    ended_at: Option<std::time::Instant>,
    /// How this node's rounds ended, for the job's incident records.
    incidents: incident::Log,
}

impl Agent {
    pub fn new(cfg: RunConfig, cpu_binding: Vec<Cpus>) -> std::io::Result<Agent> {
        let tag = format!(
            "{}_{:08x}",
            crate::workers::logs::dir_name(&cfg.run_id),
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
        let record = Recorder::open(cfg.events_file.as_ref(), cfg.metrics_file.as_ref())?;
        Ok(Agent {
            record,
            started: std::time::Instant::now(),
            place: (0, 0),
            prom: None,
            ended_at: None,
            incidents: incident::Log::new(),
            restarts: Budget {
                used: 0,
                max: cfg.max_restarts,
            },
            cfg,
            logs,
            temporary_logs,
            extra_env,
            reported_error_file: false,
            outcome: outcome_file::OutcomeFile::default(),
            cpu_binding,
            learned: Learned::default(),
            no_progress: NoProgress::default(),
        })
    }

    /// Runs the job to its end and returns the launcher's exit status.
    pub async fn run(mut self, signals: &mut Signals) -> Exit {
        if let Some(port) = self.cfg.metrics_port {
            let (run_id, role) = (&self.cfg.run_id, &self.cfg.role);
            match crate::prometheus::serve(port, run_id, role, &hostname()).await {
                Ok(metrics) => self.prom = Some(metrics),
                Err(e) => {
                    output::error(e);
                    return Exit::Failure;
                }
            }
        }
        let exit = match self.cfg.rendezvous.clone() {
            Venue::Etcd(params) => {
                let (watchdog, interval) = (self.cfg.watchdog, self.cfg.monitor_interval);
                match etcd::Etcd::connect(*params, watchdog, interval, signals).await {
                    Ok(mut source) => {
                        let exit = self.rounds(&mut source, signals).await;
                        source.leave().await;
                        exit
                    }
                    Err(exit) => exit,
                }
            }
            Venue::Static(layout) => {
                let mut source = fixed::Fixed::new(layout);
                self.rounds(&mut source, signals).await
            }
        };
        self.record_the_end(exit);
        // A made-up log directory goes, unless the report points into it.
        if self.temporary_logs && !self.reported_error_file {
            let _ = std::fs::remove_dir_all(&self.logs.run_dir);
        }
        match &self.cfg.outcome_file {
            Some(path) => match self.outcome.write(path, exit, self.restarts.used) {
                Ok(()) => exit,
                Err(e) => {
                    output::error(e);
                    Exit::Failure
                }
            },
            None => exit,
        }
    }

    /// Prints the failure report (torchrun's block) and keeps it for `--outcome-file`.
    fn report(&mut self, failures: &[Failure]) {
        self.reported_error_file = report::report(self.cfg.program.name(), failures);
        self.outcome.failed(failures);
    }

    /// Goes round the state diagram until the launcher leaves.
    async fn rounds<S: Source>(&mut self, source: &mut S, signals: &mut Signals) -> Exit {
        let mut carried = Carried::default();
        loop {
            if let Err(exit) = self.round(source, &mut carried, signals).await {
                return exit;
            }
        }
    }

    /// One trip: RENDEZVOUS, EXCHANGE, RUNNING and what ends it. `Ok`: form the next round;
    /// `Err`: the launcher leaves with this status.
    async fn round<S: Source>(
        &mut self,
        source: &mut S,
        carried: &mut Carried,
        signals: &mut Signals,
    ) -> Result<(), Exit> {
        if let Some(hc) = &self.cfg.monitor.health {
            if let Err(Unhealthy(why)) = health::check(hc).await {
                output::error(format_args!("{why}: this node takes no rank"));
                source
                    .note(
                        &format!("health/{}", source.who()),
                        &format!("kept out: {why}"),
                    )
                    .await;
                if let Some(failures) = carried.failed.as_deref() {
                    self.report(failures);
                }
                return Err(Exit::Failure);
            }
        }
        output::debug(format_args!(
            "rendezvous: asking for the next round ({} of {} restarts used)",
            self.restarts.used, self.restarts.max
        ));
        let asked = std::time::Instant::now();
        let round = match source.next_round(signals).await {
            Ok(round) => round,
            Err(stop) => {
                if let Some(mut kept) = carried.kept.take() {
                    self.stop_group(&mut kept, libc::SIGTERM, signals).await?;
                }
                return Err(self.stopped(stop, carried.failed.as_deref()));
            }
        };
        if let Some(before) = carried.charged.take() {
            if failure::refund_if_lost(source, &mut self.restarts, &before).await {
                let (used, max) = (self.restarts.used, self.restarts.max);
                self.rdzv_event("rdzv.restart.refunded", serde_json::json!({"round": round.number, "restarts": used, "max_restarts": max}));
            }
        }
        output::debug(format_args!(
            "rendezvous: round {} with {} node(s); exchanging worker counts",
            round.number, round.group_world_size
        ));
        let mut me = self.node_info(&round);
        // After this node's refund and before any node of the round can charge (none has
        // started its workers): the least of what the nodes read is the job's count for all.
        me.restarts = source.job_restarts().await;
        let workers = match source.exchange(&round, me, signals).await {
            Ok(Exchanged { workers, restarts }) => {
                if let Some(spent) = restarts {
                    self.restarts.used = spent.min(self.restarts.max);
                }
                workers
            }
            Err(Stop::Changed(why)) => {
                say(format_args!(
                    "{why} while exchanging worker counts: forming a new round"
                ));
                return Ok(());
            }
            Err(stop) => return Err(self.stopped(stop, carried.failed.as_deref())),
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
        self.place = (round.group_rank, round.group_world_size);
        let formed_ms = crate::incidents::wall_ms();
        self.record.event(
            "rdzv.round.formed",
            EventSource::Agent,
            serde_json::json!({
                "run_id": self.cfg.run_id,
                "round": round.number,
                "group_rank": round.group_rank,
                "group_world_size": round.group_world_size,
                "world_size": first.world_size,
                "master_addr": round.master_addr,
                "master_port": round.master_port,
                "hostname": hostname(),
            }),
        );
        let role = &self.cfg.role;
        let remaining = i64::from(self.restarts.max - self.restarts.used);
        self.record
            .metric(&format!("workers.{role}.remaining_restarts"), remaining);
        self.record.metric(&format!("workers.{role}.HEALTHY"), 1);
        if let Some(p) = &self.prom {
            p.rounds_formed.inc();
            p.world_size.set(i64::from(first.world_size));
            p.nodes.set(i64::from(round.group_world_size));
            p.remaining_restarts.set(remaining);
            p.round_formation.observe(asked.elapsed().as_secs_f64());
        }
        let spec = GroupSpec {
            command: &self.cfg.program.command,
            role: &self.cfg.role,
            run_id: &self.cfg.run_id,
            group_rank: round.group_rank,
            group_world_size: round.group_world_size,
            master_addr: &round.master_addr,
            master_port: round.master_port,
            restart_count: self.restarts.used,
            max_restarts: self.restarts.max,
            extra_env: &self.extra_env,
            framework: self.cfg.framework,
            virtual_local_rank: self.cfg.virtual_local_rank,
            cpu_binding: &self.cpu_binding,
            // The incident records' first step is read from the pages too.
            progress: self.cfg.monitor.pages() || self.cfg.records(),
            in_process: self.cfg.in_process.is_some(),
            spare: self.cfg.in_process_spare,
        };
        let kept = carried.kept.take().map(|mut kept| {
            let takes = kept.can_take(&workers);
            (kept, takes)
        });
        let mut group = match kept {
            Some((mut kept, true)) => {
                let started = kept.resume(&spec, &workers, &self.logs).map_err(|e| {
                    output::error(e);
                    Exit::Failure
                })?;
                match started {
                    (0, 0) => say("the workers run the new round in their processes (in-process restart)"),
                    (0, n) => say(format_args!(
                        "the workers run the new round in their processes (in-process restart); {n} that had failed started again"
                    )),
                    (handed, n) => say(format_args!(
                        "the workers run the new round in their processes (in-process restart); the spare takes the place of {handed} that had failed{}",
                        match n {
                            0 => String::new(),
                            n => format!(", {n} started again"),
                        }
                    )),
                }
                kept
            }
            kept => {
                if let Some((mut kept, _)) = kept {
                    say("the kept workers cannot take this round: starting them again");
                    self.stop_group(&mut kept, libc::SIGTERM, signals).await?;
                }
                Group::start(&spec, &workers, &self.logs).map_err(|e| {
                    output::error(e);
                    Exit::Failure
                })?
            }
        };
        let watched = pages::watch(&group);
        let entry = self.incidents.entry(formed_ms, crate::incidents::wall_ms());
        // A survivor's list names the evicted among those gone (free up to 64 nodes).
        let members = match round.group_world_size <= 64 || round.group_rank < 2 {
            true => source.members().await,
            false => None,
        };
        self.incidents.members(members);
        if let Some(p) = &self.prom {
            p.workers_running.set(group.running() as i64);
            if let Some(ended) = self.ended_at.take() {
                p.recovery.observe(ended.elapsed().as_secs_f64());
            }
        }
        self.outcome.ranks = workers
            .iter()
            .map(|w| (w.local_rank, w.global_rank))
            .collect();
        self.no_progress.attempt_started();
        let outcome = self
            .monitor(source, &mut group, &watched, &round, entry, signals)
            .await;
        let (kind, why) = incident::seen(&outcome);
        self.incidents.ended(round.number, kind, why);
        self.learn(source, &round, &watched).await;
        output::debug(format_args!(
            "round {}: the group ended: {}",
            round.number,
            outcome.name()
        ));
        // torchelastic's WorkerState of the group as it ended (`workers.ROLE.STATE` = 1).
        let ended_as = match &outcome {
            Outcome::Succeeded => "SUCCEEDED",
            Outcome::Failed | Outcome::Event(Event::Hung(_)) => "FAILED",
            Outcome::Event(_) => "STOPPED",
        };
        let mut keep = false;
        let next = match outcome {
            Outcome::Succeeded => {
                group.finish().await;
                say("all workers of this node finished successfully");
                let timeout = self.cfg.exit_barrier_timeout;
                Err(source.exit_barrier(&round, timeout, signals).await)
            }
            Outcome::Failed => {
                let kept = self.leave_after_failure(&mut group, false).await;
                let next = self
                    .after_failure(
                        source,
                        &mut group,
                        &watched,
                        &round,
                        carried,
                        (kept, None),
                        signals,
                    )
                    .await;
                keep = kept && next.is_ok();
                next
            }
            Outcome::Event(Event::Hung(hung)) => {
                let (next, kept) = self
                    .on_hang(source, &mut group, &watched, &round, hung, carried, signals)
                    .await;
                keep = kept;
                next
            }
            Outcome::Event(Event::PeerHung(what)) => {
                let (next, kept) = self
                    .on_peer_hang(source, &mut group, &watched, &round, what, carried, signals)
                    .await;
                keep = kept;
                next
            }
            Outcome::Event(Event::Unhealthy(Unhealthy(why))) => {
                self.rdzv_event(
                    "rdzv.health.failed",
                    serde_json::json!({"round": round.number, "why": why}),
                );
                output::error(format_args!(
                    "{why}: draining this node so that the others re-form without it"
                ));
                source.drain_self(&why).await;
                source
                    .note(
                        &format!("health/{}", source.who()),
                        &format!("drained: {why}"),
                    )
                    .await;
                let found = incident::Found::of("health", why);
                self.incidents.found(round.number, &source.who(), found);
                self.incidents.leaving(source).await;
                self.stop_group(&mut group, libc::SIGTERM, signals).await?;
                Err(Exit::Failure)
            }
            Outcome::Event(Event::Stop(Stop::Changed(why))) if self.cfg.in_process.is_some() => {
                self.record_change(&why, round.number);
                let (next, kept) = self
                    .leave_in_process(&mut group, &why, false, carried, signals)
                    .await;
                keep = kept;
                next
            }
            Outcome::Event(Event::Stop(stop)) => {
                if let Stop::Changed(why) = &stop {
                    self.record_change(why, round.number);
                }
                let drained = matches!(stop, Stop::Drained);
                let next = self.stop_for(&mut group, stop, carried, signals).await;
                if drained {
                    let found = incident::Found::of("drained", "drained".into());
                    self.incidents.found(round.number, &source.who(), found);
                    self.incidents.leaving(source).await;
                }
                next
            }
        };
        let role = &self.cfg.role;
        self.record.metric(&format!("workers.{role}.{ended_as}"), 1);
        self.record_workers(&mut group);
        if let Some(p) = &self.prom {
            p.workers_running.set(group.running() as i64);
        }
        if next.is_ok() {
            self.ended_at = Some(std::time::Instant::now());
        }
        if keep {
            carried.kept = Some(group);
        }
        next
    }

    /// After an attempt, with `auto` timeouts: what its workers showed (and the job's,
    /// through the round's store) is smoothed into what the next attempt starts from.
    async fn learn<S: Source>(&mut self, source: &S, round: &Round, workers: &[Watched]) {
        if !self.cfg.monitor.learns() {
            return;
        }
        let mut attempt = Learned::observed(workers);
        if let Some(store) = source.shared(round) {
            attempt.merge(&hang::read_learned(store).await);
        }
        if attempt != Learned::default() {
            self.learned = self.learned.smoothed(&attempt);
        }
    }

    /// This node's entry in the exchange.
    fn node_info(&self, round: &Round) -> NodeInfo {
        NodeInfo {
            role: self.cfg.role.clone(),
            group_rank: round.group_rank,
            local_world_size: self.cfg.nproc_per_node,
            coordinator_port: coordinator_port(
                self.cfg.framework,
                round.group_rank,
                round.master_port,
            ),
            restarts: None,
        }
    }

    /// Watches a running group: a worker's exit is seen at once, a signal too, and whatever
    /// else can end the round from outside (`watch`) as it happens.
    async fn monitor<S: Source>(
        &self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        entry: serde_json::Value,
        signals: &mut Signals,
    ) -> Outcome {
        let hangs = HangMonitor {
            cfg: &self.cfg.monitor,
            carried: &self.learned,
            interval: self.cfg.monitor_interval,
            store: source.shared(round),
        };
        let watch = watch(
            source,
            round,
            &hangs,
            workers,
            self.cfg.monitor.health.as_ref(),
            incident::report(source, round, workers, entry, &self.record),
        );
        tokio::pin!(watch);
        // `--in-process-spare`: the next spare starts once this node's workers have stepped
        // (at once when they have no pages), not beside them as they start.
        let mut spare_due = group.spare_due();
        let stepped = incident::stepped(workers);
        tokio::pin!(stepped);
        loop {
            tokio::select! {
                _ = &mut stepped, if spare_due => {
                    spare_due = false;
                    group.start_next_spare();
                }
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
                event = &mut watch => return Outcome::Event(event),
                sig = signals.recv() => return Outcome::Event(Event::Stop(Stop::Signal(sig))),
            }
        }
    }

    /// A worker failed: stops the others (unless `kept`: they left their function and stay,
    /// `--in-process-restart`), then decides what it costs (`failure.rs`). `hung`: the rank a
    /// hang found here was announced for, charged under it when no worker here failed (in
    /// process, every worker here left: the hung one was another node's).
    #[allow(clippy::too_many_arguments)]
    async fn after_failure<S: Source>(
        &mut self,
        source: &S,
        group: &mut Group,
        workers: &[Watched],
        round: &Round,
        carried: &mut Carried,
        (kept, hung): (bool, Option<u32>),
        signals: &mut Signals,
    ) -> Result<(), Exit> {
        if !kept {
            self.stop_group(group, libc::SIGTERM, signals).await?;
        }
        // Recorded with the restarts spent before this failure's.
        self.record_workers(group);
        let failures = group.failures();
        let rank = failures
            .first()
            .map(|f| f.global_rank)
            .or(hung)
            .unwrap_or(0);
        let why = match (failures.is_empty(), hung) {
            (true, Some(rank)) => format!("rank {rank} hung (found on {})", hostname()),
            _ => report::summary(&failures),
        };
        if let Some(max) = self.cfg.monitor.max_no_progress_restarts {
            self.no_progress.attempt_ended(workers);
            if self.no_progress.spent(max) {
                let stop = format!(
                    "no progress: {} (--max-no-progress-restarts {max})",
                    self.no_progress.describe()
                );
                output::error(format_args!("{stop}: the job failed"));
                if kept {
                    self.stop_group(group, libc::SIGTERM, signals).await?;
                }
                source.fail_job(&format!("{why}; {stop}")).await;
                self.report(&failures);
                return Err(Exit::Failure);
            }
        }
        match failure::cost(source, &mut self.restarts, round, &why, signals).await {
            Cost::Loss(why) => {
                self.incidents.lost(&why);
                say(format_args!(
                    "rank {rank} failed and {why}: a membership change, forming a new round (no restart spent)"
                ));
                carried.failed = None;
                return Ok(());
            }
            Cost::Charged(members) => {
                let found = incident::Found::crash(rank, &why);
                self.incidents.found(round.number, &source.who(), found);
                if let Some(p) = &self.prom {
                    p.restarts.inc();
                }
                let (used, max) = (self.restarts.used, self.restarts.max);
                self.rdzv_event(
                    "rdzv.restart.charged",
                    serde_json::json!({"round": round.number, "rank": rank,
                        "restarts": used, "max_restarts": max}),
                );
                say(format_args!(
                    "restarting the worker group (restart {} of {}) after rank {} failed{}",
                    self.restarts.used,
                    self.restarts.max,
                    rank,
                    match kept {
                        true => ": only the failed worker starts again, the others stay in their processes",
                        false => "",
                    }
                ));
                carried.charged = members;
                self.no_progress.restarted();
                carried.failed = Some(failures);
                return Ok(());
            }
            Cost::Stop(stop @ (Stop::Signal(_) | Stop::Drained)) => {
                if kept {
                    self.stop_group(group, libc::SIGTERM, signals).await?;
                }
                return Err(self.stopped(stop, None));
            }
            Cost::Stop(_) | Cost::Spent => {
                if kept {
                    self.stop_group(group, libc::SIGTERM, signals).await?;
                }
            }
        }
        say(format_args!(
            "restart budget spent ({} of {} restarts used): the job failed{}",
            self.restarts.used,
            self.restarts.max,
            match S::SHARED {
                true => "; closing the run as failed",
                false => "",
            }
        ));
        source.fail_job(&why).await;
        self.report(&failures);
        Err(Exit::Failure)
    }
}
