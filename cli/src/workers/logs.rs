//! Where a worker group's output goes, as torchrun's default `LogsSpecs` lays it out, and
//! how each worker stream is routed: straight to the launcher's own stream (a terminal stays
//! a terminal), to nowhere (`--local-ranks-filter`), or through a pump to the console
//! (prefixed when teed), a log file and the filtered file.

use crate::args::values::{StreamSpec, Streams};
use crate::host::hostname;
use crate::output::{self, Console, Destination, Duplicate};
use crate::ranks::WorkerRanks;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where worker output and error files go, as torchrun's default `LogsSpecs` lays them out:
/// `RUN_DIR/attempt_N/LOCAL_RANK/` for every worker (its `error.json`, written by the worker
/// when it fails), `stdout.log`/`stderr.log` only for the streams `--redirects`/`--tee` select
/// (tee implies redirect), and `attempt_N/filtered_{stdout,stderr}.log` when duplicate filters
/// are given.
pub struct LogPlan {
    /// The run's log directory (`DIR/RUNID_XXXX`).
    pub run_dir: PathBuf,
    pub redirects: StreamSpec,
    pub tee: StreamSpec,
    pub filter: Option<Vec<u32>>,
    /// The prefix of teed console lines (torchrun's `[${role_name}${local_rank}]:`).
    pub prefix_template: String,
    pub duplicate_stdout: Vec<String>,
    pub duplicate_stderr: Vec<String>,
}

impl LogPlan {
    pub fn new(cfg: &crate::settings::RunConfig, run_dir: PathBuf) -> LogPlan {
        LogPlan {
            run_dir,
            redirects: cfg.redirects.clone(),
            tee: cfg.tee.clone(),
            filter: cfg.local_ranks_filter.clone(),
            prefix_template: cfg
                .log_line_prefix_template
                .clone()
                .unwrap_or_else(|| "[${role_name}${local_rank}]:".into()),
            duplicate_stdout: cfg.duplicate_stdout_filters.clone(),
            duplicate_stderr: cfg.duplicate_stderr_filters.clone(),
        }
    }

    /// The console prefix of a teed line of worker `r` (torchrun's template variables).
    pub fn prefix(&self, role: &str, r: &WorkerRanks) -> String {
        self.prefix_template
            .replace("${hostname}", &hostname())
            .replace("$hostname", &hostname())
            .replace("${role_name}", role)
            .replace("${local_rank}", &r.local_rank.to_string())
            .replace("${rank}", &r.global_rank.to_string())
            .replace("$role_name", role)
            .replace("$local_rank", &r.local_rank.to_string())
            .replace("$rank", &r.global_rank.to_string())
    }
}

/// One group's logs (`RUN_DIR/attempt_N/`), with the filtered files its workers share.
pub struct AttemptLogs<'a> {
    plan: &'a LogPlan,
    dir: PathBuf,
    duplicate_stdout: Option<Duplicate>,
    duplicate_stderr: Option<Duplicate>,
}

impl<'a> AttemptLogs<'a> {
    /// Creates `attempt_N` (N: restarts so far) and its filtered files.
    pub fn open(plan: &'a LogPlan, attempt: u32) -> std::io::Result<AttemptLogs<'a>> {
        let dir = plan.run_dir.join(format!("attempt_{attempt}"));
        std::fs::create_dir_all(&dir)?;
        let duplicate = |filters: &Vec<String>, name: &str| match filters.is_empty() {
            true => Ok(None),
            false => output::log_file(&dir.join(name)).map(|f| {
                Some(Duplicate {
                    filters: filters.clone(),
                    file: Arc::new(Mutex::new(f)),
                })
            }),
        };
        Ok(AttemptLogs {
            duplicate_stdout: duplicate(&plan.duplicate_stdout, "filtered_stdout.log")?,
            duplicate_stderr: duplicate(&plan.duplicate_stderr, "filtered_stderr.log")?,
            plan,
            dir,
        })
    }

    /// A worker's directory (`attempt_N/LOCAL_RANK/`): its error file, cleared (a file left by
    /// an earlier group is not this worker's error), and where its stdout and stderr go.
    pub fn worker(&self, role: &str, r: &WorkerRanks) -> std::io::Result<(PathBuf, Vec<Route>)> {
        let dir = self.dir.join(r.local_rank.to_string());
        std::fs::create_dir_all(&dir)?;
        let error_file = dir.join("error.json");
        let _ = std::fs::remove_file(&error_file);
        let streams = [
            (Console::Stdout, "stdout.log", &self.duplicate_stdout),
            (Console::Stderr, "stderr.log", &self.duplicate_stderr),
        ];
        let routes = streams
            .into_iter()
            .map(|(console, file, duplicate)| {
                route(
                    self.plan,
                    role,
                    r,
                    console,
                    &dir.join(file),
                    duplicate.clone(),
                )
            })
            .collect::<std::io::Result<_>>()?;
        Ok((error_file, routes))
    }
}

/// Where one worker stream goes: straight to the launcher's own stream, or through a pump.
pub enum Route {
    /// Shown on the console as written, with no copy anywhere: the worker writes to the
    /// launcher's stream itself (a terminal stays a terminal, partial lines show at once).
    Inherit,
    /// Neither shown nor kept (`--local-ranks-filter` leaves it out): /dev/null.
    Discard,
    Pump(Destination),
}

fn route(
    logs: &LogPlan,
    role: &str,
    r: &WorkerRanks,
    console: Console,
    file: &Path,
    duplicate: Option<Duplicate>,
) -> std::io::Result<Route> {
    let pick = |s: Streams| match console {
        Console::Stdout => s.stdout,
        Console::Stderr => s.stderr,
    };
    let redirected = pick(logs.redirects.for_rank(r.local_rank));
    let teed = pick(logs.tee.for_rank(r.local_rank));
    let filtered_out = logs
        .filter
        .as_ref()
        .is_some_and(|ranks| !ranks.contains(&r.local_rank));
    match (redirected || teed, filtered_out) {
        (false, false) => return Ok(Route::Inherit),
        // As torchrun: a filtered-out stream that no file keeps goes nowhere.
        (false, true) => return Ok(Route::Discard),
        (true, _) => {}
    }
    let shown = (!redirected || teed) && !filtered_out;
    // As torchrun: console lines are the worker's own, prefixed only when teed.
    let prefix = match teed {
        true => logs.prefix(role, r),
        false => String::new(),
    };
    Ok(Route::Pump(Destination {
        console: shown.then_some((prefix, console)),
        file: match redirected || teed {
            true => Some(output::log_file(file)?),
            false => None,
        },
        duplicate: duplicate.filter(|_| teed),
    }))
}

/// A run id as a directory name.
pub fn dir_name(run_id: &str) -> String {
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
