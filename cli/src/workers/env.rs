//! The environment a worker starts with: torchrun's (ranks, world sizes, MASTER_ADDR and
//! MASTER_PORT, the restart count, the error file), what `--virtual-local-rank` and
//! `--numa-binding` add, and with `--framework=jax` what `jax.distributed.initialize()` reads.

use crate::args::values::Framework;
use crate::ranks::WorkerRanks;
use std::path::Path;

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
    /// Each worker gets a progress page (RDZV_PROGRESS_FILE) and a stacks file
    /// (RDZV_STACKS_FILE) in its directory: the hang monitor reads them.
    pub progress: bool,
    /// `--in-process-restart`: each worker gets a control file (RDZV_INPROCESS_FILE).
    pub in_process: bool,
    /// `--in-process-spare`: the group keeps a spare worker process (`super::spare`).
    pub spare: bool,
}

/// The prefix of torch's Flight Recorder pipe and dump for a worker whose directory holds
/// `error_file` (torch appends the rank: `{prefix}{rank}.pipe`, `{prefix}{rank}`).
pub fn flight_recorder_prefix(error_file: &Path) -> std::path::PathBuf {
    error_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("nccl_trace_rank_")
}

/// A worker's progress page and stacks file, in its directory beside its error file.
pub fn progress_files(error_file: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = error_file.parent().unwrap_or(Path::new("."));
    (dir.join("progress"), dir.join("stacks.txt"))
}

/// The environment torchrun's agent gives a worker (on top of the launcher's own).
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
    if spec.progress {
        let (page, stacks) = progress_files(error_file);
        env.push((
            rdzv::progress::PROGRESS_FILE_ENV.into(),
            page.display().to_string(),
        ));
        env.push((
            rdzv::progress::STACKS_FILE_ENV.into(),
            stacks.display().to_string(),
        ));
        // torch's Flight Recorder (NCCL): a pipe the hang monitor writes to for a dump, and
        // where the dump goes; unless the user chose places of their own.
        let prefix = flight_recorder_prefix(error_file).display().to_string();
        for var in [
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        ] {
            if std::env::var_os(var).is_none() {
                env.push((var.into(), prefix.clone()));
            }
        }
    }
    if spec.in_process {
        let control = super::inprocess::control_file(error_file);
        env.push((
            super::inprocess::CONTROL_FILE_ENV.into(),
            control.display().to_string(),
        ));
        // NCCL's watchdog tears the process down when a collective fails (1, torch's
        // default); 2 aborts the communicators and raises instead, which a worker that stays
        // for the next round needs.
        if std::env::var_os("TORCH_NCCL_ASYNC_ERROR_HANDLING").is_none() {
            env.retain(|(k, _)| k != "TORCH_NCCL_ASYNC_ERROR_HANDLING");
            env.push(("TORCH_NCCL_ASYNC_ERROR_HANDLING".into(), "2".into()));
        }
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
            progress: false,
            in_process: false,
            spare: false,
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
    fn a_monitored_worker_gets_its_page_stacks_and_flight_recorder_places_beside_its_error_file() {
        let plain = env(&spec(Framework::Torch, "h"), &ranks(None));
        assert!(
            plain
                .keys()
                .all(|k| !k.starts_with("RDZV_") && !k.starts_with("TORCH_NCCL_DEBUG")),
            "{plain:?}"
        );
        let mut s = spec(Framework::Torch, "h");
        s.progress = true;
        let e: std::collections::BTreeMap<String, String> =
            worker_env(&s, &ranks(None), Path::new("/logs/attempt_0/1/error.json"))
                .into_iter()
                .collect();
        assert_eq!(e["RDZV_PROGRESS_FILE"], "/logs/attempt_0/1/progress");
        assert_eq!(e["RDZV_STACKS_FILE"], "/logs/attempt_0/1/stacks.txt");
        if std::env::var_os("TORCH_NCCL_DEBUG_INFO_PIPE_FILE").is_none() {
            assert_eq!(
                e["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"],
                "/logs/attempt_0/1/nccl_trace_rank_"
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
