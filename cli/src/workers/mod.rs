//! One node's worker group: start the workers of one round with torchrun's environment,
//! report each exit as it happens, and stop them (signal, grace period, SIGKILL).
//!
//! Invariants that make "no orphan survives its launcher" hold (`process` keeps the first two):
//! - every worker leads a process group of its own, so a signal reaches what it started too;
//! - every worker has PR_SET_PDEATHSIG=SIGKILL and is spawned from the main thread, so it dies
//!   with the launcher however the launcher ends;
//! - when a group ends, whatever is left in the workers' process groups is killed.
//!
//! Exits are waited for by one plain thread per worker and delivered on a channel, so the
//! agent reacts to a failure at once instead of at its next monitor tick.
//!
//! Submodules, each using only those listed before it: `logs` (the log layout, where each
//! stream goes), `env` (the worker's environment), `process` (starting, waiting for and
//! signalling a worker), `error_file` (torchelastic's error file: read, written, copied),
//! `inprocess` (the control file of `--in-process-restart`), `report` (the failure report),
//! `spare` (the spare worker process of `--in-process-spare`).

pub mod logs;

pub mod env;

pub mod process;

pub mod error_file;

pub mod inprocess;

pub mod report;

mod spare;

use crate::exit::signal_name;
use crate::output;
use crate::ranks::WorkerRanks;
use env::GroupSpec;
use logs::{AttemptLogs, LogPlan};
use process::{signal_group, Ended};
use report::Failure;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// One started worker, and how and when it ended.
pub struct Worker {
    pub ranks: WorkerRanks,
    pub pid: u32,
    pub error_file: PathBuf,
    pub ended: Option<(Ended, SystemTime)>,
    /// The agent had asked it to stop when it ended: not a failure of its own.
    pub stopped: bool,
    /// Set when it has ended, for the monitors that run beside the group.
    pub exited: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Its end is in the job's events (`--events-file`).
    pub recorded: bool,
}

/// What `Group::leave` saw.
pub struct Left {
    /// The global ranks of the workers still in their function, to be stopped.
    pub late: Vec<u32>,
    /// Set when the one late worker was given up on because every other had left, this long
    /// after they were asked (after a hang): it is the hung one.
    pub others_left_in: Option<Duration>,
}

/// After a hang, the one worker not left is waited for this many times as long as the others
/// took to leave...
const LONE_FACTOR: u32 = 2;
/// ...and at least this long: a victim's blocked collective breaks in milliseconds.
const LONE_FLOOR: Duration = Duration::from_millis(100);

/// One round's workers on this node.
pub struct Group {
    pub workers: Vec<Worker>,
    /// Each exit, by the process's pid (a spare's place is known only once it is taken).
    exits: mpsc::UnboundedReceiver<(u32, ExitStatus)>,
    exit_tx: mpsc::UnboundedSender<(u32, ExitStatus)>,
    pumps_done: mpsc::UnboundedReceiver<()>,
    pump_tx: mpsc::UnboundedSender<()>,
    pumps: usize,
    /// Bytes the pumps have read or written so far (`output::pump`).
    pumped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop_sent: bool,
    /// `--in-process-restart`: the generation of the last control file written.
    generation: u64,
    /// `--in-process-spare`: the process waiting for a place (none while it is started again).
    spare: Option<Worker>,
    /// The next spare, ready to start once the round's workers have stepped (`spare`).
    next_spare: Option<spare::NextSpare>,
    /// How many spares this group made: each has a slot of its own.
    spares_made: u32,
}

/// After the workers exited, their output is waited for while it keeps moving, and for at most
/// this long once it stops: a process that escaped the workers' groups may hold a pipe open
/// forever, but a long line on a slow console is still being written.
const PUMP_IDLE: Duration = Duration::from_secs(2);

impl Group {
    /// Starts one worker per entry of `ranks`. On an error the workers already started are
    /// killed. Must run on the main thread (see the module comment).
    pub fn start(
        spec: &GroupSpec<'_>,
        ranks: &[WorkerRanks],
        logs: &LogPlan,
    ) -> std::io::Result<Group> {
        let (exit_tx, exits) = mpsc::unbounded_channel();
        let (pump_tx, pumps_done) = mpsc::unbounded_channel();
        let mut group = Group {
            workers: Vec::new(),
            exits,
            exit_tx,
            pumps_done,
            pump_tx,
            pumps: 0,
            pumped: Default::default(),
            stop_sent: false,
            generation: 0,
            spare: None,
            next_spare: None,
            spares_made: 0,
        };
        let attempt = AttemptLogs::open(logs, spec.restart_count)?;
        for r in ranks {
            match group.spawn(spec, r, &attempt) {
                Ok(worker) => group.workers.push(worker),
                Err(e) => {
                    group.kill_all();
                    return Err(e);
                }
            }
        }
        group.prepare_spare(spec, ranks, logs);
        Ok(group)
    }

    /// Starts the worker of `r`.
    fn spawn(
        &mut self,
        spec: &GroupSpec<'_>,
        r: &WorkerRanks,
        attempt: &AttemptLogs<'_>,
    ) -> std::io::Result<Worker> {
        let (error_file, routes) = attempt.worker(spec.role, r)?;
        if spec.progress {
            let (page, stacks) = env::progress_files(&error_file);
            rdzv::progress::create_page(&page)?;
            let _ = std::fs::remove_file(stacks);
        }
        if spec.in_process {
            let control = inprocess::control_file(&error_file);
            inprocess::clear(&control);
            inprocess::run(
                &control,
                self.generation,
                &env::worker_env(spec, r, &error_file),
            )?;
        }
        let env = env::worker_env(spec, r, &error_file);
        let worker = self.launch(spec, r, env, error_file, routes)?;
        output::debug(format_args!(
            "started worker rank {} (local rank {}): pid {}, error file {}",
            r.global_rank,
            r.local_rank,
            worker.pid,
            worker.error_file.display()
        ));
        Ok(worker)
    }

    /// Starts the command with `env`, its streams on `routes`, its exit reported by pid.
    fn launch(
        &mut self,
        spec: &GroupSpec<'_>,
        r: &WorkerRanks,
        env: Vec<(String, String)>,
        error_file: PathBuf,
        routes: Vec<logs::Route>,
    ) -> std::io::Result<Worker> {
        let cmd = process::command(spec, r, env, &routes);
        self.launch_command(cmd, r, error_file, routes)
    }

    /// Spawns `cmd` (from `process::command`) as a worker of `r`.
    fn launch_command(
        &mut self,
        mut cmd: std::process::Command,
        r: &WorkerRanks,
        error_file: PathBuf,
        routes: Vec<logs::Route>,
    ) -> std::io::Result<Worker> {
        let mut child = cmd.spawn().map_err(|e| {
            let program = cmd.get_program().to_string_lossy().into_owned();
            std::io::Error::new(e.kind(), format!("cannot start {program:?}: {e}"))
        })?;
        self.pumps += process::pump_streams(&mut child, routes, &self.pump_tx, &self.pumped);
        let pid = child.id();
        process::wait_in_thread(child, &self.exit_tx);
        Ok(Worker {
            ranks: r.clone(),
            pid,
            error_file,
            ended: None,
            stopped: false,
            exited: Default::default(),
            recorded: false,
        })
    }

    /// `--in-process-restart`: asks every running worker to leave its training function for the
    /// next round, and waits up to `bound` for each to answer. Returns those still running that
    /// did not answer in time (none: every worker left), or None when no worker is running or
    /// one could not be asked (the group must then be started again). A worker that ends
    /// meanwhile is no longer waited for: `resume` starts it again.
    ///
    /// `after_hang`: the job's workers are all blocked on the hung one, and the leave breaks a
    /// blocked worker's wait in milliseconds; so once every other worker here has left, the
    /// one still in its function is the hung one, waited for only `LONE_FACTOR` times as long
    /// as the others took (at least `LONE_FLOOR`), not the whole bound.
    pub async fn leave(&mut self, bound: Duration, after_hang: bool) -> Option<Left> {
        self.collect_exits();
        if self.running() == 0 {
            return None;
        }
        self.generation += 1;
        let generation = self.generation;
        for w in self.workers.iter().filter(|w| w.ended.is_none()) {
            inprocess::leave(&inprocess::control_file(&w.error_file), generation).ok()?;
        }
        let asked = tokio::time::Instant::now();
        let (mut answered, mut last_answer) = (0, Duration::ZERO);
        loop {
            let running = self.workers.iter().filter(|w| w.ended.is_none());
            let (left, late): (Vec<&Worker>, Vec<&Worker>) = running.partition(|w| {
                inprocess::has_left(&inprocess::control_file(&w.error_file), generation)
            });
            let late: Vec<u32> = late.iter().map(|w| w.ranks.global_rank).collect();
            if left.len() > answered {
                (answered, last_answer) = (left.len(), asked.elapsed());
            }
            let waited = asked.elapsed();
            let lone = after_hang
                && late.len() == 1
                && answered > 0
                && waited >= (last_answer * LONE_FACTOR).max(LONE_FLOOR);
            if late.is_empty() || lone || waited >= bound {
                let others_left_in = lone.then_some(last_answer);
                return Some(Left {
                    late,
                    others_left_in,
                });
            }
            // The answers are files: looked at every few milliseconds; an exit is taken as it
            // comes.
            tokio::select! {
                _ = self.next_exit() => {}
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    }

    /// Whether this group's processes can take the round `ranks` describes: as many workers,
    /// the same local ranks, one at least still running (those that ended are started again).
    pub fn can_take(&mut self, ranks: &[WorkerRanks]) -> bool {
        self.collect_exits();
        self.running() > 0
            && self.workers.len() == ranks.len()
            && self
                .workers
                .iter()
                .zip(ranks)
                .all(|(w, r)| w.ranks.local_rank == r.local_rank)
    }

    /// `--in-process-restart`: hands each running worker its place in the next round, and
    /// the places of those that had ended (failed) to the spare, or to new processes
    /// (`can_take`). Returns how many places went to the spare, and to new processes.
    pub fn resume(
        &mut self,
        spec: &GroupSpec<'_>,
        ranks: &[WorkerRanks],
        logs: &LogPlan,
    ) -> std::io::Result<(usize, usize)> {
        self.collect_exits();
        self.generation += 1;
        self.stop_sent = false;
        let (mut handed, mut started) = (0, 0);
        for (index, r) in ranks.iter().enumerate() {
            let w = &mut self.workers[index];
            if w.ended.is_none() {
                w.ranks = r.clone();
                let control = inprocess::control_file(&w.error_file);
                let env = env::worker_env(spec, r, &w.error_file);
                inprocess::run(&control, self.generation, &env)?;
                continue;
            }
            if let Some(spare) = self.take_spare(spec, r)? {
                self.workers[index] = spare;
                handed += 1;
                continue;
            }
            let attempt = AttemptLogs::open(logs, spec.restart_count)?;
            self.workers[index] = self.spawn(spec, r, &attempt)?;
            started += 1;
        }
        self.prepare_spare(spec, ranks, logs);
        Ok((handed, started))
    }

    /// Takes the exits that arrived while nobody waited for them (between two rounds).
    fn collect_exits(&mut self) {
        while let Ok((pid, status)) = self.exits.try_recv() {
            self.ended(pid, status);
        }
    }

    /// Marks the process `pid` ended; returns its worker's index (None: the spare, or a
    /// process no longer in the group).
    fn ended(&mut self, pid: u32, status: ExitStatus) -> Option<usize> {
        let Some(index) = self
            .workers
            .iter()
            .position(|w| w.pid == pid && w.ended.is_none())
        else {
            self.spare_ended(pid, status);
            return None;
        };
        let worker = &mut self.workers[index];
        worker.ended = Some((Ended::of(status), SystemTime::now()));
        worker
            .exited
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Some(index)
    }

    pub fn running(&self) -> usize {
        self.workers.iter().filter(|w| w.ended.is_none()).count()
    }

    /// Waits for the next worker to exit and returns its index; `None` once none is running.
    pub async fn next_exit(&mut self) -> Option<usize> {
        if self.running() == 0 {
            return None;
        }
        loop {
            let (pid, status) = self.exits.recv().await?;
            if let Some(index) = self.ended(pid, status) {
                self.workers[index].stopped |= self.stop_sent;
                return Some(index);
            }
        }
    }

    /// The failures of this group (workers that ended non-zero on their own), earliest first,
    /// then the workers the launcher stopped (`stopped`).
    pub fn failures(&self) -> Vec<Failure> {
        let mut failures: Vec<Failure> = self
            .workers
            .iter()
            .filter_map(|w| {
                let (ended, exited_at) = w.ended?;
                // A worker that ended after the agent asked it to stop failed on its own only
                // if it says so in its error file.
                let stopped = w.stopped && !w.error_file.exists();
                if ended.success() && !stopped {
                    return None;
                }
                let error = error_file::read(&w.error_file);
                Some(Failure {
                    global_rank: w.ranks.global_rank,
                    local_rank: w.ranks.local_rank,
                    pid: w.pid,
                    ended,
                    at: error.as_ref().and_then(|e| e.at).unwrap_or(exited_at),
                    traceback: error.as_ref().and_then(|e| e.traceback.clone()),
                    error_file: error.map(|e| (w.error_file.clone(), e.message)),
                    stopped,
                })
            })
            .collect();
        failures.sort_by_key(|f| (f.stopped, f.at, f.global_rank));
        failures
    }

    /// Sends `signal` to every running worker's process group, waits up to `grace` for them
    /// to exit, then SIGKILLs what is left; `interrupt` resolving (a signal to the launcher)
    /// cuts the grace short, and its signal is returned. Returns once every worker has exited
    /// and its output is written.
    pub async fn stop(
        &mut self,
        signal: i32,
        grace: Duration,
        interrupt: impl std::future::Future<Output = i32>,
    ) -> Option<i32> {
        self.stop_sent = true;
        let mut interrupted = None;
        if self.running() > 0 {
            output::debug(format_args!(
                "sending {} to {} running worker(s); SIGKILL after {:.1} s",
                signal_name(signal),
                self.running(),
                grace.as_secs_f64()
            ));
            self.signal_running(signal);
            let wait_all = async { while self.next_exit().await.is_some() {} };
            let in_time = tokio::select! {
                r = tokio::time::timeout(grace, wait_all) => r.is_ok(),
                sig = interrupt => {
                    interrupted = Some(sig);
                    false
                }
            };
            if !in_time {
                output::say(format_args!(
                    "{} worker(s) still running after {}: SIGKILL",
                    self.running(),
                    match interrupted {
                        Some(sig) => signal_name(sig),
                        None => format!("{:.1} s", grace.as_secs_f64()),
                    }
                ));
                self.signal_running(libc::SIGKILL);
                // SIGKILL cannot be refused; the bound only guards against a kernel stuck in
                // uninterruptible sleep.
                let wait_all = async { while self.next_exit().await.is_some() {} };
                let _ = tokio::time::timeout(Duration::from_secs(10), wait_all).await;
            }
        }
        self.finish().await;
        interrupted
    }

    /// `--in-process-restart`, after a hang or a leave it did not answer: stops the worker of
    /// global rank `rank` alone (`signal` to its process group, SIGKILL once `grace` passes)
    /// and waits for its exit; the others keep running. The worker counts as stopped by the
    /// launcher: it failed only if its error file (a hang's) says so.
    pub async fn stop_worker(&mut self, rank: u32, signal: i32, grace: Duration) {
        self.collect_exits();
        let Some(index) = self
            .workers
            .iter()
            .position(|w| w.ranks.global_rank == rank && w.ended.is_none())
        else {
            return;
        };
        self.workers[index].stopped = true;
        let pid = self.workers[index].pid;
        if signal != libc::SIGKILL {
            signal_group(pid, signal);
            self.wait_for_end(index, grace).await;
        }
        if self.workers[index].ended.is_none() {
            signal_group(pid, libc::SIGKILL);
            // SIGKILL cannot be refused; the bound only guards against a kernel stuck in
            // uninterruptible sleep.
            self.wait_for_end(index, Duration::from_secs(10)).await;
        }
        self.workers[index].stopped = true;
    }

    /// Waits up to `bound` for worker `index` to end; another's exit meanwhile is taken as it
    /// comes.
    async fn wait_for_end(&mut self, index: usize, bound: Duration) {
        let wait = async {
            while self.workers[index].ended.is_none() {
                if self.next_exit().await.is_none() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
    }

    /// After the workers exited: kills whatever they left in their process groups and waits
    /// for their output to be written, as long as it moves (`PUMP_IDLE`). A fixed bound cut
    /// a 10 MB line short on a console that read it slowly: the launcher exited mid-write.
    pub async fn finish(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.kill_all();
        let mut left = self.pumps;
        let mut seen = self.pumped.load(Relaxed);
        while left > 0 {
            match tokio::time::timeout(PUMP_IDLE, self.pumps_done.recv()).await {
                Ok(Some(())) => left -= 1,
                Ok(None) => break,
                Err(_) => {
                    let now = self.pumped.load(Relaxed);
                    if now == seen {
                        break;
                    }
                    seen = now;
                }
            }
        }
        self.pumps = 0;
    }

    fn signal_running(&self, signal: i32) {
        for w in self.workers.iter().filter(|w| w.ended.is_none()) {
            signal_group(w.pid, signal);
        }
    }

    /// SIGKILL to every worker's process group and the spare's (ESRCH for an empty group is
    /// fine).
    fn kill_all(&self) {
        for w in self.workers.iter().chain(&self.spare) {
            signal_group(w.pid, libc::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.running() > 0 || self.spare.is_some() {
            self.kill_all();
        }
    }
}
