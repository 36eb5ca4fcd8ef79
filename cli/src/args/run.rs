//! `rdzv run`'s flags: torchrun's, in both spellings (`--nproc-per-node`, `--nproc_per_node`),
//! each read from its `PET_*` variable when not given (a flag wins), each parsed into its type
//! by `values`; and everything from PROGRAM on, which is the program's.

use super::monitor::MonitorFlags;
use super::rendezvous::RdzvFlags;
use super::values::{
    self, Backend, CommaList, Framework, HandledSignals, Nnodes, NprocPerNode, RankFilter, Shell,
    StreamSpec,
};
use crate::host::numa::Policy;
use clap::builder::FalseyValueParser;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Number of nodes, or the range MIN:MAX for an elastic job.
    #[arg(
        long,
        alias = "nnodes",
        env = "PET_NNODES",
        default_value = "1:1",
        value_name = "N|MIN:MAX",
        value_parser = values::nnodes
    )]
    pub nnodes: Nnodes,
    /// Workers on this node: a number, `cpu` (one per CPU), `gpu` (one per NVIDIA or AMD GPU),
    /// `xpu` (one per Intel data-center or discrete GPU) or `auto` (one per GPU, else per XPU,
    /// else per CPU).
    #[arg(
        long,
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        default_value = "1",
        value_name = "N|cpu|gpu|xpu|auto",
        value_parser = values::nproc_per_node
    )]
    pub nproc_per_node: NprocPerNode,
    /// Rendezvous backend: etcd-v3 (etcd and etcd-v2 are accepted: rdzv speaks etcd's v3 API);
    /// c10d (the endpoint's node serves an embedded etcd); static (fixed --nnodes, --node-rank,
    /// --master-addr, --master-port, no rendezvous).
    #[arg(
        long,
        alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        default_value = "etcd-v3",
        value_parser = values::backend
    )]
    pub rdzv_backend: Backend,
    #[command(flatten)]
    pub rdzv_flags: RdzvFlags,
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
        value_name = "SECONDS",
        value_parser = values::monitor_interval
    )]
    pub monitor_interval: Duration,
    /// The workers' role (ROLE_NAME); roles get role ranks across nodes.
    #[arg(long, env = "PET_ROLE", default_value = "default", value_parser = values::role)]
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
        value_name = "SPEC",
        value_parser = values::redirects
    )]
    pub redirects: StreamSpec,
    /// Send worker streams to log files and to the console (same SPEC as --redirects).
    #[arg(
        short = 't',
        long,
        env = "PET_TEE",
        default_value = "0",
        value_name = "SPEC",
        value_parser = values::tee
    )]
    pub tee: StreamSpec,
    /// Show only these local ranks' output on the console (files keep everything): 0,1,2.
    #[arg(
        long,
        alias = "local_ranks_filter",
        env = "PET_LOCAL_RANKS_FILTER",
        value_name = "RANKS",
        value_parser = values::local_ranks_filter
    )]
    pub local_ranks_filter: Option<RankFilter>,
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
        value_name = "SIG,...",
        value_parser = values::signals_to_handle
    )]
    pub signals_to_handle: HandledSignals,
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
        value_name = "TEXT,...",
        value_parser = values::comma_list
    )]
    pub duplicate_stdout_filters: Option<CommaList>,
    /// The same for stderr, to attempt_N/filtered_stderr.log.
    #[arg(
        long,
        alias = "duplicate_stderr_filters",
        env = "PET_DUPLICATE_STDERR_FILTERS",
        value_name = "TEXT,...",
        value_parser = values::comma_list
    )]
    pub duplicate_stderr_filters: Option<CommaList>,
    /// Binds each worker to the CPUs near its GPU (local rank i uses device i), with torchrun's
    /// policies: node (the GPU's NUMA node), socket (its socket), exclusive (its share of the
    /// node's physical cores), core-complex (one group of cores sharing a last-level cache).
    #[arg(
        long,
        alias = "numa_binding",
        value_parser = values::numa_binding()
    )]
    pub numa_binding: Option<Policy>,
    /// torchrun's LogsSpecs plugin name: `default` (torchrun's default layout, which rdzv
    /// keeps); any other name fails, as torchrun fails on an entry point it cannot find.
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
        value_name = "SECONDS",
        value_parser = values::shutdown_timeout
    )]
    pub shutdown_timeout: Option<Duration>,
    /// Seconds a node whose workers all succeeded waits for the other nodes' workers.
    #[arg(
        long,
        alias = "exit_barrier_timeout",
        env = "PET_EXIT_BARRIER_TIMEOUT",
        default_value = "300",
        value_name = "SECONDS",
        value_parser = values::exit_barrier_timeout
    )]
    pub exit_barrier_timeout: Duration,
    /// Print a shell completion script for the rdzv command and exit (bash, zsh, tcsh).
    #[arg(long, alias = "print_completion", value_enum, value_name = "SHELL")]
    pub print_completion: Option<Shell>,
    /// Start no watchdog. By default a small helper process releases this node the moment
    /// the launcher dies without leaving (SIGKILL, the OOM killer), so the other nodes re-form
    /// at once; without it they notice when this node's lease expires (lease_ttl).
    #[arg(long, env = "RDZV_NO_WATCHDOG", value_parser = FalseyValueParser::new())]
    pub no_watchdog: bool,
    /// When the command ends, write how it ended to FILE as one JSON object: its exit status,
    /// the restarts spent, this node's last ranks, and each failure the report names (rank,
    /// pid, exit code or signal, error file). For a program that launches rdzv (`rdzv.launch`
    /// in Python) or a scheduler; written whole (renamed into place).
    #[arg(long, value_name = "FILE")]
    pub outcome_file: Option<PathBuf>,
    /// Append the job's events to FILE (`-`: stderr), one JSON object a line, as torchelastic's
    /// agent records them (`torchelastic.worker.status.*` for each worker and for the agent)
    /// and rdzv's own (rounds formed, membership changes): docs/EVENTS.md.
    #[arg(long, value_name = "FILE")]
    pub events_file: Option<PathBuf>,
    /// Append the job's metrics to FILE (`-`: stderr), one JSON object a line, under
    /// torchelastic's names (`workers.ROLE.run_total`, `flakiness`, `remaining_restarts`, ...):
    /// docs/EVENTS.md.
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
    /// Serve this node's metrics for Prometheus on PORT (GET /metrics, OpenMetrics text, every
    /// address): rounds, membership changes, failures, restarts, world size, round formation
    /// and recovery times, labelled run_id, role and node (docs/EVENTS.md). Off by default.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub metrics_port: Option<u16>,
    /// Keep healthy workers' processes across rounds: when a round ends (a node lost or
    /// admitted, another node's failure), each worker is asked to leave its training function
    /// (`rdzv.inprocess.run` in Python), and runs it again with the new round's environment,
    /// instead of being stopped and started again. A worker that does not leave within
    /// --in-process-timeout (0.5 s after a hang) is stopped alone and started again next round.
    #[arg(long, env = "RDZV_IN_PROCESS_RESTART", value_parser = FalseyValueParser::new())]
    pub in_process_restart: bool,
    /// With --in-process-restart: keep one spare worker process per node, started ahead and
    /// waiting in `rdzv.inprocess.run` with no place yet, so that a failed or hung worker's
    /// place goes to a process that has already imported its libraries; a new spare is
    /// started once it is taken. The program's top level must not read the rank variables.
    #[arg(long, env = "RDZV_IN_PROCESS_SPARE", value_parser = FalseyValueParser::new())]
    pub in_process_spare: bool,
    /// Seconds a worker gets to leave its training function (--in-process-restart) before
    /// it is stopped and started again.
    #[arg(
        long,
        default_value = "3",
        value_name = "SECONDS",
        value_parser = values::in_process_timeout
    )]
    pub in_process_timeout: Duration,
    #[command(flatten)]
    pub monitor: MonitorFlags,
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
