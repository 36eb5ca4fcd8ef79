//! The command line: clap definitions with torchrun's flag names (and their `PET_*`
//! variables, flag over variable), and their translation into a checked `RunConfig`. Nothing
//! here starts a process or talks to etcd; every problem found here is a usage error (exit 2).

use crate::exit::{usage, Usage};
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
            rdzv run --standalone --nproc-per-node=cpu ./worker\n  \
            rdzv run --nnodes=2 --node-rank=0 --master-addr=node0 --master-port=29500 train.py\n\n\
            A flag given twice takes its last value, as in torchrun.",
        args_override_self = true
    )]
    Run(Box<RunArgs>),
    /// Show a run: open or closed, its rounds, members in rank order, waiting and lost nodes.
    #[command(args_override_self = true)]
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
    /// Workers on this node: a number, `cpu` (one per CPU), `gpu` (one per NVIDIA or AMD GPU),
    /// `xpu` (one per Intel data-center or discrete GPU) or `auto` (one per GPU, else per XPU,
    /// else per CPU).
    #[arg(
        long,
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        default_value = "1",
        value_name = "N|cpu|gpu|xpu|auto"
    )]
    pub nproc_per_node: String,
    /// Rendezvous backend: etcd-v3 (etcd and etcd-v2 are accepted: rdzv speaks etcd's v3 API);
    /// c10d (the endpoint's node serves an embedded etcd); static (fixed --nnodes, --node-rank,
    /// --master-addr, --master-port, no rendezvous).
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
    /// Run a .py PROGRAM under python3 even with --no-python (torchrun runs it with runpy in
    /// its own interpreter; here each worker is a python3 process, which is the same program).
    #[arg(long, alias = "run_path", env = "PET_RUN_PATH", value_parser = FalseyValueParser::new())]
    pub run_path: bool,
    /// Accepted for torchrun's command lines; every worker is a new process here (`spawn`).
    #[arg(
        long,
        alias = "start_method",
        env = "PET_START_METHOD",
        default_value = "spawn",
        value_parser = ["spawn", "fork", "forkserver"]
    )]
    pub start_method: String,
    /// Signals forwarded to the workers (the launcher then exits 128+N): a comma-separated
    /// list of names; add SIGUSR1,SIGUSR2 under Slurm.
    #[arg(
        long,
        alias = "signals_to_handle",
        env = "PET_SIGNALS_TO_HANDLE",
        default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        value_name = "SIG,..."
    )]
    pub signals_to_handle: String,
    /// LOCAL_RANK=0 for every worker, and CUDA_VISIBLE_DEVICES narrowed to the worker's own
    /// GPU (the local rank's entry of the launcher's CUDA_VISIBLE_DEVICES, else the local rank).
    #[arg(
        long,
        alias = "virtual_local_rank",
        env = "PET_VIRTUAL_LOCAL_RANK",
        value_parser = FalseyValueParser::new()
    )]
    pub virtual_local_rank: bool,
    /// Prefix of teed console lines; ${role_name}, ${rank}, ${local_rank}, ${hostname} are
    /// replaced (default `[${role_name}${local_rank}]:`, as torchrun; also read from
    /// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, which the flag overrides).
    #[arg(
        long,
        alias = "log_line_prefix_template",
        env = "PET_LOG_LINE_PREFIX_TEMPLATE",
        value_name = "TEMPLATE"
    )]
    pub log_line_prefix_template: Option<String>,
    /// Also copy teed stdout lines containing any of these strings (`,,` is a literal comma)
    /// to attempt_N/filtered_stdout.log.
    #[arg(
        long,
        alias = "duplicate_stdout_filters",
        env = "PET_DUPLICATE_STDOUT_FILTERS",
        value_name = "TEXT,..."
    )]
    pub duplicate_stdout_filters: Option<String>,
    /// The same for stderr, to attempt_N/filtered_stderr.log.
    #[arg(
        long,
        alias = "duplicate_stderr_filters",
        env = "PET_DUPLICATE_STDERR_FILTERS",
        value_name = "TEXT,..."
    )]
    pub duplicate_stderr_filters: Option<String>,
    /// Binds each worker to the CPUs near its GPU (local rank i uses device i), with torchrun's
    /// policies: node (the GPU's NUMA node), socket (its socket), exclusive (its share of the
    /// node's physical cores), core-complex (one group of cores sharing a last-level cache).
    #[arg(
        long,
        alias = "numa_binding",
        value_parser = clap::builder::PossibleValuesParser::new(crate::host::numa::Policy::NAMES)
    )]
    pub numa_binding: Option<String>,
    /// torchrun's LogsSpecs plugin name: accepted; rdzv has no plugins and keeps torchrun's
    /// default layout (a note says so).
    #[arg(long, alias = "logs_specs", value_name = "NAME")]
    pub logs_specs: Option<String>,
    /// torchrun's event handler name: accepted; rdzv's events are its `[rdzv]` lines (a note
    /// says so for anything but `null`).
    #[arg(
        long,
        alias = "event_log_handler",
        env = "PET_EVENT_LOG_HANDLER",
        default_value = "null",
        value_name = "NAME"
    )]
    pub event_log_handler: String,
    /// Static rendezvous: this node's rank, 0..N-1 for a fixed --nnodes=N.
    #[arg(long, alias = "node_rank", env = "PET_NODE_RANK", value_name = "RANK")]
    pub node_rank: Option<u32>,
    /// Static rendezvous: node rank 0's address (MASTER_ADDR); default 127.0.0.1.
    #[arg(
        long,
        alias = "master_addr",
        env = "PET_MASTER_ADDR",
        value_name = "ADDR"
    )]
    pub master_addr: Option<String>,
    /// Static rendezvous: the port rank 0's worker serves the c10d store on (MASTER_PORT);
    /// default 29500.
    #[arg(
        long,
        alias = "master_port",
        env = "PET_MASTER_PORT",
        value_name = "PORT"
    )]
    pub master_port: Option<u16>,
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
    /// Seconds workers get to exit after SIGTERM before SIGKILL (default: the
    /// TORCH_ELASTIC_SHUTDOWN_TIMEOUT variable, else 30, as torchrun).
    #[arg(
        long,
        alias = "shutdown_timeout",
        env = "PET_SHUTDOWN_TIMEOUT",
        value_name = "SECONDS"
    )]
    pub shutdown_timeout: Option<String>,
    /// Seconds a node whose workers all succeeded waits for the other nodes' workers.
    #[arg(
        long,
        alias = "exit_barrier_timeout",
        env = "PET_EXIT_BARRIER_TIMEOUT",
        default_value = "300",
        value_name = "SECONDS"
    )]
    pub exit_barrier_timeout: String,
    /// Print a shell completion script for the rdzv command and exit (bash, zsh, tcsh).
    #[arg(
        long,
        alias = "print_completion",
        value_parser = ["bash", "zsh", "tcsh"],
        value_name = "SHELL"
    )]
    pub print_completion: Option<String>,
    /// Start no watchdog. By default a small helper process releases this node the moment
    /// the launcher dies without leaving (SIGKILL, the OOM killer), so the other nodes re-form
    /// at once; without it they notice when this node's lease expires (lease_ttl).
    #[arg(long, env = "RDZV_NO_WATCHDOG", value_parser = FalseyValueParser::new())]
    pub no_watchdog: bool,
    /// The program to start and its arguments. Everything from PROGRAM on is the program's,
    /// flags included (`train.py --help` asks the script for its help), as torchrun hands
    /// it to the script. PROGRAM runs under python3 unless it is an executable file (an ELF
    /// binary or a `#!` script) or a command on PATH, or --no-python is given.
    #[arg(
        value_name = "PROGRAM [ARGS]",
        trailing_var_arg = true,
        num_args = 1..,
        required_unless_present = "print_completion"
    )]
    pub command: Vec<String>,
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
    /// The run as `rdzv run` names it (instead of URL): etcd endpoints HOST:PORT[,...].
    #[arg(
        long,
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        value_name = "HOST:PORT"
    )]
    pub rdzv_endpoint: Option<String>,
    /// With --rdzv-endpoint: the job's id.
    #[arg(
        long,
        alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none",
        value_name = "ID"
    )]
    pub rdzv_id: String,
    /// With --rdzv-endpoint: rendezvous options as `rdzv run` takes them (key_prefix, ...).
    #[arg(
        long,
        alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        hide_env_values = true,
        value_name = "K=V,..."
    )]
    pub rdzv_conf: Option<String>,
    /// The run: etcd://HOST:PORT[,HOST:PORT...]/RUN_ID[?key_prefix=...&...]
    #[arg(
        required_unless_present = "rdzv_endpoint",
        conflicts_with = "rdzv_endpoint"
    )]
    pub url: Option<String>,
}

impl StatusArgs {
    /// The run's URL, from URL or from `rdzv run`'s flags.
    pub fn url(&self) -> Result<String, Usage> {
        if let Some(url) = &self.url {
            return Ok(url.clone());
        }
        let endpoint = self.rdzv_endpoint.as_deref().unwrap_or_default();
        if endpoint.is_empty() || endpoint.contains('/') || endpoint.contains('?') {
            return Err(usage(format!(
                "--rdzv-endpoint: expected HOST:PORT[,HOST:PORT...], got {endpoint:?}"
            )));
        }
        if self.rdzv_id.is_empty() || self.rdzv_id.contains(['/', '?', '&', '#']) {
            return Err(usage(format!(
                "--rdzv-id: expected a run id, got {:?}",
                self.rdzv_id
            )));
        }
        let query: Vec<String> = parse_conf(self.rdzv_conf.as_deref().unwrap_or(""))?
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Ok(match query.is_empty() {
            true => format!("etcd://{endpoint}/{}", self.rdzv_id),
            false => format!("etcd://{endpoint}/{}?{}", self.rdzv_id, query.join("&")),
        })
    }
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
    /// No etcd: a fixed layout (`--standalone`, or torchrun's static backend).
    Static(StaticRound),
}

/// The one round of a job without a rendezvous: this node's place and rank 0's address.
#[derive(Debug, Clone)]
pub struct StaticRound {
    pub node_rank: u32,
    pub nnodes: u32,
    pub master_addr: String,
    /// `None`: a free port of this machine, picked anew for each group.
    pub master_port: Option<u16>,
    /// One node on this machine (`--standalone`, or no rendezvous flags at all).
    pub standalone: bool,
}

impl StaticRound {
    fn standalone() -> StaticRound {
        StaticRound {
            node_rank: 0,
            nnodes: 1,
            master_addr: "localhost".into(),
            master_port: None,
            standalone: true,
        }
    }
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
    /// `--rdzv-backend=c10d`: the endpoint (HOST:PORT) an embedded etcd serves, when this node
    /// is the one it names.
    pub c10d: Option<String>,
    /// torch's `is_host` (`--rdzv-conf`): this node serves the c10d rendezvous (true) or
    /// never does (false), whatever the endpoint's address; unset, the address decides.
    pub c10d_is_host: Option<bool>,
    /// The signals forwarded to the workers, and the flag's text (the workers see it).
    pub signals: Vec<i32>,
    pub signals_to_handle: String,
    pub virtual_local_rank: bool,
    /// `--numa-binding`: the policy and its name.
    pub numa_binding: Option<crate::host::numa::Policy>,
    pub log_line_prefix_template: Option<String>,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
    /// Start the watchdog that releases this node if the launcher is killed (`watchdog.rs`).
    pub watchdog: bool,
    /// Lines to tell the user before starting (notes on accepted aliases, defaults taken).
    pub notes: Vec<String>,
}

/// Turns parsed flags into a `RunConfig`, checking everything clap cannot.
pub fn run_config(a: Box<RunArgs>) -> Result<RunConfig, Usage> {
    let numa_binding = match a.numa_binding.as_deref() {
        Some(name) => Some(crate::host::numa::Policy::parse(name).ok_or_else(|| {
            usage(format!(
                "--numa-binding: expected one of {}, got {name:?}",
                crate::host::numa::Policy::NAMES.join(", ")
            ))
        })?),
        None => None,
    };
    let mut notes = Vec::new();
    let (min_nodes, max_nodes) = parse_nnodes(&a.nnodes)?;
    let nproc_per_node = local_world_size(&a.nproc_per_node, &mut notes)?;
    let monitor_interval = seconds("--monitor-interval", &a.monitor_interval, false)?;
    let shutdown_timeout = match &a.shutdown_timeout {
        Some(given) => seconds("--shutdown-timeout", given, true)?,
        None => match std::env::var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
            Ok(v) if !v.is_empty() => seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &v, true)?,
            _ => Duration::from_secs(30),
        },
    };
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
    let (command, script) = worker_command(&a)?;
    let nnodes_given = a.nnodes != "1:1";
    let mut c10d = None;
    let mut c10d_is_host = None;

    let static_flags = a.node_rank.is_some() || a.master_addr.is_some() || a.master_port.is_some();
    let rendezvous = match (&a.rdzv, &a.rdzv_endpoint, a.standalone) {
        (_, _, true) => {
            if max_nodes > 1 {
                return Err(usage(format!(
                    "--standalone: runs one node, but --nnodes={} asks for up to {max_nodes}",
                    a.nnodes
                )));
            }
            Rendezvous::Static(StaticRound::standalone())
        }
        (None, endpoint, false)
            if a.rdzv_backend == "static" || (endpoint.is_none() && static_flags) =>
        {
            static_round(&a, min_nodes, max_nodes, endpoint.as_deref())?
        }
        (None, None, false) if max_nodes == 1 => {
            // torchrun without rendezvous flags runs a single node too.
            notes.push(
                "no --rdzv-endpoint: running one node on this machine (as --standalone)".into(),
            );
            Rendezvous::Static(StaticRound::standalone())
        }
        (None, None, false) => {
            return Err(usage(format!(
            "--rdzv-endpoint: required for --nnodes={} (or give --rdzv URL, --standalone for one \
                 node, or --node-rank/--master-addr/--master-port for a static job)",
            a.nnodes
        )))
        }
        (url, endpoint, false) => {
            let backend = match a.rdzv_backend.as_str() {
                "etcd-v3" | "c10d" => "etcd-v3",
                "etcd" | "etcd-v2" => {
                    notes.push(format!(
                        "--rdzv-backend={}: rdzv speaks etcd's v3 API (etcd 3.4 and later); using etcd-v3",
                        a.rdzv_backend
                    ));
                    "etcd-v3"
                }
                other => {
                    return Err(usage(format!(
                        "--rdzv-backend: expected etcd-v3, c10d, static (or etcd, etcd-v2), got {other:?}"
                    )))
                }
            };
            if a.rdzv_backend == "c10d" && url.is_some() {
                return Err(usage(
                    "--rdzv-backend=c10d: give --rdzv-endpoint=HOST:PORT, not --rdzv",
                ));
            }
            let mut params = match (url, endpoint) {
                (Some(url), _) => {
                    let mut p = Params::from_url(url)
                        .map_err(|e| usage(format!("--rdzv: {}", e.message())))?;
                    if nnodes_given {
                        p.set("nnodes", &format!("{min_nodes}:{max_nodes}"))
                            .map_err(|e| usage(format!("--nnodes: {}", e.message())))?;
                    }
                    p
                }
                (None, Some(endpoint)) => {
                    // torchrun's c10d endpoint defaults to port 29400.
                    let endpoint = match a.rdzv_backend == "c10d" && !endpoint.contains(':') {
                        true => format!("{endpoint}:29400"),
                        false => endpoint.clone(),
                    };
                    Params::new(backend, &endpoint, &a.rdzv_id, min_nodes, max_nodes)
                        .map_err(|e| usage(format!("--rdzv-endpoint/--rdzv-id: {}", e.message())))?
                }
                (None, None) => unreachable!("handled above"),
            };
            let conf = parse_conf(a.rdzv_conf.as_deref().unwrap_or(""))?;
            let torch = torch_conf(&conf, &mut notes)?;
            for (key, value) in conf
                .iter()
                .filter(|(k, _)| !TORCH_CONF.contains(&k.as_str()))
            {
                params
                    .set(key, value)
                    .map_err(|e| usage(format!("--rdzv-conf: {}", e.message())))?;
            }
            let lease_given = conf
                .iter()
                .any(|(k, _)| k == "lease_ttl" || k == "keep_alive_ttl");
            if let (Some(ttl), false) = (torch.lease_ttl, lease_given) {
                params.set("lease_ttl", &ttl.to_string()).map_err(|e| {
                    usage(format!("--rdzv-conf: keep_alive_interval: {}", e.message()))
                })?;
            }
            c10d_is_host = torch.is_host;
            if let Some(addr) = &a.local_addr {
                params
                    .set("local_addr", addr)
                    .map_err(|e| usage(format!("--local-addr: {}", e.message())))?;
            }
            if a.rdzv_backend == "c10d" {
                if params.endpoints.len() != 1 {
                    return Err(usage(
                        "--rdzv-backend=c10d: expected one HOST:PORT, the node that serves the rendezvous",
                    ));
                }
                c10d = Some(params.endpoints[0].clone());
            }
            if static_flags {
                notes.push(
                    "--node-rank/--master-addr/--master-port apply to the static backend only: ignored"
                        .into(),
                );
            }
            Rendezvous::Etcd(Box::new(params))
        }
    };
    if let Some(name) = &a.logs_specs {
        notes.push(format!(
            "--logs-specs={name}: rdzv has no LogsSpecs plugins; using torchrun's default layout"
        ));
    }
    if a.event_log_handler != "null" {
        notes.push(format!(
            "--event-log-handler={}: rdzv has no event handlers; its events are its [rdzv] lines",
            a.event_log_handler
        ));
    }
    if let (Framework::Jax, Rendezvous::Static(s)) = (a.framework, &rendezvous) {
        if s.nnodes > 1 {
            return Err(usage(
                "--framework=jax: needs a rendezvous (--rdzv-endpoint) for more than one node",
            ));
        }
    }
    let signals = parse_signals(&a.signals_to_handle)?;
    let run_id = match &rendezvous {
        Rendezvous::Etcd(p) => p.run_id.clone(),
        // torchrun's standalone mode makes up a run id too.
        Rendezvous::Static(s) if s.standalone => {
            format!("standalone-{:016x}", crate::host::random_u64())
        }
        Rendezvous::Static(_) => a.rdzv_id.clone(),
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
        c10d,
        c10d_is_host,
        signals,
        signals_to_handle: a.signals_to_handle,
        virtual_local_rank: a.virtual_local_rank,
        numa_binding,
        // torchrun: the flag (or PET_LOG_LINE_PREFIX_TEMPLATE), else this variable.
        log_line_prefix_template: a
            .log_line_prefix_template
            .filter(|t| !t.is_empty())
            .or_else(|| std::env::var("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE").ok())
            .filter(|t| !t.is_empty()),
        duplicate_stdout_filters: comma_list(a.duplicate_stdout_filters.as_deref()),
        duplicate_stderr_filters: comma_list(a.duplicate_stderr_filters.as_deref()),
        watchdog: !a.no_watchdog,
        notes,
    })
}

impl RunConfig {
    /// The fixed layout of a job without a rendezvous (standalone when it has one).
    pub fn static_round(&self) -> StaticRound {
        match &self.rendezvous {
            Rendezvous::Static(s) => s.clone(),
            Rendezvous::Etcd(_) => StaticRound::standalone(),
        }
    }

    /// Whether worker output goes to files: a log directory was asked for, or a spec needs one.
    pub fn keeps_files(&self) -> bool {
        self.log_dir.is_some() || self.redirects.any() || self.tee.any()
    }
}

/// torchrun's static backend: a fixed --nnodes, this node's --node-rank, and rank 0's address
/// from --master-addr/--master-port (or --rdzv-endpoint, which torchrun prefers).
fn static_round(
    a: &RunArgs,
    min_nodes: u32,
    max_nodes: u32,
    endpoint: Option<&str>,
) -> Result<Rendezvous, Usage> {
    if min_nodes != max_nodes {
        return Err(usage(format!(
            "--nnodes={}: the static backend needs a fixed number of nodes",
            a.nnodes
        )));
    }
    let node_rank = a.node_rank.unwrap_or(0);
    if node_rank >= max_nodes {
        return Err(usage(format!(
            "--node-rank={node_rank}: expected 0..{} for --nnodes={max_nodes}",
            max_nodes - 1
        )));
    }
    let (master_addr, master_port) = match endpoint {
        Some(e) => {
            let (host, port) = e
                .rsplit_once(':')
                .and_then(|(h, p)| {
                    Some((
                        h.trim_matches(['[', ']']).to_string(),
                        p.parse::<u16>().ok()?,
                    ))
                })
                .ok_or_else(|| usage(format!("--rdzv-endpoint: expected HOST:PORT, got {e:?}")))?;
            (host, port)
        }
        None => (
            a.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
            a.master_port.unwrap_or(29500),
        ),
    };
    if master_addr.is_empty() {
        return Err(usage("--master-addr: expected a host name or address"));
    }
    Ok(Rendezvous::Static(StaticRound {
        node_rank,
        nnodes: max_nodes,
        master_addr,
        master_port: Some(master_port),
        standalone: false,
    }))
}

/// `--signals-to-handle`: signal names (SIGUSR1, or USR1), comma-separated.
pub fn parse_signals(s: &str) -> Result<Vec<i32>, Usage> {
    let mut signals = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let bare = name.trim_start_matches("SIG");
        let sig = match bare {
            "TERM" => libc::SIGTERM,
            "INT" => libc::SIGINT,
            "HUP" => libc::SIGHUP,
            "QUIT" => libc::SIGQUIT,
            "USR1" => libc::SIGUSR1,
            "USR2" => libc::SIGUSR2,
            "ALRM" => libc::SIGALRM,
            "XCPU" => libc::SIGXCPU,
            "PWR" => libc::SIGPWR,
            _ => {
                return Err(usage(format!(
                    "--signals-to-handle: expected signal names like SIGTERM,SIGUSR1 \
                     (TERM INT HUP QUIT USR1 USR2 ALRM XCPU PWR), got {name:?}"
                )))
            }
        };
        if !signals.contains(&sig) {
            signals.push(sig);
        }
    }
    if signals.is_empty() {
        return Err(usage("--signals-to-handle: expected at least one signal"));
    }
    Ok(signals)
}

/// torchrun's comma-separated list, where `,,` stands for a comma; empty items dropped.
pub fn comma_list(s: Option<&str>) -> Vec<String> {
    let Some(s) = s else { return Vec::new() };
    let placeholder = "\u{0}";
    s.replace(",,", placeholder)
        .split(',')
        .map(|item| item.replace(placeholder, ","))
        .filter(|item| !item.is_empty())
        .collect()
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

/// `--nproc-per-node`: a number, or `cpu`, `gpu`, `xpu`, `auto` as torchrun resolves them
/// (`auto`: torch's accelerator if there is one, GPUs before XPUs, else the CPUs).
fn local_world_size(s: &str, notes: &mut Vec<String>) -> Result<u32, Usage> {
    use crate::host::{accelerators, cpus};
    let n = match s {
        "cpu" => cpus::count(),
        "gpu" => match accelerators::gpu_count() {
            0 => return Err(usage("--nproc-per-node=gpu: no GPU found on this machine")),
            n => n,
        },
        "xpu" => match accelerators::xpu_count() {
            0 => return Err(usage("--nproc-per-node=xpu: no XPU found on this machine")),
            n => n,
        },
        "auto" => match (accelerators::gpu_count(), accelerators::xpu_count()) {
            (0, 0) => cpus::count(),
            (0, xpus) => xpus,
            (gpus, _) => gpus,
        },
        _ => match s.parse::<u32>() {
            Ok(n) if n >= 1 => return Ok(n),
            _ => {
                return Err(usage(format!(
                    "--nproc-per-node: expected a number >= 1, cpu, gpu, xpu or auto, got {s:?}"
                )))
            }
        },
    };
    notes.push(format!(
        "--nproc-per-node={s}: starting {n} workers per node"
    ));
    Ok(n)
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

/// torch's c10d `--rdzv-conf` keys, which are not rdzv options: taken by `torch_conf`.
const TORCH_CONF: [&str; 5] = [
    "is_host",
    "read_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "use_libuv",
];

/// What torch's own `--rdzv-conf` keys mean here.
#[derive(Debug, Default, PartialEq)]
struct TorchConf {
    is_host: Option<bool>,
    /// `keep_alive_interval` x `keep_alive_max_attempt`: when torch's c10d declares a silent
    /// node dead, which is what `lease_ttl` is here.
    lease_ttl: Option<f64>,
}

fn torch_conf(conf: &[(String, String)], notes: &mut Vec<String>) -> Result<TorchConf, Usage> {
    let get = |key: &str| {
        conf.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let number = |key: &str, v: &str| -> Result<f64, Usage> {
        v.parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n > 0.0)
            .ok_or_else(|| {
                usage(format!(
                    "--rdzv-conf: {key}: expected a number above 0, got {v:?}"
                ))
            })
    };
    let mut torch = TorchConf::default();
    if let Some(v) = get("is_host") {
        torch.is_host = Some(match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "y" | "on" => true,
            "0" | "false" | "no" | "n" | "off" => false,
            _ => {
                return Err(usage(format!(
                    "--rdzv-conf: is_host: expected true or false, got {v:?}"
                )))
            }
        });
    }
    let interval = get("keep_alive_interval")
        .map(|v| number("keep_alive_interval", v))
        .transpose()?;
    let attempts = get("keep_alive_max_attempt")
        .map(|v| number("keep_alive_max_attempt", v))
        .transpose()?;
    if interval.is_some() || attempts.is_some() {
        // torch's defaults: a heartbeat every 5 s, dead after 3 missed.
        let ttl = (interval.unwrap_or(5.0) * attempts.unwrap_or(3.0)).max(2.0);
        notes.push(format!(
            "--rdzv-conf: keep_alive_interval x keep_alive_max_attempt: a silent node is lost after {ttl} s (lease_ttl), unless lease_ttl is given"
        ));
        torch.lease_ttl = Some(ttl);
    }
    for key in ["read_timeout", "use_libuv"] {
        if let Some(v) = get(key) {
            if key == "read_timeout" {
                number(key, v)?;
            }
            notes.push(format!(
                "--rdzv-conf: {key}={v} is for torch's TCPStore: no effect on etcd, whose every call has a deadline of its own"
            ));
        }
    }
    Ok(torch)
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

/// What each worker executes, and the Python script it runs if any. As torchrun, PROGRAM
/// runs under `python3 -u` (a script, or with `--module` a module), unless `--no-python`.
/// Unlike torchrun, an executable file that is not Python (an ELF binary, a `#!` script)
/// or a command on PATH runs as it is, so `rdzv run ./worker` needs no `--no-python`.
fn worker_command(a: &RunArgs) -> Result<(Vec<String>, Option<PathBuf>), Usage> {
    if a.run_path && a.module {
        return Err(usage("--run-path and --module cannot be used together"));
    }
    if a.no_python && a.module {
        return Err(usage("--no-python and --module cannot be used together"));
    }
    let Some((program, args)) = a.command.split_first().filter(|(p, _)| !p.is_empty()) else {
        return Err(usage("PROGRAM: expected a program to run"));
    };
    let mut command = Vec::new();
    let mut script = None;
    if a.module {
        command.extend([python(), "-u".into(), "-m".into()]);
    } else if a.run_path || (!a.no_python && runs_under_python(program)) {
        command.extend([python(), "-u".into()]);
        script = Some(PathBuf::from(program));
    }
    command.push(program.clone());
    command.extend(args.iter().cloned());
    Ok((command, script))
}

/// Whether PROGRAM is a Python script: a `.py` name, or a file that the kernel cannot run by
/// itself (neither an executable ELF binary nor an executable `#!` script). A name that is no
/// file here is a command looked up on PATH.
fn runs_under_python(program: &str) -> bool {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    if program.ends_with(".py") {
        return true;
    }
    let path = std::path::Path::new(program);
    let Ok(meta) = path.metadata() else {
        // No such file: a command on PATH when it has no slash, else a missing script.
        return program.contains('/');
    };
    if !meta.is_file() {
        return false;
    }
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut magic));
    let native = matches!(read, Ok(n) if n >= 2 && (magic[..2] == *b"#!" || (n == 4 && magic == *b"\x7fELF")));
    !(native && meta.permissions().mode() & 0o111 != 0)
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

/// `rdzv run --print-completion SHELL`: a completion script for the whole command (torchrun
/// 2.15 prints one for itself).
pub fn print_completion(shell: &str) {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut out = std::io::stdout();
    match shell {
        "bash" => clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, "rdzv", &mut out),
        "zsh" => clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, "rdzv", &mut out),
        _ => {
            // tcsh: subcommands first, then the long flags of any of them.
            let subcommands: Vec<String> = cmd
                .get_subcommands()
                .map(|c| c.get_name().to_string())
                .collect();
            let mut flags: Vec<String> = cmd
                .get_subcommands()
                .flat_map(|c| {
                    c.get_arguments()
                        .filter_map(|a| a.get_long())
                        .map(str::to_string)
                })
                .collect();
            flags.sort();
            flags.dedup();
            println!(
                "complete rdzv 'p/1/({})/' 'c/--/({})/'",
                subcommands.join(" "),
                flags.join(" ")
            );
        }
    }
}

/// The program a worker command runs, for the failure report (`train.py`, not python3).
pub fn program_name(command: &[String]) -> &str {
    let skip = command
        .iter()
        .position(|c| c == "-m")
        .map(|i| i + 1)
        .or_else(|| (command.len() > 2 && command[1] == "-u").then_some(2))
        .unwrap_or(0);
    command.get(skip).map_or("", String::as_str)
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

    /// `rdzv run ARGS prog`, parsed by clap.
    fn parse_run(args: &[&str]) -> Result<Box<RunArgs>, clap::Error> {
        let argv = [&["rdzv", "run"], args, &["prog"]].concat();
        match Cli::try_parse_from(argv)?.command {
            Command::Run(a) => Ok(a),
            _ => unreachable!(),
        }
    }

    /// The rows of docs/LAUNCHER.md's parity table: (spellings, example value, test name).
    fn parity_table() -> Vec<(Vec<String>, String, String)> {
        let doc = include_str!("../../docs/LAUNCHER.md");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        doc.lines()
            .skip_while(|l| !l.starts_with("| torchrun flag |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                assert_eq!(cells.len(), 6, "a row of four cells: {row}");
                let example = ticked(cells[2]).concat();
                let test = ticked(cells[4]).concat();
                (ticked(cells[1]), example, test)
            })
            .collect()
    }

    #[test]
    fn every_torchrun_flag_of_the_parity_table_parses_in_both_spellings() {
        let rows = parity_table();
        // torchrun 2.15's parser, flag by flag (torch/distributed/run.py).
        let torchrun = [
            "--nnodes",
            "--nproc-per-node",
            "--rdzv-backend",
            "--rdzv-endpoint",
            "--rdzv-id",
            "--rdzv-conf",
            "--standalone",
            "--max-restarts",
            "--monitor-interval",
            "--start-method",
            "--event-log-handler",
            "--role",
            "--module",
            "--no-python",
            "--run-path",
            "--log-dir",
            "--redirects",
            "--tee",
            "--local-ranks-filter",
            "--duplicate-stdout-filters",
            "--duplicate-stderr-filters",
            "--node-rank",
            "--master-addr",
            "--master-port",
            "--local-addr",
            "--logs-specs",
            "--numa-binding",
            "--signals-to-handle",
            "--shutdown-timeout",
            "--virtual-local-rank",
            "--log-line-prefix-template",
        ];
        for flag in torchrun {
            assert!(
                rows.iter()
                    .any(|(spellings, _, _)| spellings.iter().any(|s| s == flag)),
                "{flag} has no row in the parity table"
            );
        }
        let tests = concat!(
            include_str!("../tests/launcher.rs"),
            include_str!("../tests/launcher_torch.rs"),
            include_str!("cli.rs"),
            include_str!("workers.rs")
        );
        for (spellings, example, test) in &rows {
            assert!(!spellings.is_empty() && !test.is_empty(), "{spellings:?}");
            assert!(
                tests.contains(&format!("fn {test}(")),
                "the table names a test that does not exist: {test}"
            );
            let long = spellings.iter().find(|s| s.starts_with("--")).unwrap();
            if long[2..].contains('-') {
                let underscore = format!("--{}", long[2..].replace('-', "_"));
                assert!(
                    spellings.contains(&underscore),
                    "{long}: the table lists no {underscore}"
                );
            }
            for spelling in spellings {
                let arg = match (example.is_empty(), spelling.starts_with("--")) {
                    (true, _) => spelling.clone(),
                    (false, true) => format!("{spelling}{example}"),
                    (false, false) => format!("{spelling}{}", &example[1..]),
                };
                if let Err(e) = parse_run(&[&arg]) {
                    panic!("{arg}: {e}");
                }
            }
        }
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value() {
        let a = parse_run(&[
            "--nproc-per-node=2",
            "--nproc_per_node=3",
            "--tee=1",
            "-t",
            "3",
        ])
        .unwrap();
        assert_eq!(a.nproc_per_node, "3");
        assert_eq!(a.tee, "3");
        let a = parse_run(&[
            "--no-python",
            "--no_python",
            "--max-restarts=1",
            "--max-restarts=4",
        ])
        .unwrap();
        assert!(a.no_python);
        assert_eq!(a.max_restarts, 4);
    }

    #[test]
    fn print_completion_needs_no_program_and_knows_torchruns_shells() {
        let argv = ["rdzv", "run", "--print_completion", "zsh"];
        let Command::Run(a) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        assert_eq!(a.print_completion.as_deref(), Some("zsh"));
        assert!(Cli::try_parse_from(["rdzv", "run", "--print-completion", "fish"]).is_err());
        assert!(
            Cli::try_parse_from(["rdzv", "run"]).is_err(),
            "PROGRAM stays required"
        );
    }

    #[test]
    fn static_backend_needs_a_fixed_node_count_and_a_rank_inside_it() {
        let cfg = |args: &[&str]| run_config(parse_run(args).unwrap());
        let ok = cfg(&[
            "--nnodes=2",
            "--node-rank=1",
            "--master-addr=10.0.0.1",
            "--master-port=1234",
        ])
        .unwrap();
        let s = ok.static_round();
        assert_eq!(
            (s.node_rank, s.nnodes, s.master_addr.as_str(), s.master_port),
            (1, 2, "10.0.0.1", Some(1234))
        );
        let c10d = cfg(&["--rdzv-backend=c10d", "--nnodes=2", "--rdzv-endpoint=node0"]).unwrap();
        assert_eq!(c10d.c10d.as_deref(), Some("node0:29400"));
        let by_endpoint = cfg(&[
            "--rdzv-backend=static",
            "--nnodes=2",
            "--rdzv-endpoint=h:99",
        ])
        .unwrap();
        assert_eq!(by_endpoint.static_round().master_port, Some(99));
        assert!(cfg(&["--nnodes=1:2", "--node-rank=0"]).is_err());
        assert!(cfg(&["--nnodes=2", "--node-rank=2"]).is_err());
    }

    #[test]
    fn signals_and_comma_lists() {
        assert_eq!(
            parse_signals("SIGTERM,USR1, SIGUSR2").unwrap(),
            vec![libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2]
        );
        assert!(parse_signals("SIGKILL").is_err());
        assert!(parse_signals("").is_err());
        assert_eq!(comma_list(Some("a,,b,c")), vec!["a,b", "c"]);
        assert!(comma_list(Some("")).is_empty());
    }

    /// torchrun hands everything after the script to it: flags of rdzv's own included.
    #[test]
    fn everything_from_the_program_on_is_the_programs() {
        let argv = [
            "rdzv",
            "run",
            "--standalone",
            "train.py",
            "--help",
            "--log_dir",
            "D",
            "-m",
            "--max-restarts=3",
            "--role",
            "X",
            "-t",
            "3",
            "--nnodes=5",
            "--",
            "x",
        ];
        let Command::Run(a) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        assert_eq!(a.command, &argv[3..]);
        assert!(a.log_dir.is_none() && !a.module && a.max_restarts == 0);
        assert_eq!(
            (a.role.as_str(), a.tee.as_str(), a.nnodes.as_str()),
            ("default", "0", "1:1")
        );
        // An unknown flag before the program is still a usage error, not a program.
        assert!(Cli::try_parse_from(["rdzv", "run", "--bogus", "train.py"]).is_err());
        assert!(Cli::try_parse_from(["rdzv", "run", "--standalone"]).is_err());
    }

    /// A Python script runs under python3 whatever its name; an executable ELF binary or `#!`
    /// script, or a command on PATH, runs as it is.
    #[test]
    fn which_programs_run_under_python() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdzv-cli-python-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path.display().to_string()
        };
        assert!(runs_under_python("missing.py"));
        assert!(runs_under_python(&file("train", "print(1)\n", 0o644)));
        assert!(runs_under_python(&file("train_x", "print(1)\n", 0o755)));
        assert!(!runs_under_python(&file("tool.sh", "#!/bin/sh\n", 0o755)));
        // A `#!` script that is not executable cannot run by itself: Python it is.
        assert!(runs_under_python(&file("plain.sh", "#!/bin/sh\n", 0o644)));
        let elf = file("binary", "", 0o755);
        std::fs::copy("/proc/self/exe", &elf).unwrap();
        assert!(!runs_under_python(&elf));
        assert!(!runs_under_python("sh"), "a command on PATH");
        assert!(runs_under_python(
            &dir.join("gone/train").display().to_string()
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn torchs_own_rdzv_conf_keys() {
        let conf = |s: &str| {
            let mut notes = Vec::new();
            torch_conf(&parse_conf(s).unwrap(), &mut notes).map(|t| (t, notes))
        };
        let (t, notes) = conf("is_host=true,read_timeout=60,use_libuv=1").unwrap();
        assert_eq!(
            t,
            TorchConf {
                is_host: Some(true),
                lease_ttl: None
            }
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(conf("is_host=0").unwrap().0.is_host, Some(false));
        // torch's c10d declares a node dead after keep_alive_max_attempt missed heartbeats.
        assert_eq!(
            conf("keep_alive_interval=2").unwrap().0.lease_ttl,
            Some(6.0)
        );
        assert_eq!(
            conf("keep_alive_interval=1,keep_alive_max_attempt=4")
                .unwrap()
                .0
                .lease_ttl,
            Some(4.0)
        );
        for bad in ["is_host=maybe", "read_timeout=-1", "keep_alive_interval=x"] {
            let Err(Usage(message)) = conf(bad) else {
                panic!("{bad} accepted")
            };
            assert!(
                message.contains(bad.split('=').next().unwrap()),
                "{message}"
            );
        }
        // Through run_config: the keys pass, lease_ttl follows them unless given.
        let cfg = |conf: &str| {
            let argv = [
                "rdzv",
                "run",
                "--rdzv-endpoint=127.0.0.1:2379",
                "--nnodes=2",
                conf,
                "prog",
            ];
            let Command::Run(a) = Cli::try_parse_from(argv).unwrap().command else {
                unreachable!()
            };
            run_config(a).unwrap()
        };
        let c = cfg("--rdzv-conf=is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3");
        let Rendezvous::Etcd(p) = &c.rendezvous else {
            panic!()
        };
        assert_eq!(
            (p.lease_ttl, c.c10d_is_host),
            (Duration::from_secs(3), Some(false))
        );
        let c = cfg("--rdzv-conf=keep_alive_interval=1,lease_ttl=7");
        let Rendezvous::Etcd(p) = &c.rendezvous else {
            panic!()
        };
        assert_eq!(p.lease_ttl, Duration::from_secs(7));
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
