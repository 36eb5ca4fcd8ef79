//! An unmodified multi-process JAX program (`jax.distributed.initialize()` with no arguments,
//! CPU devices, gloo collectives) under `rdzv run --framework=jax`: two launchers of two
//! workers each form one JAX world of four whose collectives are right, and the loss of a node
//! re-forms it smaller. Needs the JAX environment made by `scripts/jax-env.sh`
//! (`RDZV_JAX_PYTHON` names its python, else it is looked up in the cache); skipped, saying
//! so, where there is none.

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{cached_python, fresh_dir, records, Launcher};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/frameworks/jax_collective.py")
}

/// Checks one world's records: JAX's process ids are the workers' RANKs, every process saw
/// every other's value in order, and all name one coordinator on MASTER_ADDR at a port of its
/// own.
fn check_world(records: &[serde_json::Value], processes: u64) {
    let ids: BTreeSet<u64> = records
        .iter()
        .map(|r| r["process"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, (0..processes).collect(), "{records:?}");
    let gathered: Vec<f64> = (1..=processes).map(|p| p as f64).collect();
    let coordinator = &records[0]["JAX_COORDINATOR_ADDRESS"];
    for r in records {
        assert_eq!(r["processes"], processes, "{r}");
        assert_eq!(r["devices"], processes, "one CPU device per process: {r}");
        assert_eq!(r["RANK"], r["process"].to_string(), "{r}");
        assert_eq!(r["WORLD_SIZE"], processes.to_string(), "{r}");
        let got: Vec<f64> = r["gathered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got, gathered, "{r}");
        assert_eq!(r["total"], gathered.iter().sum::<f64>(), "{r}");
        assert_eq!(&r["JAX_COORDINATOR_ADDRESS"], coordinator, "{records:?}");
        let (host, port) = coordinator.as_str().unwrap().rsplit_once(':').unwrap();
        assert_eq!(host, r["MASTER_ADDR"].as_str().unwrap(), "{r}");
        assert_ne!(port, r["MASTER_PORT"].as_str().unwrap(), "{r}");
    }
}

#[test]
fn jax_collectives_across_two_launchers() {
    let Some(python) = cached_python("RDZV_JAX_PYTHON", "jax") else {
        eprintln!("skipped: no JAX environment (scripts/jax-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let results = fresh_dir("jax-pair");
    let url = etcd.url(
        "jax",
        "min_nodes=2&max_nodes=2&last_call_timeout=1&lease_ttl=3",
    );
    let dir = results.to_str().unwrap();
    let args = [
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--local-addr=127.0.0.1",
        "--framework=jax",
    ];
    let started = Instant::now();
    let launchers: Vec<Launcher> = (0..2)
        .map(|_| Launcher::run(&python, &args, &program(), &[("RESULT_DIR", dir)]))
        .collect();
    // JAX imports are slow on a loaded machine: bound the whole job generously.
    let deadline = Instant::now() + Duration::from_secs(240);
    for launcher in launchers {
        let (code, out) = launcher.finish(deadline);
        assert_eq!(code, Some(0), "launcher failed:\n{out}");
    }
    eprintln!(
        "2 x 2 JAX processes: launch to exit {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let world = records(&results, 4, 4, deadline);
    check_world(&world, 4);
    assert_eq!(world[0]["MASTER_ADDR"], "127.0.0.1");
    let _ = std::fs::remove_dir_all(&results);
}

/// Node loss: two nodes of two JAX processes run; one is SIGKILLed with its process group, as
/// a lost machine would be; the survivor's launcher re-forms the round alone, as node rank 0,
/// with a new coordinator port, and its new workers form a JAX world of two whose collectives
/// are right.
///
/// - The coordinator's node lost: the survivor's JAX processes abort at once (XLA's
///   coordination agent loses the service: SIGABRT), before the lost lease shows; the launcher
///   sees a worker failure first, which the loss then explains (no restart is spent in the end:
///   `cli/tests/recovery.rs` checks that with `--max-restarts=0`; this test keeps a restart in
///   its budget either way).
/// - The other node lost: the survivor's processes keep running (the service would notice the
///   missing heartbeats only after 100 s) until the launcher sees the lost lease and stops them,
///   spending no restart. JAX takes SIGTERM as a preemption notice and keeps running, so they
///   go at the end of `--shutdown-timeout` (SIGKILL); a short one keeps the test short.
fn node_loss(kill_the_coordinators_node: bool) {
    let Some(python) = cached_python("RDZV_JAX_PYTHON", "jax") else {
        eprintln!("skipped: no JAX environment (scripts/jax-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let results = fresh_dir(&format!("jax-loss-{kill_the_coordinators_node}"));
    let url = etcd.url("jax-loss", "last_call_timeout=1&lease_ttl=3");
    let dir = results.to_str().unwrap();
    let max_restarts = format!("--max-restarts={}", u8::from(kill_the_coordinators_node));
    let args = [
        "--rdzv",
        &url,
        "--nnodes=1:2",
        "--nproc-per-node=2",
        &max_restarts,
        "--shutdown-timeout=2",
        "--local-addr=127.0.0.1",
        "--framework=jax",
    ];
    // Every group stays until the test releases the last one.
    let env = [("RESULT_DIR", dir), ("HOLD", "1")];
    let deadline = Instant::now() + Duration::from_secs(240);
    let first = Launcher::run(&python, &args, &program(), &env);
    // The second node joins once the first runs alone, so the first is node rank 0 and hosts
    // process 0 and the coordinator: node ranks stay put across rounds.
    let alone = records(&results, 2, 2, deadline);
    check_world(&alone, 2);
    let second = Launcher::run(&python, &args, &program(), &env);
    let four = records(&results, 4, 4, deadline);
    check_world(&four, 4);
    let coordinators = four.iter().find(|r| r["process"] == 0).unwrap();
    assert_eq!(
        coordinators["agent"],
        first.id(),
        "node rank 0 moved: {four:?}"
    );
    let (mut victim, survivor) = match kill_the_coordinators_node {
        true => (first, second),
        false => (second, first),
    };
    let killed = Instant::now();
    victim.kill_node();
    // The survivor's new world of two, beside the first node's world of two.
    let after: Vec<_> = records(&results, 2, 4, deadline)
        .into_iter()
        .filter(|r| !alone.iter().any(|a| a["pid"] == r["pid"]))
        .collect();
    check_world(&after, 2);
    for r in &after {
        assert_eq!(r["agent"], survivor.id(), "{r}");
    }
    assert_ne!(
        after[0]["JAX_COORDINATOR_ADDRESS"], four[0]["JAX_COORDINATOR_ADDRESS"],
        "a new round has a new coordinator"
    );
    eprintln!(
        "survivor's JAX world of two had its collectives {:.1} s after the SIGKILL",
        killed.elapsed().as_secs_f64()
    );
    std::fs::write(results.join("release"), b"").unwrap();
    let (code, out) = survivor.finish(deadline);
    assert_eq!(code, Some(0), "survivor failed:\n{out}");
    if !kill_the_coordinators_node {
        // A node loss is a membership change: no restart spent.
        assert!(!out.contains("restarting the worker group"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&results);
}

#[test]
fn jax_survives_the_loss_of_the_coordinators_node() {
    node_loss(true);
}

#[test]
fn jax_survives_the_loss_of_another_node() {
    node_loss(false);
}
