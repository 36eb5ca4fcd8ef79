//! `--in-process-spare`: one worker process per node started ahead of need. It runs the
//! program with the group's environment but no place in it (no rank, world size or bootstrap
//! address; `RDZV_INPROCESS_SPARE=1`), so its top level imports what it imports and it then
//! waits in `rdzv.inprocess.run` (or `rdzv_inprocess_next`) for a round, as a kept worker
//! does. When a worker fails or hangs, the next round hands its place to the spare through
//! the spare's control file, instead of starting a process that imports everything again,
//! and a new spare is made ready. A spare starts once the round's workers have all stepped
//! (`start_next_spare`, called by the agent): importing torch beside workers that create their
//! process group again takes the CPU they need. Each spare lives in a directory of its own
//! beside the workers' (`attempt_N/LOCAL_WORLD_SIZE/`, then one more for each the group
//! made): its error file, progress page and control file stay there once it has a place.

use super::{env, inprocess, logs, logs::AttemptLogs, logs::LogPlan, process, Group, Worker};
use crate::output::{debug, say};
use crate::ranks::WorkerRanks;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};

/// A spare ready to start: its command, its slot, where its error file and streams go.
pub struct NextSpare {
    command: Command,
    slot: WorkerRanks,
    error_file: PathBuf,
    routes: Vec<logs::Route>,
}

/// The variables that give a worker its place: a spare has none until it takes one.
const PLACE: &[&str] = &[
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "CUDA_VISIBLE_DEVICES",
    "JAX_COORDINATOR_ADDRESS",
    "OMPI_MCA_orte_hnp_uri",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
];

/// Set in a spare's environment, so that a program can tell it has no place yet.
pub const SPARE_ENV: &str = "RDZV_INPROCESS_SPARE";

impl Group {
    /// Makes a spare ready (`start_next_spare` starts it), when the group keeps one and has
    /// none. One that cannot be made is said and left out: the places are started as without.
    pub(super) fn prepare_spare(
        &mut self,
        spec: &env::GroupSpec<'_>,
        ranks: &[WorkerRanks],
        logs: &LogPlan,
    ) {
        if !spec.spare || self.spare.is_some() {
            return;
        }
        let Some(first) = ranks.first() else {
            return;
        };
        // A slot past the last local rank, one more for each spare this group made: its
        // directory and its streams' routes. Never an earlier spare's, which may be a worker
        // in the same attempt by now (after a membership change, no restart moves it).
        let slot = WorkerRanks {
            local_rank: ranks.len() as u32 + self.spares_made,
            ..first.clone()
        };
        self.spares_made += 1;
        match next_spare(spec, slot, logs) {
            Ok(next) => self.next_spare = Some(next),
            Err(e) => say(format_args!("cannot start the spare worker: {e}")),
        }
    }

    /// Whether a spare is ready to start.
    pub fn spare_due(&self) -> bool {
        self.next_spare.is_some()
    }

    /// Starts the spare made ready (the agent calls it once the round's workers have stepped).
    /// Must run on the main thread, as every worker's start.
    pub fn start_next_spare(&mut self) {
        let Some(next) = self.next_spare.take() else {
            return;
        };
        match self.launch_command(next.command, &next.slot, next.error_file, next.routes) {
            Ok(spare) => {
                debug(format_args!("started the spare worker: pid {}", spare.pid));
                self.spare = Some(spare);
            }
            Err(e) => say(format_args!("cannot start the spare worker: {e}")),
        }
    }

    /// The spare, handed the place `r` in the round the group's generation names (its control
    /// file says run, with the place's environment); None when there is no spare.
    pub(super) fn take_spare(
        &mut self,
        spec: &env::GroupSpec<'_>,
        r: &WorkerRanks,
    ) -> std::io::Result<Option<Worker>> {
        let Some(mut spare) = self.spare.take() else {
            return Ok(None);
        };
        spare.ranks = r.clone();
        let control = inprocess::control_file(&spare.error_file);
        let vars = env::worker_env(spec, r, &spare.error_file);
        inprocess::run(&control, self.generation, &vars)?;
        debug(format_args!(
            "the spare worker (pid {}) takes rank {} (local rank {})",
            spare.pid, r.global_rank, r.local_rank
        ));
        Ok(Some(spare))
    }

    /// The spare `pid` exited before it had a place: said, and another is started at the
    /// next round. (A pid of neither the spare nor a running worker is an old worker's.)
    pub(super) fn spare_ended(&mut self, pid: u32, status: ExitStatus) {
        if self.spare.as_ref().is_some_and(|s| s.pid == pid) {
            if self.stop_sent {
                self.spare = None;
                return; // stopped with the group
            }
            say(format_args!(
                "the spare worker (pid {pid}) exited before it had a place ({status}): another starts with the next round"
            ));
            self.spare = None;
        }
    }
}

/// The spare of `slot`: its directory, page and control file made ready, its command built.
fn next_spare(
    spec: &env::GroupSpec<'_>,
    slot: WorkerRanks,
    logs: &LogPlan,
) -> std::io::Result<NextSpare> {
    let attempt = AttemptLogs::open(logs, spec.restart_count)?;
    let (error_file, routes) = attempt.worker(spec.role, &slot)?;
    if spec.progress {
        let (page, stacks) = env::progress_files(&error_file);
        rdzv::progress::create_page(&page)?;
        let _ = std::fs::remove_file(stacks);
    }
    // No control file: the spare waits for one (one left by an earlier worker of this
    // directory would hand it that worker's place).
    let control = inprocess::control_file(&error_file);
    inprocess::clear(&control);
    let _ = std::fs::remove_file(&control);
    let mut vars = env::worker_env(spec, &slot, &error_file);
    vars.retain(|(k, _)| !PLACE.contains(&k.as_str()));
    vars.push((SPARE_ENV.into(), "1".into()));
    let command = process::command(spec, &slot, vars, &routes);
    Ok(NextSpare {
        command,
        slot,
        error_file,
        routes,
    })
}
