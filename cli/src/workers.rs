//! One node's worker group: start the workers of one round with torchrun's environment,
//! report each exit as it happens, and stop them (signal, grace period, SIGKILL).
//!
//! Invariants that make "no orphan survives its launcher" hold:
//! - every worker leads a process group of its own, so a signal reaches what it started too
//!   (and Ctrl-C on the terminal reaches only the launcher, which forwards it);
//! - every worker has PR_SET_PDEATHSIG=SIGKILL, so it dies with the launcher even when the
//!   launcher is SIGKILLed. The kernel ties that to the *thread* that forked, so workers are
//!   only ever spawned from the main thread (the one running `block_on`), which lives until
//!   the process exits;
//! - when a group ends, whatever is left in the workers' process groups is killed.
//!
//! Exits are waited for by one plain thread per worker and delivered on a channel, so the
//! agent reacts to a failure at once instead of at its next monitor tick.

use crate::args::values::{Framework, StreamSpec, Streams};
use crate::exit::signal_name;
use crate::host::hostname;
use crate::output::{self, plain, say, Console, Destination};
use crate::ranks::WorkerRanks;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

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

/// What is the same for every worker of one group.
pub struct GroupSpec<'a> {
    pub command: &'a [String],
    pub role: &'a str,
    pub run_id: &'a str,
    pub group_rank: u32,
    pub group_world_size: u32,
    pub master_addr: &'a str,
    pub master_port: u16,
    /// Restarts after failures so far (TORCHELASTIC_RESTART_COUNT).
    pub restart_count: u32,
    pub max_restarts: u32,
    /// Set for every worker (OMP_NUM_THREADS when the launcher chose it).
    pub extra_env: &'a [(String, String)],
    /// What the workers need beyond torchrun's environment.
    pub framework: Framework,
    /// `--virtual-local-rank`: LOCAL_RANK 0, CUDA_VISIBLE_DEVICES the worker's own device.
    pub virtual_local_rank: bool,
    /// `--numa-binding`: the CPUs of each local rank (empty: no binding).
    pub cpu_binding: &'a [crate::host::cpus::Cpus],
}

/// How a worker ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

impl Ended {
    fn of(status: ExitStatus) -> Ended {
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(sig)) => Ended::Signal(sig),
            (None, None) => Ended::Code(-1),
        }
    }
    pub fn success(self) -> bool {
        self == Ended::Code(0)
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Code(c) => write!(f, "exit code {c}"),
            Ended::Signal(s) => write!(f, "signal {}", signal_name(*s)),
        }
    }
}

pub struct Worker {
    pub ranks: WorkerRanks,
    pub pid: u32,
    pub error_file: PathBuf,
    pub ended: Option<(Ended, SystemTime)>,
    /// The agent had asked it to stop when it ended: not a failure of its own.
    pub stopped: bool,
}

/// A worker's failure, as reported when the restart budget is spent; also the workers the
/// launcher stopped because of it (`stopped`).
pub struct Failure {
    pub global_rank: u32,
    pub local_rank: u32,
    pub pid: u32,
    pub ended: Ended,
    /// When it failed: the error file's timestamp if it wrote one, else when it exited.
    pub at: SystemTime,
    pub error_file: Option<(PathBuf, String)>,
    /// The traceback its error file holds (torch's `py_callstack`).
    pub traceback: Option<String>,
    /// Stopped by the launcher after another worker failed: not a failure of its own.
    pub stopped: bool,
}

pub struct Group {
    pub workers: Vec<Worker>,
    exits: mpsc::UnboundedReceiver<(usize, ExitStatus)>,
    pumps_done: mpsc::UnboundedReceiver<()>,
    pumps: usize,
    stop_sent: bool,
}

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
            pumps_done,
            pumps: 0,
            stop_sent: false,
        };
        let attempt_dir = logs.run_dir.join(format!("attempt_{}", spec.restart_count));
        std::fs::create_dir_all(&attempt_dir)?;
        let duplicates = [
            (&logs.duplicate_stdout, "filtered_stdout.log"),
            (&logs.duplicate_stderr, "filtered_stderr.log"),
        ]
        .map(|(filters, name)| match filters.is_empty() {
            true => Ok(None),
            false => output::log_file(&attempt_dir.join(name)).map(|f| {
                Some(output::Duplicate {
                    filters: filters.clone(),
                    file: std::sync::Arc::new(std::sync::Mutex::new(f)),
                })
            }),
        });
        let [dup_out, dup_err] = duplicates;
        let (dup_out, dup_err) = (dup_out?, dup_err?);
        for (index, r) in ranks.iter().enumerate() {
            let dir = attempt_dir.join(r.local_rank.to_string());
            std::fs::create_dir_all(&dir)?;
            let error_file = dir.join("error.json");
            // A file left by an earlier group is not this worker's error.
            let _ = std::fs::remove_file(&error_file);
            let mut routes = Vec::new();
            for (console, name) in [(Console::Stdout, "stdout"), (Console::Stderr, "stderr")] {
                let duplicate = match console {
                    Console::Stdout => dup_out.clone(),
                    Console::Stderr => dup_err.clone(),
                };
                let file = dir.join(format!("{name}.log"));
                routes.push(route(logs, spec.role, r, console, &file, duplicate)?);
            }
            let started = spawn(spec, r, &error_file, &routes);
            let mut child = match started {
                Ok(child) => child,
                Err(e) => {
                    group.kill_all();
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("cannot start {:?}: {e}", spec.command[0]),
                    ));
                }
            };
            let streams = [
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            ];
            for (stream, route) in streams.into_iter().zip(routes) {
                let (Some(stream), Route::Pump(to)) = (stream, route) else {
                    continue;
                };
                let done = pump_tx.clone();
                group.pumps += 1;
                let pump = output::pump(stream, to);
                // Tells the group when a pump is through, so its last lines are out before
                // the launcher reports on the group.
                std::thread::spawn(move || {
                    let _ = pump.join();
                    let _ = done.send(());
                });
            }
            let pid = child.id();
            let tx = exit_tx.clone();
            std::thread::spawn(move || {
                if let Ok(status) = child.wait() {
                    let _ = tx.send((index, status));
                }
            });
            group.workers.push(Worker {
                ranks: r.clone(),
                pid,
                error_file,
                ended: None,
                stopped: false,
            });
        }
        Ok(group)
    }

    pub fn running(&self) -> usize {
        self.workers.iter().filter(|w| w.ended.is_none()).count()
    }

    /// Waits for the next worker to exit and returns its index; `None` once none is running.
    pub async fn next_exit(&mut self) -> Option<usize> {
        if self.running() == 0 {
            return None;
        }
        let (index, status) = self.exits.recv().await?;
        let worker = &mut self.workers[index];
        worker.ended = Some((Ended::of(status), SystemTime::now()));
        worker.stopped = self.stop_sent;
        Some(index)
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
                let error = read_error_file(&w.error_file);
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

    /// After the workers exited: kills whatever they left in their process groups and waits
    /// (briefly) for their output to be written.
    pub async fn finish(&mut self) {
        self.kill_all();
        let pumps = self.pumps;
        let drained = async {
            for _ in 0..pumps {
                if self.pumps_done.recv().await.is_none() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drained).await;
        self.pumps = 0;
    }

    fn signal_running(&self, signal: i32) {
        for w in self.workers.iter().filter(|w| w.ended.is_none()) {
            // SAFETY: plain syscall; the worker leads its own group (pgid == pid).
            unsafe { libc::killpg(w.pid as i32, signal) };
        }
    }

    /// SIGKILL to every worker's process group (ESRCH for an empty group is fine).
    fn kill_all(&self) {
        for w in &self.workers {
            // SAFETY: plain syscall on a process group this launcher created.
            unsafe { libc::killpg(w.pid as i32, libc::SIGKILL) };
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.running() > 0 {
            self.kill_all();
        }
    }
}

fn spawn(
    spec: &GroupSpec<'_>,
    r: &WorkerRanks,
    error_file: &Path,
    routes: &[Route],
) -> std::io::Result<std::process::Child> {
    let mut cmd = Command::new(&spec.command[0]);
    // torchrun's `${local_rank}` in the program's arguments (its `macros.substitute`).
    cmd.args(
        spec.command[1..]
            .iter()
            .map(|a| a.replace("${local_rank}", &r.local_rank.to_string())),
    );
    for (k, v) in worker_env(spec, r, error_file) {
        cmd.env(k, v);
    }
    let stdio = |route: &Route| match route {
        Route::Inherit => Stdio::inherit(),
        Route::Discard => Stdio::null(),
        Route::Pump(_) => Stdio::piped(),
    };
    // stdin and the streams nobody redirects are the launcher's own, as under torchrun: a
    // worker on a terminal sees one (isatty, `\r` progress bars, pdb and input()).
    cmd.stdin(Stdio::inherit())
        .stdout(stdio(&routes[0]))
        .stderr(stdio(&routes[1]));
    own_session(&mut cmd);
    dies_with_launcher(&mut cmd);
    if let Some(cpus) = spec.cpu_binding.get(r.local_rank as usize) {
        runs_on(&mut cmd, cpus);
    }
    cmd.spawn()
}

/// Makes the worker lead a session (and so a process group) of its own, as torchrun's
/// `start_new_session`: a signal to its group reaches what it started, Ctrl-C on the terminal
/// reaches only the launcher (which forwards it), and, holding no controlling terminal, it
/// reads an inherited terminal without being stopped as a background job (pdb, input()).
fn own_session(cmd: &mut Command) {
    // SAFETY: setsid is async-signal-safe; it runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| match libc::setsid() {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
}

/// Makes the process `cmd` starts run on `cpus` only (its CPU affinity, which its threads and
/// children inherit), as `numactl --physcpubind` does.
fn runs_on(cmd: &mut Command, cpus: &crate::host::cpus::Cpus) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; built here, before the fork.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity is a plain syscall, async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            match libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// The environment torchrun's agent gives a worker (on top of the launcher's own).
/// Makes the process `cmd` starts die (SIGKILL) with the launcher, however the launcher ends:
/// a SIGKILLed launcher leaves no worker or embedded etcd behind.
pub fn dies_with_launcher(cmd: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the line above took effect: nothing will reap us.
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

pub fn worker_env(
    spec: &GroupSpec<'_>,
    r: &WorkerRanks,
    error_file: &Path,
) -> Vec<(String, String)> {
    let local_rank = match spec.virtual_local_rank {
        true => 0,
        false => r.local_rank,
    };
    let mut env: Vec<(String, String)> = [
        ("LOCAL_RANK", local_rank.to_string()),
        ("RANK", r.global_rank.to_string()),
        ("GROUP_RANK", spec.group_rank.to_string()),
        ("ROLE_RANK", r.role_rank.to_string()),
        ("ROLE_NAME", spec.role.to_string()),
        ("LOCAL_WORLD_SIZE", r.local_world_size.to_string()),
        ("WORLD_SIZE", r.world_size.to_string()),
        ("GROUP_WORLD_SIZE", spec.group_world_size.to_string()),
        ("ROLE_WORLD_SIZE", r.role_world_size.to_string()),
        ("MASTER_ADDR", spec.master_addr.to_string()),
        ("MASTER_PORT", spec.master_port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", spec.restart_count.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", spec.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", spec.run_id.to_string()),
        // Rank 0's worker hosts the c10d TCPStore at MASTER_ADDR:MASTER_PORT itself; the
        // launcher serves no store of its own.
        ("TORCHELASTIC_USE_AGENT_STORE", "False".to_string()),
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            std::env::var("TORCH_NCCL_ASYNC_ERROR_HANDLING").unwrap_or_else(|_| "1".into()),
        ),
        ("TORCHELASTIC_ERROR_FILE", error_file.display().to_string()),
        // As torchrun says it: the signals the launcher forwards to its workers (agent.rs).
        (
            "TORCHELASTIC_SIGNALS_TO_HANDLE",
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT".to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if !spec.cpu_binding.is_empty() && std::env::var_os("CUDA_DEVICE_ORDER").is_none() {
        // The binding numbers GPUs in PCI order; CUDA numbers them so too with this.
        env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
    }
    if spec.virtual_local_rank {
        // The worker's device is the local rank's: its entry of the launcher's own list when
        // there is one, else that index; it then sees it as device 0.
        let device = std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| {
                v.split(',')
                    .map(str::trim)
                    .nth(r.local_rank as usize)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| r.local_rank.to_string());
        env.push(("CUDA_VISIBLE_DEVICES".into(), device));
    }
    if let (Framework::Jax, Some(port)) = (spec.framework, r.coordinator_port) {
        env.extend(jax_env(spec.master_addr, port, r));
    }
    env.extend(spec.extra_env.iter().cloned());
    env
}

/// What `jax.distributed.initialize()` without arguments reads (jax/_src/distributed.py and
/// jax/_src/clusters/): the coordinator's address from JAX_COORDINATOR_ADDRESS, and the process
/// count and id only from a cluster environment it recognizes. Open MPI's is the one whose
/// variables carry exactly those numbers and nothing else JAX would act on; it is the first
/// JAX tries, so it wins over a Slurm allocation the launcher itself runs in. Its
/// OMPI_MCA_orte_hnp_uri only marks the environment as present (JAX takes the address from
/// JAX_COORDINATOR_ADDRESS when that is set); it names the coordinator too, so that JAX reads
/// the same address either way. Local process id = LOCAL_RANK, which JAX uses on GPUs to
/// give each process the device of its local rank, as torchrun's convention has it.
fn jax_env(master_addr: &str, port: u16, r: &WorkerRanks) -> Vec<(String, String)> {
    let (address, uri) = match master_addr.contains(':') {
        true => (
            format!("[{master_addr}]:{port}"),
            format!("0.0;tcp6://[{master_addr}]:{port}"),
        ),
        false => (
            format!("{master_addr}:{port}"),
            format!("0.0;tcp://{master_addr}:{port}"),
        ),
    };
    [
        ("JAX_COORDINATOR_ADDRESS", address),
        ("OMPI_MCA_orte_hnp_uri", uri),
        ("OMPI_COMM_WORLD_SIZE", r.world_size.to_string()),
        ("OMPI_COMM_WORLD_RANK", r.global_rank.to_string()),
        ("OMPI_COMM_WORLD_LOCAL_RANK", r.local_rank.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The port node rank 0 publishes for the framework's coordinator in each round: JAX's
/// coordinator service is its own server (gRPC), so it cannot share MASTER_PORT, where rank 0's
/// worker may host torch's c10d store. Picked free on this node (bound and released, the race
/// MASTER_PORT has too), on every address as JAX binds it, and never MASTER_PORT itself; anew
/// every round, so a restarted group never meets the coordinator of the one before.
pub fn coordinator_port(framework: Framework, group_rank: u32, master_port: u16) -> Option<u16> {
    if framework != Framework::Jax || group_rank != 0 {
        return None;
    }
    let pick = || {
        std::net::TcpListener::bind(("::", 0))
            .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", 0)))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .ok()
    };
    (0..8).filter_map(|_| pick()).find(|&p| p != master_port)
}

/// Where one worker stream goes: straight to the launcher's own stream, or through a pump.
enum Route {
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
    duplicate: Option<output::Duplicate>,
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

/// What a torchelastic error file says.
struct ErrorFile {
    message: String,
    at: Option<SystemTime>,
    traceback: Option<String>,
}

/// The message, timestamp and traceback in a torchelastic error file, if the worker wrote one:
/// `{"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}`
/// or the flat form `{"message": "...", "timestamp": N}`.
fn read_error_file(path: &Path) -> Option<ErrorFile> {
    let bytes = std::fs::read(path).ok()?;
    let v: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => {
            return Some(ErrorFile {
                message: String::from_utf8_lossy(&bytes).trim().to_string(),
                at: None,
                traceback: None,
            })
        }
    };
    let (message, timestamp, traceback) = match v.get("message") {
        Some(serde_json::Value::Object(m)) => {
            let extra = m.get("extraInfo");
            (
                m.get("message")
                    .and_then(|s| s.as_str())
                    .map(str::to_string),
                extra.and_then(|e| e.get("timestamp")).cloned(),
                extra
                    .and_then(|e| e.get("py_callstack"))
                    .and_then(|t| t.as_str())
                    .map(str::to_string),
            )
        }
        Some(serde_json::Value::String(s)) => (Some(s.clone()), v.get("timestamp").cloned(), None),
        _ => (None, None, None),
    };
    let seconds = timestamp.and_then(|t| match t {
        serde_json::Value::String(s) => s.parse::<u64>().ok(),
        serde_json::Value::Number(n) => n.as_u64(),
        _ => None,
    });
    Some(ErrorFile {
        message: message.unwrap_or_else(|| v.to_string()),
        at: seconds.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        traceback,
    })
}

/// The report of a failed job, as torchrun's `ChildFailedError` lays it out: the root cause
/// (the first failure by the time it happened) with its host, time, rank, exit code or signal,
/// error file and traceback; the other failures; and the ranks the launcher stopped. When the
/// launcher has a `TORCHELASTIC_ERROR_FILE` of its own (a scheduler set it), the root cause's
/// error file is copied there, as torchrun does. True if the report named an error file.
pub fn report(program: &str, failures: &[Failure]) -> bool {
    let Some(root) = failures.first().filter(|f| !f.stopped) else {
        return false;
    };
    say(format_args!(
        "first failure: rank {} (local rank {}, pid {}) ended with {}",
        root.global_rank, root.local_rank, root.pid, root.ended
    ));
    match &root.error_file {
        Some((path, message)) => say(format_args!(
            "rank {} error file {}: {}",
            root.global_rank,
            path.display(),
            message.lines().next().unwrap_or("")
        )),
        None => say(format_args!(
            "rank {} wrote no error file (TORCHELASTIC_ERROR_FILE; torch's @record writes one)",
            root.global_rank
        )),
    }
    let host = hostname();
    let rule = "=".repeat(60);
    let thin = "-".repeat(60);
    // torchrun's ChildFailedError block, line for line and unprefixed, as parsers read it.
    plain(&rule);
    plain(format_args!("{program} FAILED"));
    plain(&thin);
    plain("Failures:");
    let others: Vec<&Failure> = failures[1..].iter().filter(|f| !f.stopped).collect();
    if others.is_empty() {
        plain("  <NO_OTHER_FAILURES>");
    }
    for (i, f) in others.iter().enumerate() {
        describe(i + 1, f, &host);
    }
    plain(&thin);
    plain("Root Cause (first observed failure):");
    describe(0, root, &host);
    plain(&rule);
    // rdzv's addition, after the block: the workers stopped because of the failure.
    let stopped: Vec<String> = failures
        .iter()
        .filter(|f| f.stopped)
        .map(|f| format!("{} ({})", f.global_rank, f.ended))
        .collect();
    if !stopped.is_empty() {
        say(format_args!(
            "stopped by the launcher after the failure: rank {}",
            stopped.join(", rank ")
        ));
    }
    if let Some(own) = std::env::var_os("TORCHELASTIC_ERROR_FILE").filter(|v| !v.is_empty()) {
        let own = PathBuf::from(own);
        match copy_error_file(root, &own) {
            Ok(()) => say(format_args!(
                "root cause's error copied to {}",
                own.display()
            )),
            Err(e) => say(format_args!("could not write {}: {e}", own.display())),
        }
    }
    root.error_file.is_some()
}

/// One failure of the report, as torchrun prints it.
fn describe(index: usize, f: &Failure, host: &str) {
    plain(format_args!("[{index}]:"));
    plain(format_args!("  time      : {}", utc(f.at)));
    plain(format_args!("  host      : {host}"));
    plain(format_args!(
        "  rank      : {} (local_rank: {})",
        f.global_rank, f.local_rank
    ));
    let code = match f.ended {
        Ended::Code(c) => c,
        Ended::Signal(s) => -s,
    };
    plain(format_args!("  exitcode  : {code} (pid: {})", f.pid));
    match &f.error_file {
        Some((path, _)) => plain(format_args!("  error_file: {}", path.display())),
        None => plain("  error_file: <N/A>"),
    }
    let traceback = match (&f.traceback, &f.error_file, f.ended) {
        (Some(tb), _, _) => tb.clone(),
        (None, Some((_, message)), _) => message.clone(),
        (None, None, Ended::Signal(s)) => {
            format!("Signal {s} ({}) received by PID {}", signal_name(s), f.pid)
        }
        (None, None, Ended::Code(_)) => {
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html".into()
        }
    };
    let mut lines = traceback.lines();
    plain(format_args!("  traceback : {}", lines.next().unwrap_or("")));
    for line in lines {
        plain(format_args!("    {line}"));
    }
}

/// torchrun's copy of the root cause's error file into its own: the worker's file with its
/// exit code added (`errorCode`), or, when it wrote none, an error of the launcher's own.
fn copy_error_file(root: &Failure, own: &Path) -> std::io::Result<()> {
    let code = match root.ended {
        Ended::Code(c) => c,
        Ended::Signal(s) => -s,
    };
    let written = root
        .error_file
        .as_ref()
        .and_then(|(path, _)| std::fs::read(path).ok())
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok());
    let json = match written {
        Some(mut v) => {
            if let Some(m) = v.get_mut("message").and_then(|m| m.as_object_mut()) {
                m.entry("errorCode").or_insert(serde_json::json!(code));
            }
            v
        }
        None => {
            let seconds = root
                .at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            serde_json::json!({"message": {
                "message": format!(
                    "ChildFailedError: rank {} (local rank {}, pid {}) ended with {}",
                    root.global_rank, root.local_rank, root.pid, root.ended
                ),
                "errorCode": code,
                "extraInfo": {"py_callstack": "", "timestamp": seconds.to_string()},
            }})
        }
    };
    if let Some(dir) = own.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(own, json.to_string())
}

/// `YYYY-MM-DD_HH:MM:SS` in UTC, torchrun's format for failure times.
fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}_{:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(framework: Framework, master_addr: &str) -> GroupSpec<'_> {
        GroupSpec {
            command: &[],
            role: "default",
            run_id: "job",
            group_rank: 1,
            group_world_size: 2,
            master_addr,
            master_port: 29500,
            restart_count: 0,
            max_restarts: 0,
            extra_env: &[],
            framework,
            virtual_local_rank: false,
            cpu_binding: &[],
        }
    }

    fn ranks(coordinator_port: Option<u16>) -> WorkerRanks {
        WorkerRanks {
            local_rank: 1,
            local_world_size: 2,
            global_rank: 3,
            role_rank: 3,
            world_size: 4,
            role_world_size: 4,
            coordinator_port,
        }
    }

    fn env(spec: &GroupSpec<'_>, r: &WorkerRanks) -> std::collections::BTreeMap<String, String> {
        worker_env(spec, r, Path::new("/e")).into_iter().collect()
    }

    #[test]
    fn failure_times_read_as_torchrun_prints_them() {
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01_00:00:00");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(utc(t), "2024-02-29_23:59:59");
    }

    #[test]
    fn jax_gets_its_coordinator_and_process_numbers() {
        let e = env(&spec(Framework::Jax, "10.1.2.3"), &ranks(Some(41000)));
        assert_eq!(e["JAX_COORDINATOR_ADDRESS"], "10.1.2.3:41000");
        assert_eq!(e["OMPI_MCA_orte_hnp_uri"], "0.0;tcp://10.1.2.3:41000");
        assert_eq!(e["OMPI_COMM_WORLD_SIZE"], "4");
        assert_eq!(e["OMPI_COMM_WORLD_RANK"], "3");
        assert_eq!(e["OMPI_COMM_WORLD_LOCAL_RANK"], "1");
        let v6 = env(&spec(Framework::Jax, "fd00::1"), &ranks(Some(41000)));
        assert_eq!(v6["JAX_COORDINATOR_ADDRESS"], "[fd00::1]:41000");
    }

    #[test]
    fn torch_gets_torchruns_environment_only() {
        let torch = env(&spec(Framework::Torch, "10.1.2.3"), &ranks(Some(41000)));
        // Without a published port there is no coordinator to name.
        let unpublished = env(&spec(Framework::Jax, "10.1.2.3"), &ranks(None));
        for e in [torch, unpublished] {
            assert!(
                e.keys()
                    .all(|k| !k.starts_with("JAX_") && !k.starts_with("OMPI_")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn only_node_rank_0_picks_a_coordinator_port_and_never_master_port() {
        assert_eq!(coordinator_port(Framework::Torch, 0, 29500), None);
        assert_eq!(coordinator_port(Framework::Jax, 1, 29500), None);
        let port = coordinator_port(Framework::Jax, 0, 29500).expect("a free port");
        assert_ne!(port, 29500);
        // Free when picked: JAX's coordinator can bind it on every address.
        std::net::TcpListener::bind(("::", port))
            .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", port)))
            .unwrap();
    }
}
