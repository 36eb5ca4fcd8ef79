//! Forming and re-forming a job on etcd: nodes of different sizes in one world, the exit
//! barrier, a node that arrives or is lost or drained, torchelastic's role ranks, and how often
//! a running node checks the membership.

use crate::common::Etcd;
use crate::support::{
    formed, node_id, num, op_fails, op_ok, pid, rdzv, status_json, unique_run_id, wait_gone,
    Fields, Scratch, WorkerLines, FAST,
};
use std::time::{Duration, Instant};

#[test]
fn launchers_with_different_worker_counts_form_one_job() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let run = unique_run_id("job");
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id = format!("--rdzv-id={run}");
    let node = |nproc: &str| {
        rdzv(&[
            "run",
            "--nnodes=2",
            nproc,
            &endpoint,
            &id,
            "--local-addr=127.0.0.1",
            &w,
            "ok",
        ])
    };
    let mut a = node("--nproc-per-node=2");
    let mut b = node("--nproc-per-node=1");
    let mut starts = vec![a.start(30), a.start(30), b.start(30)];
    a.exits_with(0, 30);
    b.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    let ranks: Vec<u32> = starts.iter().map(|f| num(f, "rank")).collect();
    assert_eq!(ranks, [0, 1, 2], "global ranks are unique and dense");
    let master = &starts[0]["master"];
    assert!(
        master.starts_with("127.0.0.1:"),
        "--local-addr is MASTER_ADDR: {master}"
    );
    for f in &starts {
        assert_eq!(num(f, "world"), 3);
        assert_eq!(num(f, "groups"), 2);
        assert_eq!(&f["master"], master, "every worker has the same master");
        assert_eq!(f["run"], run);
        assert_eq!(f["agent_store"], "False");
        assert_eq!(f["nccl"], "1");
        assert_eq!(f["role"], "default");
        assert_eq!(num(f, "role_world"), 3);
        assert_eq!(num(f, "role_rank"), num(f, "rank"));
        assert_eq!(num(f, "restart"), 0);
        assert_eq!(num(f, "max"), 0);
        assert!(f["errfile"].ends_with("error.json"), "{f:?}");
    }
    // The node with two workers holds the lower or the higher ranks, consistently.
    let node_of = |f: &Fields| (num(f, "group"), num(f, "lws"), f["omp"].clone());
    let two = starts
        .iter()
        .filter(|f| num(f, "lws") == 2)
        .collect::<Vec<_>>();
    let one = starts.iter().find(|f| num(f, "lws") == 1).unwrap();
    assert_eq!(node_of(two[0]), node_of(two[1]));
    assert_eq!(
        two[0]["omp"], "1",
        "OMP_NUM_THREADS=1 with several workers per node"
    );
    assert_eq!(
        one["omp"], "unset",
        "as torchrun: one worker per node keeps OMP_NUM_THREADS as it is"
    );
    let locals: Vec<u32> = two.iter().map(|f| num(f, "local")).collect();
    assert_eq!(locals, [0, 1]);
    assert!(a.said("exit barrier") && b.said("exit barrier"));
}

#[test]
fn min_equals_max_and_the_exit_barrier_waits_for_the_slow_node() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("barrier", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let fifo = s.path("release");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut fast = s.node(&url, &[], "ok");
    let fifo_arg = fifo.display().to_string();
    let mut slow = rdzv(&["run", "--rdzv", &url, &s.worker(), "fifo", &fifo_arg]);
    fast.start(30);
    slow.start(30);
    fast.wait_line(30, |l| l.contains("exit barrier"));
    assert!(
        fast.running(),
        "a node whose workers finished waits for the others"
    );
    // Release the slow worker: opening the FIFO for writing unblocks its read.
    std::fs::write(&fifo, "go\n").unwrap();
    slow.exits_with(0, 30);
    fast.exits_with(0, 30);
    assert!(fast.said("every node finished"), "{}", fast.output());
    // A finished job leaves nothing in etcd.
    assert_eq!(status_json(&url)["exists"], false);
}

#[test]
fn a_node_that_arrives_grows_the_world_without_spending_restarts() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("grow", &format!("min_nodes=1&max_nodes=3&{FAST}"));
    let mut a = s.node(&url, &["--max-restarts=0"], "hold");
    let first = a.start(30);
    assert_eq!(num(&first, "world"), 1);
    let mut b = s.node(&url, &["--max-restarts=0"], "hold");
    a.wait_line(30, |l| l.contains("waiting to join"));
    let again = a.start(30);
    let joined = b.start(30);
    assert_eq!(num(&again, "world"), 2);
    assert_eq!(num(&joined, "world"), 2);
    assert_eq!(
        num(&again, "restart"),
        0,
        "a membership change spends no restart"
    );
    assert_eq!(num(&again, "rank"), 0, "the first node keeps rank 0");
    assert_eq!(num(&joined, "rank"), 1);
    a.signal(libc::SIGTERM);
    b.signal(libc::SIGTERM);
    a.exits_with(128 + libc::SIGTERM, 30);
    b.exits_with(128 + libc::SIGTERM, 30);
}

#[test]
fn survivors_re_form_within_about_the_lease_ttl_after_a_node_is_killed() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("loss", &format!("min_nodes=2&max_nodes=3&{FAST}"));
    let mut nodes = s.nodes(3, &url, &[], "hold");
    let pids: Vec<(u32, i32)> = formed(&mut nodes, 3, 30)
        .iter()
        .map(|f| (num(f, "rank"), pid(f)))
        .collect();
    // Kill the node whose worker is rank 2, launcher and all, as a machine would die.
    let victim = pids.iter().position(|(rank, _)| *rank == 2).unwrap();
    let mut dead = nodes.remove(victim);
    let worker_pid = pids[victim].1;
    let killed = Instant::now();
    dead.crash();
    wait_gone(worker_pid, 10); // PR_SET_PDEATHSIG: no worker outlives its launcher
    for f in formed(&mut nodes, 2, 30) {
        assert_eq!(num(&f, "restart"), 0, "a lost node spends no restart");
    }
    let took = killed.elapsed();
    eprintln!(
        "survivors restarted {:.2} s after SIGKILL (lease_ttl 2 s, last call 1 s)",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(12), "took {took:?}");
    nodes.iter_mut().for_each(WorkerLines::terminate);
}

#[test]
fn rdzv_drain_stops_one_node_which_exits_0_and_the_others_re_form_without_spending_restarts() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    // A lease and a last call far beyond the waits below: the survivors can re-form in time
    // only because the drain is seen at once and nobody waits for the drained node.
    let url = etcd.url(
        "drain",
        "min_nodes=2&max_nodes=3&last_call_timeout=60&lease_ttl=60",
    );
    let mut nodes = s.nodes(3, &url, &["--max-restarts=0"], "hold");
    let ranks: Vec<u32> = formed(&mut nodes, 3, 90)
        .iter()
        .map(|f| num(f, "rank"))
        .collect();
    // The node running rank 1, by the id its launcher printed when it joined.
    let victim = ranks.iter().position(|r| *r == 1).unwrap();
    let node_id = node_id(&mut nodes[victim]);
    let out = op_ok(&["drain", "--reason", "scale down", &url, &node_id]);
    assert!(out.contains("drained"), "{out}");
    let mut drained = nodes.remove(victim);
    drained.exits_with(0, 30);
    assert!(
        drained.said("GOT TERM"),
        "its workers were stopped gracefully"
    );
    assert!(drained.said("drained"), "{}", drained.output());
    for f in formed(&mut nodes, 2, 30) {
        assert_eq!(num(&f, "restart"), 0, "a drain spends no restart");
    }
    let members = status_json(&url)["sealed"]["members"].clone();
    assert!(
        members
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["node"] != node_id.as_str()),
        "{members}"
    );
    // Draining what is not a node of the run is a usage error naming it.
    let err = op_fails(&["drain", &url, "0000000000000000"], 2);
    assert!(err.contains("0000000000000000"), "{err}");
    nodes.iter_mut().for_each(WorkerLines::terminate);
}

/// `--role`: ROLE_NAME, and role ranks counted over the nodes of the same role only (a prefix
/// sum in node rank order), as torchelastic assigns them; global ranks stay dense.
#[test]
fn roles_get_role_ranks_across_nodes() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let url = etcd.url("roles", &format!("min_nodes=3&max_nodes=3&{FAST}"));
    let node = |role: &str, nproc: &str| {
        rdzv(&[
            "run",
            "--rdzv",
            &url,
            role,
            nproc,
            "--local-addr=127.0.0.1",
            &w,
            "ok",
        ])
    };
    let mut nodes = [
        node("--role=trainer", "--nproc-per-node=2"),
        node("--role=evaluator", "--nproc-per-node=1"),
        node("--role=trainer", "--nproc-per-node=1"),
    ];
    let mut starts = Vec::new();
    for (n, count) in nodes.iter_mut().zip([2, 1, 1]) {
        for _ in 0..count {
            starts.push(n.start(60));
        }
    }
    for n in nodes.iter_mut() {
        n.exits_with(0, 60);
    }
    let mut ranks: Vec<u32> = starts.iter().map(|f| num(f, "rank")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3]);
    let of = |role: &str| -> Vec<&Fields> { starts.iter().filter(|f| f["role"] == role).collect() };
    let (trainers, evaluators) = (of("trainer"), of("evaluator"));
    assert_eq!((trainers.len(), evaluators.len()), (3, 1), "{starts:?}");
    let mut role_ranks: Vec<u32> = trainers.iter().map(|f| num(f, "role_rank")).collect();
    role_ranks.sort();
    assert_eq!(role_ranks, [0, 1, 2], "trainers count among trainers only");
    assert!(trainers.iter().all(|f| num(f, "role_world") == 3));
    assert_eq!(num(evaluators[0], "role_rank"), 0);
    assert_eq!(num(evaluators[0], "role_world"), 1);
    // Role ranks follow node ranks, as global ranks do.
    let mut by_rank = trainers.clone();
    by_rank.sort_by_key(|f| num(f, "rank"));
    let in_order: Vec<u32> = by_rank.iter().map(|f| num(f, "role_rank")).collect();
    assert_eq!(in_order, [0, 1, 2]);
}

/// `--monitor-interval` is how often a running node checks the membership: with 3 s, a node
/// that arrives just after the group started is seen at the next check, 3 s after the first
/// (never sooner; the default 0.1 s would see it within a fraction of a second), and no later
/// than the interval and a margin for a loaded machine.
#[test]
fn the_monitor_interval_paces_the_membership_checks() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("monitor", &format!("min_nodes=1&max_nodes=2&{FAST}"));
    let mut a = s.node(&url, &["--monitor_interval=3"], "hold");
    a.start(60);
    // The first check ran as the group started (just before its START line); the next is due
    // 3 s after it.
    let started = Instant::now();
    let mut b = s.node(&url, &[], "hold");
    b.wait_line(30, |l| l.contains("joining run"));
    a.wait_line(30, |l| l.contains("node(s) waiting to join"));
    let seen = started.elapsed();
    assert!(
        seen >= Duration::from_secs(2) && seen < Duration::from_secs(3 + 3),
        "the arrival was seen {seen:?} after the group started (interval 3 s)"
    );
    for n in [&mut a, &mut b] {
        n.terminate();
    }
}
