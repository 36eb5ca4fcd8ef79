//! The rendezvous backends other than a shared etcd: `--standalone` (no etcd), the static
//! rendezvous of `--node-rank` and `--master-addr`, and c10d (an etcd embedded in the node
//! that serves it, which dies with its launcher).

use crate::common;
use crate::launch::Launcher;
use crate::support::{formed, num, rdzv, rdzv_env, unique_run_id, wait_gone, Scratch, WorkerLines};
use std::path::PathBuf;

/// The first directory of PATH that has `tool`.
fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

#[test]
fn standalone_runs_without_etcd() {
    let s = Scratch::new();
    // No etcd on PATH either: --standalone needs none.
    let bare = s.path("no-etcd-path");
    std::fs::create_dir_all(&bare).unwrap();
    for tool in ["sh", "sleep", "grep", "cut", "date", "printf"] {
        if let Some(found) = which(tool) {
            let _ = std::os::unix::fs::symlink(found, bare.join(tool));
        }
    }
    let w = s.worker();
    let mut l = rdzv_env(
        &["run", "--standalone", "--nproc-per-node=3", &w, "ok"],
        &[("PATH", bare.to_str().unwrap())],
    );
    let mut starts: Vec<_> = (0..3).map(|_| l.start(30)).collect();
    l.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    for (i, f) in starts.iter().enumerate() {
        assert_eq!(num(f, "rank"), i as u32);
        assert_eq!(num(f, "local"), i as u32);
        assert_eq!(num(f, "world"), 3);
        assert!(f["master"].starts_with("localhost:"), "{f:?}");
        assert_eq!(f["master"], starts[0]["master"]);
    }
    // Worker lines reach the console as the worker wrote them, as under torchrun.
    assert!(
        l.lines_with("START rank=2 ")
            .any(|x| x.starts_with("START ")),
        "{}",
        l.output()
    );
}

#[test]
fn static_rendezvous_with_node_rank_and_master_address_forms_one_world() {
    let s = Scratch::new();
    let port = common::free_port().to_string();
    let w = s.worker();
    let mut nodes: Vec<Launcher> = (0..2)
        .map(|rank| {
            let node_rank = format!("--node-rank={rank}");
            rdzv(&[
                "run",
                "--nnodes=2",
                &node_rank,
                "--master_addr=127.0.0.1",
                "--master-port",
                &port,
                "--nproc-per-node=2",
                &w,
                "ok",
            ])
        })
        .collect();
    for (node_rank, node) in nodes.iter_mut().enumerate() {
        let mut starts: Vec<_> = (0..2).map(|_| node.start(30)).collect();
        node.exits_with(0, 30);
        starts.sort_by_key(|f| num(f, "rank"));
        for (local, f) in starts.iter().enumerate() {
            assert_eq!(num(f, "rank"), node_rank as u32 * 2 + local as u32, "{f:?}");
            assert_eq!(num(f, "world"), 4);
            assert_eq!(num(f, "group"), node_rank as u32);
            assert_eq!(num(f, "groups"), 2);
            assert_eq!(f["master"], format!("127.0.0.1:{port}"));
        }
    }
    // A static job needs a fixed node count, and a node rank inside it.
    let mut bad = rdzv(&["run", "--nnodes=1:2", "--node-rank=0", &w, "ok"]);
    bad.exits_with(2, 10);
    let mut bad = rdzv(&["run", "--nnodes=2", "--node-rank=2", &w, "ok"]);
    bad.exits_with(2, 10);
}

#[test]
fn c10d_backend_serves_the_rendezvous_from_the_endpoints_node() {
    let s = Scratch::new();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port());
    let w = s.worker();
    let id = unique_run_id("c10d");
    let id_arg = format!("--rdzv-id={id}");
    let args = [
        "run",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        &endpoint,
        &id_arg,
        "--rdzv-conf=last_call_timeout=1,lease_ttl=2",
        &w,
        "ok",
    ];
    // Started one after the other: the first serves (and joins once its etcd answers), the
    // second finds the port served.
    let mut first = rdzv(&args);
    first.wait_line(30, |x| x.contains("serving the rendezvous on port"));
    first.wait_line(30, |x| x.contains("joining run"));
    let second = rdzv(&args);
    let mut nodes = [first, second];
    let starts = formed(&mut nodes, 2, 60);
    let mut ranks: Vec<u32> = starts.iter().map(|f| num(f, "rank")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1]);
    let [mut first, mut second] = nodes;
    second.exits_with(0, 60);
    first.exits_with(0, 60);
    assert!(
        second.said("served on this machine already"),
        "{}",
        second.output()
    );
    // The embedded etcd went with its launcher: the port is free again.
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    assert!(std::net::TcpListener::bind(("0.0.0.0", port)).is_ok());

    // Without an etcd on PATH: one line saying what to run instead.
    let empty = s.path("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let mut none = rdzv_env(&args, &[("PATH", empty.to_str().unwrap())]);
    none.exits_with(1, 10);
    assert!(
        none.said("no `etcd` is beside this command or on PATH"),
        "{}",
        none.output()
    );
}

/// torchrun 2.15's c10d backend hangs both nodes when one arrives after the first round
/// formed: its old rank 0 does not publish MASTER_ADDR/PORT in the new round's store
/// (`docs/BENCHMARKS-HISTORY.md`). `rdzv run`'s c10d is the ordinary rendezvous on an
/// embedded etcd, so the job grows.
#[test]
fn c10d_backend_admits_a_node_that_arrives_after_the_first_round() {
    let s = Scratch::new();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port());
    let w = s.worker();
    let id_arg = format!("--rdzv-id={}", unique_run_id("c10d-grow"));
    let args = [
        "run",
        "--nnodes=1:2",
        "--rdzv-backend=c10d",
        &endpoint,
        &id_arg,
        "--rdzv-conf=last_call_timeout=1,lease_ttl=2",
        &w,
        "hold",
    ];
    let mut first = rdzv(&args);
    assert_eq!(num(&first.start(60), "world"), 1);
    let second = rdzv(&args);
    let mut nodes = [first, second];
    formed(&mut nodes, 2, 60);
    // The node that joined leaves first, then the one serving the rendezvous.
    for node in nodes.iter_mut().rev() {
        node.terminate();
    }
}

/// torch's `is_host` decides which node serves the c10d rendezvous, whatever the endpoint's
/// address (a Kubernetes Service name resolves to no address of the pod behind it): the node
/// told `is_host=false` waits for the endpoint although its address is local, and the one told
/// `is_host=true` serves it; the job forms.
#[test]
fn c10d_is_host_decides_which_node_serves() {
    let s = Scratch::new();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port());
    let w = s.worker();
    let id_arg = format!("--rdzv-id={}", unique_run_id("c10d-is-host"));
    let args = |is_host: &str| {
        [
            "run".to_string(),
            "--nnodes=2".into(),
            "--rdzv-backend=c10d".into(),
            endpoint.clone(),
            id_arg.clone(),
            format!(
                "--rdzv-conf=last_call_timeout=1,lease_ttl=2,is_host={is_host},read_timeout=60"
            ),
            w.clone(),
            "ok".into(),
        ]
    };
    let client_args = args("false");
    let mut client = rdzv(&client_args.iter().map(String::as_str).collect::<Vec<_>>());
    client.wait_line(30, |x| x.contains("waiting for etcd"));
    let host_args = args("true");
    let host = rdzv(&host_args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut nodes = [client, host];
    formed(&mut nodes, 2, 60);
    let [mut client, mut host] = nodes;
    client.exits_with(0, 60);
    host.exits_with(0, 60);
    assert!(
        !client.said("serving the rendezvous"),
        "{}",
        client.output()
    );
    assert!(host.said("serving the rendezvous"), "{}", host.output());
    assert!(
        host.said("read_timeout=60 is for torch's TCPStore"),
        "{}",
        host.output()
    );
}

/// The embedded etcd of `--rdzv-backend=c10d` dies with its launcher, even a SIGKILLed one
/// (PR_SET_PDEATHSIG): nothing keeps serving the port of a job that is gone.
#[test]
fn c10d_embedded_etcd_dies_with_a_sigkilled_launcher() {
    let s = Scratch::new();
    let port = common::free_port();
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{port}");
    let id_arg = format!("--rdzv-id={}", unique_run_id("c10d-kill"));
    let w = s.worker();
    let mut host = rdzv(&[
        "run",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        &endpoint,
        &id_arg,
        &w,
        "ok",
    ]);
    let serving = host.wait_line(30, |x| x.contains("serving the rendezvous on port"));
    let etcd_pid: i32 = serving
        .split("pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no etcd pid in {serving:?}"));
    host.crash();
    wait_gone(etcd_pid, 10);
    assert!(
        std::net::TcpListener::bind(("0.0.0.0", port)).is_ok(),
        "port {port} is still served"
    );
}
