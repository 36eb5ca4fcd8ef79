//! Frameworks built on PyTorch that read torchrun's environment, unmodified under `rdzv run`:
//! a Lightning training script (DDP on CPU over gloo, a tiny model, a few steps) trains as under
//! torchrun: two launchers of two processes each, and every rank reports the same world,
//! ranks, detected environment (Lightning's TorchElasticEnvironment) and steps under both,
//! with equal weights across ranks; and a DeepSpeed ZeRO-1 job (CPU, gloo) trains on two
//! launchers of two processes. Needs the environment made by `scripts/torch-frameworks-env.sh`
//! (`RDZV_TORCH_FRAMEWORKS_PYTHON` names its python, else it is looked up in the cache);
//! skipped, saying so, where there is none.

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{cached_python, fresh_dir, records, Launcher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn program(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/frameworks")
        .join(name)
}

fn python() -> Option<PathBuf> {
    cached_python("RDZV_TORCH_FRAMEWORKS_PYTHON", "torch-frameworks")
}

/// Where DeepSpeed finds its C++ op, built once by `scripts/torch-frameworks-env.sh`: the
/// environment's own directory, never the user-wide default that another run with another
/// environment rebuilds under this one.
fn torch_extensions(python: &Path) -> String {
    let env = python
        .parent()
        .and_then(Path::parent)
        .expect("ENV/bin/python");
    env.join("torch_extensions").display().to_string()
}

/// The build steps ninja has recorded for DeepSpeed's op in `extensions`, one line each.
fn op_builds(extensions: &str) -> usize {
    let log = Path::new(extensions).join("deepspeed_shm_comm/.ninja_log");
    std::fs::read_to_string(log).map_or(0, |l| l.lines().count())
}

const LAYOUT: [&str; 4] = ["--devices", "2", "--num-nodes", "2"];

/// Runs both nodes' launchers to their end and returns the four ranks' records, by rank,
/// without what differs between runs by nature (nothing, so far).
fn train(launchers: Vec<Launcher>, results: &Path) -> Vec<serde_json::Value> {
    // Lightning imports are slow on a loaded machine: bound the whole job generously.
    let deadline = Instant::now() + Duration::from_secs(300);
    for launcher in launchers {
        let (code, out) = launcher.finish(deadline);
        assert_eq!(code, Some(0), "launcher failed:\n{out}");
    }
    let mut ranks = records(results, 4, 4, deadline);
    ranks.sort_by_key(|r| r["rank"].as_u64());
    ranks
}

#[test]
fn lightning_ddp_trains_under_rdzv_run_as_under_torchrun() {
    let Some(python) = python() else {
        eprintln!("skipped: no Lightning environment (scripts/torch-frameworks-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let results = fresh_dir("lightning-rdzv");
    let url = etcd.url("lightning", "min_nodes=2&max_nodes=2&last_call_timeout=1");
    let dir = results.to_str().unwrap();
    let args = [
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--local-addr=127.0.0.1",
    ];
    let launchers = (0..2)
        .map(|_| {
            let mut command = Command::new(launch::RDZV);
            command
                .arg("run")
                .args(args)
                .arg(program("lightning_ddp.py"))
                .args(LAYOUT)
                .env("PYTHON_EXEC", &python)
                .env("RESULT_DIR", dir);
            Launcher::spawn(command)
        })
        .collect();
    let under_rdzv = train(launchers, &results);
    for (rank, r) in under_rdzv.iter().enumerate() {
        assert_eq!(r["rank"], rank, "{r}");
        assert_eq!(r["world"], 4, "{r}");
        assert_eq!(r["node_rank"], rank / 2, "{r}");
        assert_eq!(r["local_rank"], rank % 2, "{r}");
        assert_eq!(r["environment"], "TorchElasticEnvironment", "{r}");
        assert_eq!(r["backend"], "gloo", "{r}");
        assert_eq!(r["steps"], 5, "{r}");
        assert_eq!(r["same_weights"], true, "{r}");
    }

    // The same job under torchrun (its c10d rendezvous, the store on a port of this machine).
    let torch_results = fresh_dir("lightning-torchrun");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let launchers = (0..2)
        .map(|_| {
            let mut command = Command::new(&python);
            command
                .args([
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    "--nproc-per-node=2",
                ])
                .args(["--rdzv-backend=c10d", "--rdzv-id=lightning"])
                .arg(format!("--rdzv-endpoint=127.0.0.1:{port}"))
                .arg("--local-addr=127.0.0.1")
                .arg(program("lightning_ddp.py"))
                .args(LAYOUT)
                .env("RESULT_DIR", &torch_results);
            Launcher::spawn(command)
        })
        .collect();
    let under_torchrun = train(launchers, &torch_results);
    assert_eq!(under_rdzv, under_torchrun);
    let _ = std::fs::remove_dir_all(&results);
    let _ = std::fs::remove_dir_all(&torch_results);
}

#[test]
fn deepspeed_zero1_trains_under_rdzv_run() {
    let Some(python) = python() else {
        eprintln!("skipped: no DeepSpeed environment (scripts/torch-frameworks-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let results = fresh_dir("deepspeed");
    let url = etcd.url("deepspeed", "min_nodes=2&max_nodes=2&last_call_timeout=1");
    let args = [
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--local-addr=127.0.0.1",
    ];
    let dir = results.to_str().unwrap();
    let extensions = torch_extensions(&python);
    let builds = op_builds(&extensions);
    let launchers = (0..2)
        .map(|_| {
            Launcher::run(
                &python,
                &args,
                &program("deepspeed_zero1.py"),
                &[
                    ("RESULT_DIR", dir),
                    ("TORCH_EXTENSIONS_DIR", extensions.as_str()),
                ],
            )
        })
        .collect();
    for (rank, r) in train(launchers, &results).iter().enumerate() {
        assert_eq!(r["rank"], rank, "{r}");
        assert_eq!(r["world"], 4, "{r}");
        assert_eq!(r["zero_stage"], 1, "{r}");
        assert_eq!(r["backend"], "gloo", "{r}");
        assert_eq!(r["steps"], 5, "{r}");
        assert_eq!(r["same_weights"], true, "{r}");
    }
    // Built once with the environment, never by a job: a build per process took minutes on a
    // busy machine.
    assert_eq!(
        op_builds(&extensions),
        builds,
        "DeepSpeed built its op during the job (in {extensions}); scripts/torch-frameworks-env.sh builds it once"
    );
    let _ = std::fs::remove_dir_all(&results);
}
