//! The command line: clap definitions with torchrun's flag names (and their `PET_*`
//! variables, flag over variable), and their translation into a checked `RunConfig`. Nothing
//! here starts a process or talks to etcd; every problem found here is a usage error (exit 2).

use clap::builder::FalseyValueParser;
use clap::{Args, Parser, Subcommand};
use rdzv::Params;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "rdzv",
    version,
    about = "Elastic launcher and operator commands for rdzv runs (etcd v3)",
    long_about = "Elastic launcher and operator commands for rdzv runs (etcd v3).\n\n\
        `rdzv run` is torchrun's elastic agent as a native program: it joins a rendezvous on \
        etcd, starts --nproc-per-node workers of any program with torchrun's environment \
        (RANK, WORLD_SIZE, MASTER_ADDR, ...), and keeps the job going through worker failures \
        (up to --max-restarts) and nodes joining or leaving. `status`, `close` and `purge` \
        look at, end and clean up a run.\n\n\
        Exit status: 0 success, 1 runtime failure (workers failed, etcd unreachable), 2 usage \
        error, 128+N when stopped by signal N."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run PROGRAM as an elastic job: --nproc-per-node workers on this node, every round.
    #[command(
        after_help = "Every option is also read from PET_<NAME> (PET_NNODES, PET_NPROC_PER_NODE, \
            PET_RDZV_ENDPOINT, ...) as torchrun does; a flag wins over its variable.\n\n\
            Examples:\n  \
            rdzv run --nnodes=2 --nproc-per-node=4 --rdzv-endpoint=etcd:2379 --rdzv-id=job42 train.py --lr 0.1\n  \
            rdzv run --rdzv 'etcd://etcd:2379/job42?min_nodes=1&max_nodes=4' ./worker\n  \
            rdzv run --standalone --nproc-per-node=cpu ./worker"
    )]
    Run(Box<RunArgs>),
    /// Show a run: open or closed, its rounds, members in rank order, waiting and lost nodes.
    Status(StatusArgs),
    /// Close a run: every launcher ends its workers gracefully and exits.
    Close(UrlArg),
    /// Delete what a run left in etcd (refused while any of its nodes is alive).
    Purge(PurgeArgs),
    /// Announce that a node will leave (preemption, maintenance, scale-down): the others re-form
    /// without it at once, and its launcher stops its workers and exits 0.
    Drain(DrainArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Number of nodes, or the range MIN:MAX for an elastic job.
    #[arg(
        long,
        alias = "nnodes",
        env = "PET_NNODES",
        default_value = "1:1",
        value_name = "N|MIN:MAX"
    )]
    pub nnodes: String,
    /// Workers on this node: a number, `cpu` (one per CPU), `gpu` or `auto` (one per GPU if
    /// there are any, else one per CPU).
    #[arg(
        long,
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        default_value = "1",
        value_name = "N|cpu|gpu|auto"
    )]
    pub nproc_per_node: String,
    /// Rendezvous backend: etcd-v3 (etcd and etcd-v2 are accepted: rdzv speaks etcd's v3 API).
    #[arg(
        long,
        alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        default_value = "etcd-v3"
    )]
    pub rdzv_backend: String,
    /// etcd endpoints: HOST:PORT[,HOST:PORT...].
    #[arg(
        long,
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        value_name = "HOST:PORT"
    )]
    pub rdzv_endpoint: Option<String>,
    /// The job's id: every node of one job passes the same.
    #[arg(
        long,
        alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none",
        value_name = "ID"
    )]
    pub rdzv_id: String,
    /// Rendezvous options, KEY=VALUE,... (join_timeout, last_call_timeout, lease_ttl, ...: any
    /// option of an rdzv URL).
    #[arg(
        long,
        alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        hide_env_values = true,
        value_name = "K=V,..."
    )]
    pub rdzv_conf: Option<String>,
    /// The whole rendezvous as one URL, instead of --rdzv-endpoint and --rdzv-id:
    /// etcd://HOST:PORT/JOB?min_nodes=...&max_nodes=...
    #[arg(
        long,
        env = "PET_RDZV",
        hide_env_values = true,
        value_name = "URL",
        conflicts_with_all = ["rdzv_endpoint", "rdzv_id"]
    )]
    pub rdzv: Option<String>,
    /// One node on this machine with no etcd: local ranks, MASTER_ADDR=localhost, a free port.
    #[arg(long, env = "PET_STANDALONE", value_parser = FalseyValueParser::new())]
    pub standalone: bool,
    /// Restarts of the worker group after a worker fails, before the job fails. Restarts
    /// for nodes joining or leaving do not count.
    #[arg(
        long,
        alias = "max_restarts",
        env = "PET_MAX_RESTARTS",
        default_value_t = 0
    )]
    pub max_restarts: u32,
    /// How often to check the workers and the membership, in seconds.
    #[arg(
        long,
        alias = "monitor_interval",
        env = "PET_MONITOR_INTERVAL",
        default_value = "0.1",
        value_name = "SECONDS"
    )]
    pub monitor_interval: String,
    /// The workers' role (ROLE_NAME); roles get role ranks across nodes.
    #[arg(long, env = "PET_ROLE", default_value = "default")]
    pub role: String,
    /// This node's address as the others should reach it (MASTER_ADDR when it is rank 0).
    #[arg(
        long,
        alias = "local_addr",
        env = "PET_LOCAL_ADDR",
        value_name = "ADDR"
    )]
    pub local_addr: Option<String>,
    /// Base directory for per-worker logs and error files:
    /// DIR/RUNID_XXXX/attempt_N/LOCAL_RANK/{stdout.log,stderr.log,error.json}.
    #[arg(long, alias = "log_dir", env = "PET_LOG_DIR", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Send worker streams to log files instead of the console: 0 none, 1 stdout, 2 stderr,
    /// 3 both, or per local rank (0:1,1:2).
    #[arg(
        short = 'r',
        long,
        env = "PET_REDIRECTS",
        default_value = "0",
        value_name = "SPEC"
    )]
    pub redirects: String,
    /// Send worker streams to log files and to the console (same SPEC as --redirects).
    #[arg(
        short = 't',
        long,
        env = "PET_TEE",
        default_value = "0",
        value_name = "SPEC"
    )]
    pub tee: String,
    /// Show only these local ranks' output on the console (files keep everything): 0,1,2.
    #[arg(
        long,
        alias = "local_ranks_filter",
        env = "PET_LOCAL_RANKS_FILTER",
        value_name = "RANKS"
    )]
    pub local_ranks_filter: Option<String>,
    /// Run PROGRAM as it is, even if it ends in .py.
    #[arg(long, alias = "no_python", env = "PET_NO_PYTHON", value_parser = FalseyValueParser::new())]
    pub no_python: bool,
    /// Run PROGRAM as a Python module (python3 -m PROGRAM).
    #[arg(short = 'm', long, env = "PET_MODULE", value_parser = FalseyValueParser::new())]
    pub module: bool,
    /// What the workers are written for, beyond torchrun's environment: `torch` (that
    /// environment alone) or `jax` (also what an argument-less `jax.distributed.initialize()`
    /// reads: a coordinator on a free port of node rank 0, process count and id; see
    /// docs/LAUNCHER.md).
    #[arg(
        long,
        env = "PET_FRAMEWORK",
        value_enum,
        default_value_t = Framework::Torch,
        value_name = "torch|jax"
    )]
    pub framework: Framework,
    /// Seconds workers get to exit after SIGTERM before SIGKILL.
    #[arg(
        long,
        alias = "shutdown_timeout",
        env = "PET_SHUTDOWN_TIMEOUT",
        default_value = "30",
        value_name = "SECONDS"
    )]
    pub shutdown_timeout: String,
    /// Seconds a node whose workers all succeeded waits for the other nodes' workers.
    #[arg(
        long,
        env = "PET_EXIT_BARRIER_TIMEOUT",
        default_value = "300",
        value_name = "SECONDS"
    )]
    pub exit_barrier_timeout: String,
    /// Start no watchdog. By default a small helper process releases this node the moment
    /// the launcher dies without leaving (SIGKILL, the OOM killer), so the other nodes re-form
    /// at once; without it they notice when this node's lease expires (lease_ttl).
    #[arg(long, env = "RDZV_NO_WATCHDOG", value_parser = FalseyValueParser::new())]
    pub no_watchdog: bool,
    /// The program to start (a .py file runs under python3).
    #[arg(value_name = "PROGRAM")]
    pub program: String,
    /// Its arguments, passed as they are.
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct UrlArg {
    /// The run: etcd://HOST:PORT[,HOST:PORT...]/RUN_ID[?key_prefix=...&...]
    pub url: String,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print one JSON object (with --watch, one per line).
    #[arg(long)]
    pub json: bool,
    /// Keep watching: one line per change as it happens, until interrupted.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub run: UrlArg,
}

#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Delete even while nodes of the run are alive (they will fail).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub run: UrlArg,
}

#[derive(Args, Debug)]
pub struct DrainArgs {
    /// Why the node leaves: shown to the node and in logs.
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub run: UrlArg,
    /// The node's id, as `rdzv status` lists it (and its launcher prints when it joins).
    pub node_id: String,
}

/// The framework the workers use, for what it needs from the launcher beyond torchrun's
/// environment.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// torchrun's environment and nothing else (also what Lightning and DeepSpeed read).
    Torch,
    /// Also JAX's: JAX_COORDINATOR_ADDRESS on a port of its own, and the process count, id and
    /// local id where `jax.distributed.initialize()` finds them (Open MPI's names).
    Jax,
}

/// Which of a worker's streams a `--redirects`/`--tee` spec selects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdout: bool,
    pub stderr: bool,
}

/// A `--redirects`/`--tee` spec: one setting for every local rank, or one per local rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamSpec {
    All(Streams),
    PerRank(Vec<(u32, Streams)>),
}

impl StreamSpec {
    pub fn for_rank(&self, local_rank: u32) -> Streams {
        match self {
            StreamSpec::All(s) => *s,
            StreamSpec::PerRank(map) => map
                .iter()
                .find(|(r, _)| *r == local_rank)
                .map_or_else(Streams::default, |(_, s)| *s),
        }
    }
    fn any(&self) -> bool {
        match self {
            StreamSpec::All(s) => s.stdout || s.stderr,
            StreamSpec::PerRank(map) => map.iter().any(|(_, s)| s.stdout || s.stderr),
        }
    }
}

/// Where the rendezvous happens.
#[derive(Debug)]
pub enum Rendezvous {
    /// On etcd, with these parameters.
    Etcd(Box<Params>),
    /// No etcd: this node alone.
    Standalone,
}

/// A checked `rdzv run` invocation.
#[derive(Debug)]
pub struct RunConfig {
    pub rendezvous: Rendezvous,
    /// The run id workers see (TORCHELASTIC_RUN_ID).
    pub run_id: String,
    pub nproc_per_node: u32,
    pub max_restarts: u32,
    pub monitor_interval: Duration,
    pub role: String,
    pub framework: Framework,
    /// The command each worker runs: program and arguments.
    pub command: Vec<String>,
    /// The Python script PROGRAM names, when it runs under python3.
    pub script: Option<PathBuf>,
    pub log_dir: Option<PathBuf>,
    pub redirects: StreamSpec,
    pub tee: StreamSpec,
    pub local_ranks_filter: Option<Vec<u32>>,
    pub shutdown_timeout: Duration,
    pub exit_barrier_timeout: Duration,
    /// Start the watchdog that releases this node if the launcher is killed (`watchdog.rs`).
    pub watchdog: bool,
    /// Lines to tell the user before starting (notes on accepted aliases, defaults taken).
    pub notes: Vec<String>,
}

/// A usage error: one line naming the flag and what was expected.
#[derive(Debug)]
pub struct Usage(pub String);

fn usage(message: impl Into<String>) -> Usage {
    Usage(message.into())
}

/// Turns parsed flags into a `RunConfig`, checking everything clap cannot.
pub fn run_config(a: Box<RunArgs>) -> Result<RunConfig, Usage> {
    let mut notes = Vec::new();
    let (min_nodes, max_nodes) = parse_nnodes(&a.nnodes)?;
    let nproc_per_node = local_world_size(&a.nproc_per_node, &mut notes)?;
    let monitor_interval = seconds("--monitor-interval", &a.monitor_interval, false)?;
    let shutdown_timeout = seconds("--shutdown-timeout", &a.shutdown_timeout, true)?;
    let exit_barrier_timeout = seconds("--exit-barrier-timeout", &a.exit_barrier_timeout, true)?;
    let redirects = parse_streams("--redirects", &a.redirects)?;
    let tee = parse_streams("--tee", &a.tee)?;
    let local_ranks_filter = a
        .local_ranks_filter
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(parse_ranks)
        .transpose()?;
    if a.role.is_empty() {
        return Err(usage("--role: expected a non-empty name"));
    }
    let command = worker_command(&a)?;
    let script = (!a.no_python && !a.module && a.program.ends_with(".py"))
        .then(|| PathBuf::from(&a.program));
    let nnodes_given = a.nnodes != "1:1";

    let rendezvous = match (&a.rdzv, &a.rdzv_endpoint, a.standalone) {
        (_, _, true) => {
            if max_nodes > 1 {
                return Err(usage(format!(
                    "--standalone: runs one node, but --nnodes={} asks for up to {max_nodes}",
                    a.nnodes
                )));
            }
            Rendezvous::Standalone
        }
        (None, None, false) if max_nodes == 1 => {
            // torchrun without rendezvous flags runs a single node too.
            notes.push("no --rdzv-endpoint: running one node on this machine (as --standalone)".into());
            Rendezvous::Standalone
        }
        (None, None, false) => {
            return Err(usage(format!(
                "--rdzv-endpoint: required for --nnodes={} (or give --rdzv URL, or --standalone for one node)",
                a.nnodes
            )))
        }
        (url, endpoint, false) => {
            let backend = match a.rdzv_backend.as_str() {
                "etcd-v3" => "etcd-v3",
                "etcd" | "etcd-v2" => {
                    notes.push(format!(
                        "--rdzv-backend={}: rdzv speaks etcd's v3 API (etcd 3.4 and later); using etcd-v3",
                        a.rdzv_backend
                    ));
                    "etcd-v3"
                }
                other => {
                    return Err(usage(format!(
                        "--rdzv-backend: expected etcd-v3 (or etcd, etcd-v2), got {other:?}; \
                         use --standalone for one node without etcd"
                    )))
                }
            };
            let mut params = match (url, endpoint) {
                (Some(url), _) => {
                    let mut p = Params::from_url(url).map_err(|e| usage(format!("--rdzv: {}", e.message())))?;
                    if nnodes_given {
                        p.set("nnodes", &format!("{min_nodes}:{max_nodes}"))
                            .map_err(|e| usage(format!("--nnodes: {}", e.message())))?;
                    }
                    p
                }
                (None, Some(endpoint)) => {
                    Params::new(backend, endpoint, &a.rdzv_id, min_nodes, max_nodes)
                        .map_err(|e| usage(format!("--rdzv-endpoint/--rdzv-id: {}", e.message())))?
                }
                (None, None) => unreachable!("handled above"),
            };
            for (key, value) in parse_conf(a.rdzv_conf.as_deref().unwrap_or(""))? {
                params
                    .set(&key, &value)
                    .map_err(|e| usage(format!("--rdzv-conf: {}", e.message())))?;
            }
            if let Some(addr) = &a.local_addr {
                params
                    .set("local_addr", addr)
                    .map_err(|e| usage(format!("--local-addr: {}", e.message())))?;
            }
            Rendezvous::Etcd(Box::new(params))
        }
    };
    let run_id = match &rendezvous {
        Rendezvous::Etcd(p) => p.run_id.clone(),
        // torchrun's standalone mode makes up a run id too.
        Rendezvous::Standalone => format!("standalone-{:016x}", random_u64()),
    };
    Ok(RunConfig {
        rendezvous,
        run_id,
        nproc_per_node,
        max_restarts: a.max_restarts,
        monitor_interval,
        role: a.role,
        framework: a.framework,
        command,
        script,
        log_dir: a.log_dir,
        redirects,
        tee,
        local_ranks_filter,
        shutdown_timeout,
        exit_barrier_timeout,
        watchdog: !a.no_watchdog,
        notes,
    })
}

impl RunConfig {
    /// Whether worker output goes to files: a log directory was asked for, or a spec needs one.
    pub fn keeps_files(&self) -> bool {
        self.log_dir.is_some() || self.redirects.any() || self.tee.any()
    }
}

/// `N` or `MIN:MAX`, with 1 <= MIN <= MAX.
pub fn parse_nnodes(s: &str) -> Result<(u32, u32), Usage> {
    let bad = || {
        usage(format!(
            "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got {s:?}"
        ))
    };
    let count = |v: &str| -> Result<u32, Usage> {
        match v.trim().parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(bad()),
        }
    };
    let (min, max) = match s.split_once(':') {
        Some((a, b)) => (count(a)?, count(b)?),
        None => {
            let n = count(s)?;
            (n, n)
        }
    };
    if min > max {
        return Err(bad());
    }
    Ok((min, max))
}

/// `--nproc-per-node`: a number, or `cpu`, `gpu`, `auto` as torchrun resolves them.
fn local_world_size(s: &str, notes: &mut Vec<String>) -> Result<u32, Usage> {
    let n = match s {
        "cpu" => cpus(),
        "gpu" => match gpus() {
            0 => return Err(usage("--nproc-per-node=gpu: no GPU found on this machine")),
            n => n,
        },
        "auto" => match gpus() {
            0 => cpus(),
            n => n,
        },
        _ => match s.parse::<u32>() {
            Ok(n) if n >= 1 => return Ok(n),
            _ => {
                return Err(usage(format!(
                    "--nproc-per-node: expected a number >= 1, cpu, gpu or auto, got {s:?}"
                )))
            }
        },
    };
    notes.push(format!(
        "--nproc-per-node={s}: starting {n} workers per node"
    ));
    Ok(n)
}

fn cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else NVIDIA device nodes.
fn gpus() -> u32 {
    if let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return visible.split(',').filter(|d| !d.trim().is_empty()).count() as u32;
    }
    let Ok(dir) = std::fs::read_dir("/dev") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count() as u32
}

/// Plain non-negative seconds (`0.5`, `30`).
fn seconds(flag: &str, s: &str, zero_ok: bool) -> Result<Duration, Usage> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && (zero_ok || v > 0.0) && v < 1e9 => {
            Ok(Duration::from_secs_f64(v))
        }
        _ => Err(usage(format!(
            "{flag}: expected a number of seconds{}, got {s:?}",
            if zero_ok { "" } else { " above 0" }
        ))),
    }
}

/// torchrun's `Std` spec: `0`-`3` for every rank, or `LOCAL_RANK:0-3,...`.
pub fn parse_streams(flag: &str, s: &str) -> Result<StreamSpec, Usage> {
    let bad = || {
        usage(format!(
            "{flag}: expected 0, 1, 2, 3 or LOCAL_RANK:N,... (e.g. 0:3,1:2), got {s:?}"
        ))
    };
    let one = |v: &str| -> Result<Streams, Usage> {
        match v.trim() {
            "0" => Ok(Streams::default()),
            "1" => Ok(Streams {
                stdout: true,
                stderr: false,
            }),
            "2" => Ok(Streams {
                stdout: false,
                stderr: true,
            }),
            "3" => Ok(Streams {
                stdout: true,
                stderr: true,
            }),
            _ => Err(bad()),
        }
    };
    if !s.contains(':') {
        return Ok(StreamSpec::All(one(s)?));
    }
    let map = s
        .split(',')
        .map(|item| {
            let (rank, v) = item.split_once(':').ok_or_else(bad)?;
            let rank = rank.trim().parse::<u32>().map_err(|_| bad())?;
            Ok((rank, one(v)?))
        })
        .collect::<Result<Vec<_>, Usage>>()?;
    Ok(StreamSpec::PerRank(map))
}

fn parse_ranks(s: &str) -> Result<Vec<u32>, Usage> {
    s.split(',')
        .map(|r| r.trim().parse::<u32>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            usage(format!(
                "--local-ranks-filter: expected local ranks like 0,1,2, got {s:?}"
            ))
        })
}

/// `key=value,key=value` (torchrun's --rdzv-conf).
pub fn parse_conf(s: &str) -> Result<Vec<(String, String)>, Usage> {
    s.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| usage(format!("--rdzv-conf: expected KEY=VALUE,..., got {item:?}")))
        })
        .collect()
}

/// What each worker executes: a `.py` program (or `--module`) under python3 with `-u`, as
/// torchrun does, anything else as it is.
fn worker_command(a: &RunArgs) -> Result<Vec<String>, Usage> {
    if a.no_python && a.module {
        return Err(usage("--no-python and --module cannot be used together"));
    }
    if a.program.is_empty() {
        return Err(usage("PROGRAM: expected a program to run"));
    }
    let python = python();
    let mut command = Vec::new();
    if a.module {
        command.extend([python, "-u".into(), "-m".into()]);
    } else if !a.no_python && a.program.ends_with(".py") {
        command.extend([python, "-u".into()]);
    }
    command.push(a.program.clone());
    command.extend(a.args.iter().cloned());
    Ok(command)
}

/// The Python that runs `.py` programs and modules: `PYTHON_EXEC`, else the `python3` beside
/// this command (a virtual environment's, where `pip install rdzv` put the command: torchrun
/// likewise runs workers under its own interpreter, so a venv's packages are there without
/// activating it), else `python3` on PATH.
fn python() -> String {
    if let Ok(python) = std::env::var("PYTHON_EXEC") {
        return python;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("python3")))
        .filter(|beside| beside.is_file())
        .map_or_else(|| "python3".into(), |beside| beside.display().to_string())
}

/// Fails early, before joining a rendezvous others would wait on, when the program cannot
/// be started at all: not found on PATH, not a file, not executable, or a missing script.
pub fn check_program(cfg: &RunConfig) -> Result<(), Usage> {
    let exe = &cfg.command[0];
    if find_executable(exe).is_none() {
        return Err(usage(format!(
            "PROGRAM: {exe:?} not found (no such file, or not an executable on PATH)"
        )));
    }
    match &cfg.script {
        Some(script) if !script.is_file() => Err(usage(format!(
            "PROGRAM: no such Python script {:?}",
            script.display()
        ))),
        _ => Ok(()),
    }
}

fn find_executable(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return runnable(&p).then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| runnable(p))
}

/// A random number for ids and directory names.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS: enough for a name that must not collide by accident.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnodes() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
        for bad in ["3:2", "0", "0:2", "a", "1:2:3", ""] {
            assert!(parse_nnodes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stream_specs() {
        assert_eq!(
            parse_streams("-r", "3").unwrap().for_rank(5),
            Streams {
                stdout: true,
                stderr: true
            }
        );
        let per = parse_streams("-r", "0:1,1:2").unwrap();
        assert!(per.for_rank(0).stdout && !per.for_rank(0).stderr);
        assert!(per.for_rank(1).stderr && !per.for_rank(1).stdout);
        assert_eq!(per.for_rank(2), Streams::default());
        assert!(parse_streams("-r", "4").is_err());
    }

    #[test]
    fn conf() {
        assert_eq!(
            parse_conf("join_timeout=5, lease_ttl=2").unwrap(),
            vec![
                ("join_timeout".into(), "5".into()),
                ("lease_ttl".into(), "2".into())
            ]
        );
        assert!(parse_conf("oops").is_err());
    }
}
