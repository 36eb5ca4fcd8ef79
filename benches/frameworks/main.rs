//! Framework benchmark: real JAX, Lightning and DeepSpeed programs (tests/frameworks/, BENCH=1)
//! on 2 nodes x 2 processes, each node a launcher process of its own, under `rdzv run` and
//! under torchrun (its c10d rendezvous) in the same run. Prints, for each framework and
//! launcher (median of a few runs):
//!
//! - first collective: from starting the launchers to every process reporting its first
//!   collective done (JAX: process_allgather and a jitted sum over all devices; Lightning and
//!   DeepSpeed: the first training step, whose gradients are all-reduced);
//! - recovery: from SIGKILL of everything the second node runs (torchrun's c10d store lives on
//!   the first) to both survivors reporting their first collective in the world of two.
//!
//! The workers go on with collectives (a step every 0.1 s) after the first, as in training, so
//! a lost node shows as it would in a job: the survivors' collectives fail, their workers exit
//! with an error, and each launcher restarts its group (a restart of `--max-restarts=3`), or
//! re-forms first if it saw the lost member (`rdzv run`, through the lease).
//!
//! Under torchrun, JAX gets by hand what `rdzv run --framework=jax` gives it: a wrapper sets
//! JAX_COORDINATOR_ADDRESS to MASTER_ADDR:MASTER_PORT+1 (a port nobody checked is free) and
//! Open MPI's process variables from RANK and WORLD_SIZE. Both launchers get
//! `--shutdown-timeout=2`, but torchrun applies it only to signals: replacing a group, it waits
//! 30 s for workers that outlive SIGTERM, as JAX's do (it takes SIGTERM as a preemption notice).
//!
//! Run with `scripts/bench.sh --frameworks [RUNS]`; the environments come from
//! scripts/jax-env.sh and scripts/torch-frameworks-env.sh, named by RDZV_JAX_PYTHON and
//! RDZV_TORCH_FRAMEWORKS_PYTHON.

use rdzv_bench::stats::median;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NODES: usize = 2;
const PER_NODE: usize = 2;
const LEASE_TTL: u64 = 2;
const LAST_CALL: u64 = 1;

struct Node {
    child: Child,
}

impl Node {
    /// SIGKILL to everything the node runs, as a lost machine: its launcher's process group and
    /// every process descended from the launcher. torchrun starts each worker in a session of
    /// its own (start_new_session), so killing its group alone would leave its workers running
    /// (rdzv run's would die with their launcher anyway, through PR_SET_PDEATHSIG).
    fn kill(&mut self) {
        let launcher = self.child.id() as i32;
        let mut doomed = descendants(launcher);
        doomed.push(launcher);
        unsafe { libc::kill(-launcher, libc::SIGKILL) };
        for pid in doomed {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

/// Every live process descended from `root`, from /proc (the parent is field 4 of
/// /proc/PID/stat, after the command name in parentheses).
fn descendants(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| {
                let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let ppid = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                Some((pid, ppid))
            })
            .collect()
        })
        .unwrap_or_default();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Framework {
    Jax,
    Lightning,
    DeepSpeed,
}

impl Framework {
    fn name(self) -> &'static str {
        match self {
            Framework::Jax => "JAX",
            Framework::Lightning => "Lightning",
            Framework::DeepSpeed => "DeepSpeed ZeRO-1",
        }
    }
    fn program(self) -> PathBuf {
        let name = match self {
            Framework::Jax => "jax_collective.py",
            Framework::Lightning => "lightning_ddp.py",
            Framework::DeepSpeed => "deepspeed_zero1.py",
        };
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/frameworks")).join(name)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Launcher {
    Rdzv,
    TorchrunC10d,
}

/// What a torchrun worker runs to be a JAX process: the unmodified program, with the
/// variables a user must set by hand under torchrun.
const JAX_UNDER_TORCHRUN: &str =
    "export JAX_COORDINATOR_ADDRESS=$MASTER_ADDR:$((MASTER_PORT + 1)) \
    OMPI_MCA_orte_hnp_uri=\"0.0;tcp://$MASTER_ADDR:0\" OMPI_COMM_WORLD_SIZE=$WORLD_SIZE \
    OMPI_COMM_WORLD_RANK=$RANK OMPI_COMM_WORLD_LOCAL_RANK=$LOCAL_RANK; exec \"$0\" -u \"$1\"";

/// `python` runs the workers; torchrun comes from `torchrun_python` (the JAX environment has
/// no torch).
fn node_command(
    launcher: Launcher,
    framework: Framework,
    python: &PathBuf,
    torchrun_python: &PathBuf,
    endpoint: &str,
    run: &str,
    c10d_port: u16,
) -> Command {
    let common = [
        format!("--nnodes=1:{NODES}"),
        format!("--nproc-per-node={PER_NODE}"),
        "--max-restarts=3".to_string(),
        "--monitor-interval=0.1".to_string(),
        "--shutdown-timeout=2".to_string(),
        "--local-addr=127.0.0.1".to_string(),
    ];
    let mut c = match launcher {
        Launcher::Rdzv => {
            let mut c = Command::new(rdzv_binary());
            c.arg("run")
                .arg(format!(
                    "--rdzv=etcd://{endpoint}/{run}?last_call_timeout={LAST_CALL}&lease_ttl={LEASE_TTL}"
                ))
                .args(&common)
                .env("PYTHON_EXEC", python);
            if framework == Framework::Jax {
                c.arg("--framework=jax");
            }
            c.arg(framework.program());
            c
        }
        Launcher::TorchrunC10d => {
            let mut c = Command::new(torchrun_python);
            c.args(["-m", "torch.distributed.run"])
                .args(&common)
                .arg("--rdzv-backend=c10d")
                .arg(format!("--rdzv-endpoint=127.0.0.1:{c10d_port}"))
                .arg(format!("--rdzv-id={run}"))
                .arg(format!("--rdzv-conf=last_call_timeout={LAST_CALL}"));
            match framework {
                Framework::Jax => {
                    c.args(["--no-python", "sh", "-c", JAX_UNDER_TORCHRUN])
                        .arg(python)
                        .arg(framework.program());
                }
                _ => {
                    c.arg(framework.program());
                }
            }
            c
        }
    };
    c.env("BENCH", "1").env("RESULT_DIR", std::env::temp_dir());
    // DeepSpeed's C++ op, built once into its environment (scripts/torch-frameworks-env.sh).
    if let Some(env) = python.parent().and_then(|bin| bin.parent()) {
        c.env("TORCH_EXTENSIONS_DIR", env.join("torch_extensions"));
    }
    c
}

fn rdzv_binary() -> PathBuf {
    std::env::current_exe().unwrap().with_file_name("rdzv")
}

/// Starts the nodes; each "FIRST_COLLECTIVE <world>" line arrives on `tx` with its node.
/// Each launcher's stderr goes to `{stderr}.{node}`, to see why a run did not report.
fn launch(commands: Vec<Command>, tx: &mpsc::Sender<(usize, u32)>, stderr: &str) -> Vec<Node> {
    commands
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let log = std::fs::File::create(format!("{stderr}.{i}")).expect("a writable temp dir");
            let mut child = c
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .expect("cannot start the launcher (scripts/bench.sh --frameworks builds it)");
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    // A teed line would carry a "[default0]:" prefix: match anywhere in it.
                    if let Some(world) = line.split("FIRST_COLLECTIVE ").nth(1) {
                        let _ = tx.send((i, world.trim().parse().unwrap_or(0)));
                    }
                }
            });
            Node { child }
        })
        .collect()
}

/// Waits (at most `limit`) for `count` reports of a world of `world` from `nodes`.
fn reports(
    rx: &mpsc::Receiver<(usize, u32)>,
    nodes: &[usize],
    world: u32,
    count: usize,
    limit: Duration,
) -> bool {
    let deadline = Instant::now() + limit;
    let mut seen = 0;
    while seen < count {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((node, w)) if w == world && nodes.contains(&node) => seen += 1,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    true
}

/// One run: time to the first collective, and recovery if it came within the limit.
fn one_run(
    launcher: Launcher,
    framework: Framework,
    python: &PathBuf,
    torchrun_python: &PathBuf,
    endpoint: &str,
    r: usize,
) -> (Option<Duration>, Option<Duration>) {
    // One run id per framework and run: each rdzv run is closed when it ends, and a closed id
    // stays closed (a shared id made every framework after the first fail to join).
    let run = format!("bench-frameworks-{}-{framework:?}-{r}", std::process::id()).to_lowercase();
    let c10d_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let commands = (0..NODES)
        .map(|_| {
            node_command(
                launcher,
                framework,
                python,
                torchrun_python,
                endpoint,
                &run,
                c10d_port,
            )
        })
        .collect();
    let stderr = std::env::temp_dir().join(&run).display().to_string();
    let mut nodes = launch(commands, &tx, &stderr);
    let everyone: Vec<usize> = (0..NODES).collect();
    let world = (NODES * PER_NODE) as u32;
    if !reports(
        &rx,
        &everyone,
        world,
        world as usize,
        Duration::from_secs(240),
    ) {
        eprintln!("{run}: no first collective in 240 s; the launchers' stderr: {stderr}.*");
        return (None, None);
    }
    let first = started.elapsed();
    let killed = Instant::now();
    nodes[NODES - 1].kill();
    let smaller = ((NODES - 1) * PER_NODE) as u32;
    let recovered = reports(
        &rx,
        &everyone[..NODES - 1],
        smaller,
        smaller as usize,
        Duration::from_secs(120),
    )
    .then(|| killed.elapsed());
    if launcher == Launcher::Rdzv {
        let _ = Command::new(rdzv_binary())
            .args(["close", &format!("etcd://{endpoint}/{run}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    drop(nodes);
    (Some(first), recovered)
}

fn show(v: &[Option<Duration>]) -> String {
    let got: Vec<Duration> = v.iter().flatten().copied().collect();
    let (n, m) = (got.len(), median(got).as_secs_f64());
    match n {
        0 => "none".to_string(),
        _ if n == v.len() => format!("{m:.1}"),
        _ => format!("{m:.1} ({n} of {})", v.len()),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .expect("usage: bench_frameworks HOST:PORT [RUNS]");
    let runs: usize = args
        .next()
        .map_or(3, |a| a.parse().expect("RUNS is a number"));
    let jax = std::env::var_os("RDZV_JAX_PYTHON").map(PathBuf::from);
    let torch = std::env::var_os("RDZV_TORCH_FRAMEWORKS_PYTHON").map(PathBuf::from);
    println!(
        "{NODES} nodes x {PER_NODE} processes on CPU, median of {runs}; second node SIGKILLed; \
         lease_ttl {LEASE_TTL} s, last call {LAST_CALL} s"
    );
    println!(
        "{:<17} {:<14} {:>22} {:>14}",
        "framework", "launcher", "first collective (s)", "recovery (s)"
    );
    for framework in [Framework::Jax, Framework::Lightning, Framework::DeepSpeed] {
        let python = match (framework, &jax, &torch) {
            (Framework::Jax, Some(p), _) => p,
            (Framework::Lightning | Framework::DeepSpeed, _, Some(p)) => p,
            _ => {
                println!("{:<17} (no environment: skipped)", framework.name());
                continue;
            }
        };
        let mut launchers = vec![Launcher::Rdzv];
        match &torch {
            Some(_) => launchers.push(Launcher::TorchrunC10d),
            None => println!("no PyTorch environment: torchrun is not measured"),
        }
        let torchrun_python = torch.as_ref().unwrap_or(python);
        for launcher in launchers {
            let (mut first, mut recovery) = (Vec::new(), Vec::new());
            for r in 0..runs {
                let (f, rec) = one_run(launcher, framework, python, torchrun_python, &endpoint, r);
                first.push(f);
                recovery.push(rec);
            }
            println!(
                "{:<17} {:<14} {:>22} {:>14}",
                framework.name(),
                match launcher {
                    Launcher::Rdzv => "rdzv run",
                    Launcher::TorchrunC10d => "torchrun c10d",
                },
                show(&first),
                show(&recovery)
            );
        }
    }
}
