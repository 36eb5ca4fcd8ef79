//! `rdzv run`'s settings: the typed flags (`args`) combined and checked into one `RunConfig`,
//! with what the machine contributes (how many workers `gpu` means) and the variables torchrun
//! reads beside its flags (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`,
//! `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`). Nothing here starts a process or talks to etcd;
//! every problem found here is a usage error (exit 2), found before the node joins anything.
//!
//! Submodules, each using only those listed before it: `rendezvous` (where the rendezvous
//! happens, torch's `--rdzv-conf` keys), `program` (what each worker runs, which programs run
//! under Python), `monitor` (hangs, progress and health), `shown` (the settings as the launcher
//! tells them at info).

pub mod rendezvous;

pub mod program;

pub mod monitor;

mod shown;

use crate::args::run::RunArgs;
use crate::args::values::{self, Framework, NprocPerNode, StreamSpec};
use crate::exit::{usage, Usage};
use crate::host::numa::Policy;
use crate::host::{accelerators, cpus};
use monitor::MonitorConfig;
use program::Program;
use rendezvous::{C10d, Venue};
use std::path::PathBuf;
use std::time::Duration;

/// A checked `rdzv run` invocation.
#[derive(Debug)]
pub struct RunConfig {
    pub rendezvous: Venue,
    /// The run id workers see (TORCHELASTIC_RUN_ID).
    pub run_id: String,
    pub nproc_per_node: u32,
    pub max_restarts: u32,
    pub monitor_interval: Duration,
    pub role: String,
    pub framework: Framework,
    /// What each worker runs.
    pub program: Program,
    pub log_dir: Option<PathBuf>,
    pub redirects: StreamSpec,
    pub tee: StreamSpec,
    pub local_ranks_filter: Option<Vec<u32>>,
    pub shutdown_timeout: Duration,
    pub exit_barrier_timeout: Duration,
    /// `--rdzv-backend=c10d`: the endpoint an embedded etcd serves, when this node is the one
    /// it names.
    pub c10d: Option<C10d>,
    /// The signals forwarded to the workers, and the flag's text (the workers see it).
    pub signals: Vec<i32>,
    pub signals_to_handle: String,
    pub virtual_local_rank: bool,
    pub numa_binding: Option<Policy>,
    pub log_line_prefix_template: Option<String>,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
    /// Start the watchdog that releases this node if the launcher is killed (`watchdog.rs`).
    pub watchdog: bool,
    /// `--in-process-restart`: how long a worker gets to leave its function, when set.
    pub in_process: Option<Duration>,
    /// `--in-process-spare`: a spare worker process per node (`workers::spare`).
    pub in_process_spare: bool,
    /// Hangs, progress and health (`--hang-timeout`, `--health-check`, ...).
    pub monitor: MonitorConfig,
    /// `--outcome-file`: where the agent writes how the command ended.
    pub outcome_file: Option<PathBuf>,
    /// `--events-file`, `--metrics-file`: where the job's events and metrics go.
    pub events_file: Option<PathBuf>,
    pub metrics_file: Option<PathBuf>,
    /// `--metrics-port`: where this node serves its metrics for Prometheus.
    pub metrics_port: Option<u16>,
    /// Lines to tell the user before starting (notes on accepted aliases, defaults taken).
    pub notes: Vec<String>,
}

impl RunConfig {
    /// Combines the parsed flags into a `RunConfig`, checking what no single flag's parser
    /// can: flags that go together or exclude each other, and what the machine has.
    pub fn from_args(a: RunArgs) -> Result<RunConfig, Usage> {
        let mut notes = Vec::new();
        let nproc_per_node = local_world_size(a.nproc_per_node, DeviceCounts::probe, &mut notes)?;
        let shutdown_timeout = match a.shutdown_timeout {
            Some(given) => given,
            None => match std::env::var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
                Ok(v) if !v.is_empty() => {
                    values::seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &v, true)?
                }
                _ => Duration::from_secs(30),
            },
        };
        let program = Program::from_args(&a)?;
        let (rendezvous, c10d) = rendezvous::from_args(&a, &mut notes)?;
        // torchrun looks the name up among its `torchrun.logs_specs` entry points and fails on
        // one it does not find; rdzv has the default layout alone, so only its name starts.
        match a.logs_specs.as_deref() {
            None | Some("default") => {}
            Some(name) => {
                return Err(usage(format!(
                    "--logs-specs: no LogsSpecs plugin {name:?}: rdzv has torchrun's default layout alone (--logs-specs=default)"
                )))
            }
        }
        if a.event_log_handler != "null" {
            notes.push(format!(
                "--event-log-handler={}: rdzv has no event handlers; its events are its [rdzv] lines",
                a.event_log_handler
            ));
        }
        if a.in_process_spare && !a.in_process_restart {
            return Err(usage(
                "--in-process-spare: a spare takes a failed worker's place in process; it needs --in-process-restart",
            ));
        }
        if a.in_process_spare && a.numa_binding.is_some() {
            return Err(usage(
                "--in-process-spare: a spare is started before its local rank is known, so it cannot be bound to that rank's CPUs (--numa-binding)",
            ));
        }
        if let (Framework::Jax, Venue::Static(s)) = (a.framework, &rendezvous) {
            if s.nnodes > 1 {
                return Err(usage(
                    "--framework=jax: needs a rendezvous (--rdzv-endpoint) for more than one node",
                ));
            }
        }
        let run_id = match &rendezvous {
            Venue::Etcd(p) => p.run_id().to_string(),
            // torchrun's standalone mode makes up a run id too (unless one is given).
            Venue::Static(s)
                if s.standalone && (a.standalone || a.rdzv_flags.rdzv_id == "none") =>
            {
                format!("standalone-{:016x}", crate::host::random_u64())
            }
            Venue::Static(_) => a.rdzv_flags.rdzv_id.clone(),
        };
        Ok(RunConfig {
            rendezvous,
            run_id,
            nproc_per_node,
            max_restarts: a.max_restarts,
            monitor_interval: a.monitor_interval,
            role: a.role,
            framework: a.framework,
            program,
            log_dir: a.log_dir,
            outcome_file: a.outcome_file,
            events_file: a.events_file,
            metrics_file: a.metrics_file,
            metrics_port: a.metrics_port,
            redirects: a.redirects,
            tee: a.tee,
            local_ranks_filter: a.local_ranks_filter.map(|f| f.0).filter(|f| !f.is_empty()),
            shutdown_timeout,
            exit_barrier_timeout: a.exit_barrier_timeout,
            c10d,
            signals: a.signals_to_handle.numbers,
            signals_to_handle: a.signals_to_handle.text,
            virtual_local_rank: a.virtual_local_rank,
            numa_binding: a.numa_binding,
            // torchrun: the flag (or PET_LOG_LINE_PREFIX_TEMPLATE), else this variable.
            log_line_prefix_template: a
                .log_line_prefix_template
                .filter(|t| !t.is_empty())
                .or_else(|| std::env::var("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE").ok())
                .filter(|t| !t.is_empty()),
            duplicate_stdout_filters: a.duplicate_stdout_filters.unwrap_or_default().0,
            duplicate_stderr_filters: a.duplicate_stderr_filters.unwrap_or_default().0,
            watchdog: !a.no_watchdog,
            in_process: a.in_process_restart.then_some(a.in_process_timeout),
            in_process_spare: a.in_process_spare,
            monitor: MonitorConfig::from_flags(a.monitor)?,
            notes,
        })
    }

    /// Whether the job's events or metrics are recorded (`--events-file`, `--metrics-file`,
    /// `--metrics-port`).
    pub fn records(&self) -> bool {
        self.events_file.is_some() || self.metrics_file.is_some() || self.metrics_port.is_some()
    }

    /// Whether worker output goes to files: a log directory was asked for, or a spec needs one.
    pub fn keeps_files(&self) -> bool {
        self.log_dir.is_some() || self.redirects.any() || self.tee.any()
    }
}

/// What the machine has, counted only when `--nproc-per-node` names a kind of device.
struct DeviceCounts {
    cpus: u32,
    gpus: u32,
    xpus: u32,
}

impl DeviceCounts {
    fn probe() -> DeviceCounts {
        DeviceCounts {
            cpus: cpus::count(),
            gpus: accelerators::gpu_count(),
            xpus: accelerators::xpu_count(),
        }
    }
}

/// `--nproc-per-node` as torchrun resolves it: `gpu` and `xpu` fail without one (torch's
/// "Cuda is not available", "Xpu is not available"), `auto` is torch's accelerator if there is
/// one (GPUs before XPUs), else the CPUs.
fn local_world_size(
    n: NprocPerNode,
    counts: impl FnOnce() -> DeviceCounts,
    notes: &mut Vec<String>,
) -> Result<u32, Usage> {
    let c = match n {
        NprocPerNode::Count(n) => return Ok(n),
        _ => counts(),
    };
    let workers = match n {
        NprocPerNode::Count(n) => n,
        NprocPerNode::Cpu => c.cpus,
        NprocPerNode::Gpu if c.gpus == 0 => {
            return Err(usage("--nproc-per-node=gpu: no GPU found on this machine"))
        }
        NprocPerNode::Gpu => c.gpus,
        NprocPerNode::Xpu if c.xpus == 0 => {
            return Err(usage("--nproc-per-node=xpu: no XPU found on this machine"))
        }
        NprocPerNode::Xpu => c.xpus,
        NprocPerNode::Auto if c.gpus > 0 => c.gpus,
        NprocPerNode::Auto if c.xpus > 0 => c.xpus,
        NprocPerNode::Auto => c.cpus,
    };
    notes.push(format!(
        "--nproc-per-node={n}: starting {workers} workers per node"
    ));
    Ok(workers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Command;

    /// `rdzv run ARGS prog`, parsed and checked.
    fn cfg(args: &[&str]) -> Result<RunConfig, Usage> {
        let argv = [&["rdzv", "run"], args, &["prog"]].concat();
        match crate::args::try_parse_from(argv).unwrap().command {
            Command::Run(a) => RunConfig::from_args(*a),
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_spare_needs_in_process_restart_and_no_numa_binding() {
        let refused = |args: &[&str]| match cfg(args) {
            Err(e) => e.0,
            Ok(_) => panic!("{args:?} was taken"),
        };
        let alone = refused(&["--in-process-spare"]);
        assert!(
            alone.contains("--in-process-spare: ") && alone.contains("needs --in-process-restart"),
            "{alone}"
        );
        let bound = refused(&[
            "--in-process-restart",
            "--in-process-spare",
            "--numa-binding=node",
        ]);
        assert!(bound.contains("(--numa-binding)"), "{bound}");
        assert!(
            cfg(&["--in-process-restart", "--in-process-spare"]).is_ok_and(|c| c.in_process_spare)
        );
    }

    #[test]
    fn gpu_xpu_and_auto_count_what_the_machine_has() {
        let workers = |n: &str, cpus, gpus, xpus| {
            let n = values::nproc_per_node(n).unwrap();
            let counts = || DeviceCounts { cpus, gpus, xpus };
            local_world_size(n, counts, &mut Vec::new()).map_err(|e| e.0)
        };
        assert_eq!(workers("3", 8, 2, 1), Ok(3));
        assert_eq!(workers("cpu", 8, 2, 1), Ok(8));
        assert_eq!(workers("gpu", 8, 2, 1), Ok(2));
        assert_eq!(workers("xpu", 8, 2, 4), Ok(4));
        assert_eq!(workers("auto", 8, 2, 4), Ok(2), "GPUs first");
        assert_eq!(workers("auto", 8, 0, 4), Ok(4), "then XPUs");
        assert_eq!(workers("auto", 8, 0, 0), Ok(8), "then CPUs");
        let gpu = workers("gpu", 8, 0, 4).unwrap_err();
        assert!(gpu.contains("--nproc-per-node=gpu: no GPU"), "{gpu}");
        let xpu = workers("xpu", 8, 2, 0).unwrap_err();
        assert!(xpu.contains("--nproc-per-node=xpu: no XPU"), "{xpu}");
        // A number never looks at the machine.
        let n = values::nproc_per_node("2").unwrap();
        let untouched = || -> DeviceCounts { panic!("probed") };
        assert_eq!(local_world_size(n, untouched, &mut Vec::new()), Ok(2));
    }

    #[test]
    fn static_backend_needs_a_fixed_node_count_and_a_rank_inside_it() {
        let fixed = |args: &[&str]| match cfg(args).unwrap().rendezvous {
            Venue::Static(s) => s,
            Venue::Etcd(_) => panic!("{args:?}: not static"),
        };
        let s = fixed(&[
            "--nnodes=2",
            "--node-rank=1",
            "--master-addr=10.0.0.1",
            "--master-port=1234",
        ]);
        assert_eq!(
            (s.node_rank, s.nnodes, s.master_addr.as_str(), s.master_port),
            (1, 2, "10.0.0.1", Some(1234))
        );
        let c10d = cfg(&["--rdzv-backend=c10d", "--nnodes=2", "--rdzv-endpoint=node0"]).unwrap();
        assert_eq!(c10d.c10d.unwrap().endpoint, "node0:29400");
        let by_endpoint = fixed(&[
            "--rdzv-backend=static",
            "--nnodes=2",
            "--rdzv-endpoint=h:99",
        ]);
        assert_eq!(by_endpoint.master_port, Some(99));
        assert!(cfg(&["--nnodes=1:2", "--node-rank=0"]).is_err());
        assert!(cfg(&["--nnodes=2", "--node-rank=2"]).is_err());
    }

    /// torch's c10d on port 0 is one node here (its --standalone); never for more nodes.
    #[test]
    fn c10d_on_port_0_is_one_node_on_this_machine() {
        let one = cfg(&[
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0",
            "--rdzv-id=j",
        ]);
        let one = one.unwrap();
        assert!(matches!(&one.rendezvous, Venue::Static(s) if s.standalone));
        assert_eq!(one.run_id, "j", "a given run id is kept");
        assert!(one.c10d.is_none(), "no etcd is served");
        let two = cfg(&[
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0",
            "--nnodes=1:2",
        ]);
        let e = two.err().unwrap().0;
        assert!(e.contains("--rdzv-endpoint=localhost:0: port 0"), "{e}");
        let alone = cfg(&["--standalone", "--rdzv-id=j"]).unwrap();
        assert!(
            alone.run_id.starts_with("standalone-"),
            "as torchrun: {}",
            alone.run_id
        );
    }

    /// torch's c10d keys pass, and lease_ttl follows them unless given.
    #[test]
    fn torchs_rdzv_conf_keys_reach_the_rendezvous() {
        let etcd = |conf: &str| {
            let c = cfg(&[
                "--rdzv-backend=c10d",
                "--rdzv-endpoint=127.0.0.1:2379",
                "--nnodes=2",
                conf,
            ])
            .unwrap();
            let Venue::Etcd(p) = c.rendezvous else {
                panic!("{conf}: not on etcd")
            };
            (p.lease_ttl(), c.c10d.and_then(|c| c.is_host))
        };
        assert_eq!(
            etcd("--rdzv-conf=is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3"),
            (Duration::from_secs(3), Some(false))
        );
        assert_eq!(
            etcd("--rdzv-conf=keep_alive_interval=1,lease_ttl=7").0,
            Duration::from_secs(7)
        );
    }
}
