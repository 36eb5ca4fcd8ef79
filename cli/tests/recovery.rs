//! Recovery from a lost node, end to end: real `rdzv run` processes on a real etcd, killed by a
//! real SIGKILL, with workers that depend on their peers the way a gloo process group does
//! (`tests/frameworks/peer_worker.py`: every rank holds a TCP connection to rank 0 and fails
//! when one breaks). What is checked:
//!
//! - a peer's death spends no restart: with `--max-restarts=0`, the survivor re-forms with a
//!   replacement node and the job succeeds, whichever the survivor sees first, its workers'
//!   broken connection or the loss (with the watchdog, without it, and with a restart to
//!   spend, which is then refunded);
//! - the watchdog releases a killed launcher's node (its lease revoked at once);
//! - a release ticket revokes only the lease the node's `alive` key is bound to.
//!
//! Timings are not asserted here (`scripts/bench.sh --launcher` prints them).

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{fresh_dir, Launcher, RDZV};
use std::path::{Path, PathBuf};
use std::process::Command;

const FAST: &str = "last_call_timeout=1&lease_ttl=2";

fn worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/frameworks/peer_worker.py")
}

/// `rdzv run --rdzv URL FLAGS python3 peer_worker.py`, its workers ending once `done` exists.
fn node(url: &str, flags: &[&str], done: &Path) -> Launcher {
    let mut cmd = Command::new(RDZV);
    cmd.args(["run", "--rdzv", url])
        .args(flags)
        .arg("python3")
        .arg(worker())
        .env("PEER_WORKER_DONE", done);
    for (k, _) in std::env::vars() {
        if k.starts_with("PET_") || k == "RDZV_NO_WATCHDOG" {
            cmd.env_remove(k);
        }
    }
    Launcher::spawn_in_own_tmpdir(cmd)
}

/// The next line of `l` that says its workers took their first step in a world of `world`;
/// the worker's restart count.
fn stepped(l: &mut Launcher, world: u32, secs: u64) -> u32 {
    let want = format!("STEP world={world} ");
    let line = l.wait_line(secs, |line| line.contains(&want));
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("restart="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no restart count in {line:?}"))
}

/// Two nodes with `flags` run peer-dependent workers; one launcher (alone, not its group) is
/// SIGKILLed; a replacement joins. The survivor must form the new round with it and the job
/// must succeed, its workers seeing restart count 0. Returns the survivor and the victim.
fn peer_killed(flags: &[&str], run: &str) -> (Launcher, Launcher) {
    let etcd = Etcd::start();
    let dir = fresh_dir(run);
    let done = dir.join("done");
    let url = etcd.url(run, &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let mut a = node(&url, flags, &done);
    let mut b = node(&url, flags, &done);
    assert_eq!(stepped(&mut a, 2, 60), 0);
    assert_eq!(stepped(&mut b, 2, 60), 0);

    b.signal(libc::SIGKILL);
    b.exit(20);
    let mut c = node(&url, flags, &done);
    assert_eq!(
        stepped(&mut a, 2, 60),
        0,
        "the survivor's workers see no restart spent:\n{}",
        a.output()
    );
    assert_eq!(stepped(&mut c, 2, 60), 0);
    std::fs::write(&done, b"").unwrap();
    for l in [&mut a, &mut c] {
        let status = l.exit(60);
        assert_eq!(status.code(), Some(0), "{}", l.output());
    }
    assert!(!a.said("restart budget spent"), "{}", a.output());
    let _ = std::fs::remove_dir_all(&dir);
    (a, b)
}

#[test]
fn a_peers_death_spends_no_restart_with_the_watchdog() {
    let (a, b) = peer_killed(&["--max-restarts=0"], "peer-watchdog");
    assert!(
        b.said("watchdog: the launcher of node") && b.said("released the node"),
        "the victim's watchdog releases it:\n{}",
        b.output()
    );
    // Seen as a loss either by the monitor or after the workers' broken connection.
    assert!(
        a.said("member(s) of the round lost") || a.said("member(s) of the round were lost"),
        "{}",
        a.output()
    );
}

#[test]
fn a_peers_death_spends_no_restart_when_its_lease_must_expire() {
    // No watchdog: the survivor's workers fail on the broken connection long before the
    // victim's lease expires, and with no restart left the survivor waits for the loss.
    let (a, b) = peer_killed(&["--max-restarts=0", "--no-watchdog"], "peer-lease");
    assert!(!b.said("watchdog"), "{}", b.output());
    assert!(
        a.said("no restart left: asking the other 1 node(s) whether one was lost"),
        "the failure comes before the loss:\n{}",
        a.output()
    );
    assert!(
        a.said("a membership change, forming a new round (no restart spent)"),
        "{}",
        a.output()
    );
}

#[test]
fn a_restart_spent_on_a_peers_death_is_refunded() {
    // With a restart to spend, the failure is charged at once and refunded when the next
    // round shows the member lost: the workers of the new round see restart count 0.
    let (a, _) = peer_killed(&["--max-restarts=1", "--no-watchdog"], "peer-refund");
    assert!(a.said("restart refunded (0 of 1 used)"), "{}", a.output());
}

#[test]
fn a_real_failure_still_spends_the_budget() {
    // Nobody is lost: the worker's own failure ends the job with --max-restarts=0.
    let etcd = Etcd::start();
    let url = etcd.url("real-failure", &format!("min_nodes=1&max_nodes=1&{FAST}"));
    let mut cmd = Command::new(RDZV);
    cmd.args([
        "run",
        "--rdzv",
        &url,
        "--max-restarts=0",
        "sh",
        "-c",
        "exit 3",
    ]);
    let mut l = Launcher::spawn_in_own_tmpdir(cmd);
    let status = l.exit(60);
    assert_eq!(status.code(), Some(1), "{}", l.output());
    // Alone in its round, nobody could have been lost: no question, no wait.
    assert!(!l.said("no restart left: asking"), "{}", l.output());
    assert!(l.said("restart budget spent"), "{}", l.output());
}

/// A failing worker on one node of `n`, with no restart left and nobody lost: the job fails on
/// every node, and the healthy ones (their workers only sleep) exit 1 too, within the bound
/// that docs/LAUNCHER.md states (5 s from the failure; the healthy nodes' workers stop at once
/// on SIGTERM). The lease is the default 10 s, so a wait for it would show. Before, the
/// failing node waited `lease_ttl` for a loss and the healthy one exited 0 when the run closed.
/// With c10d, the serving node's etcd must outlast the other nodes' shutdowns: at 8 nodes one
/// node now and then retried a vanished etcd for its whole `close_timeout` (30 s) when the
/// serving node left as soon as no `alive` key was left.
fn a_failure_fails_every_node(c10d: bool, n: usize) {
    let etcd = (!c10d).then(Etcd::start);
    let dir = fresh_dir(&format!("fail-all-{c10d}-{n}"));
    let failed_at = dir.join("failed_at");
    // The last rank fails once it runs; the others sleep.
    let script = format!(
        "import os, sys, time\n\
         print('UP rank=' + os.environ['RANK'], flush=True)\n\
         if int(os.environ['RANK']) == int(os.environ['WORLD_SIZE']) - 1:\n\
         \x20   time.sleep(1)\n\
         \x20   open({:?}, 'w').write(repr(time.time()))\n\
         \x20   sys.exit(7)\n\
         time.sleep(600)\n",
        failed_at.display().to_string()
    );
    let worker = dir.join("w.py");
    std::fs::write(&worker, script).unwrap();
    let rendezvous = || -> Vec<String> {
        match &etcd {
            Some(etcd) => vec![
                "--rdzv".into(),
                etcd.url(
                    "fail-all",
                    &format!("min_nodes={n}&max_nodes={n}&last_call_timeout=1"),
                ),
            ],
            None => vec![
                "--rdzv-backend=c10d".into(),
                format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port()),
                "--rdzv-id=fail-all".into(),
                format!("--nnodes={n}"),
                "--rdzv-conf=last_call_timeout=1".into(),
            ],
        }
    };
    let launch = |rendezvous: &[String]| {
        let mut cmd = Command::new(RDZV);
        cmd.arg("run")
            .args(rendezvous)
            .args(["--max-restarts=0", "--local-addr=127.0.0.1"])
            .arg(&worker);
        Launcher::spawn_in_own_tmpdir(cmd)
    };
    let mut tries = 0;
    let (rendezvous, first) = loop {
        let rendezvous = rendezvous();
        let mut first = launch(&rendezvous);
        if !c10d {
            break (rendezvous, first);
        }
        // The first serves the rendezvous: the others must find it served. The port was free
        // when picked, but another process of the machine (another suite's) may have bound it
        // since: that first launcher then joins a server that is not its job's, which is not
        // what this tests. Another port, then.
        let said = first.wait_line(30, |l| {
            l.contains("serving the rendezvous") || l.contains("served on this machine already")
        });
        if said.contains("serving the rendezvous") {
            break (rendezvous, first);
        }
        tries += 1;
        assert!(tries < 5, "every port picked was taken: {}", first.output());
    };
    let mut nodes = vec![first];
    nodes.extend((1..n).map(|_| launch(&rendezvous)));
    // Each exit is read in turn: a time taken late only overstates how long a node took.
    let mut exits = Vec::new();
    for node in nodes.iter_mut() {
        let status = node.exit(60);
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        exits.push((status.code(), at));
    }
    let failed: f64 = std::fs::read_to_string(&failed_at)
        .unwrap()
        .parse()
        .unwrap();
    for (node, (code, at)) in nodes.iter().zip(&exits) {
        assert_eq!(*code, Some(1), "{}", node.output());
        assert!(
            at - failed < 5.0,
            "a node exited {:.2} s after the failure:\n{}",
            at - failed,
            node.output()
        );
    }
    let failing = format!("rank {} ", n - 1);
    let healthy: Vec<&Launcher> = nodes
        .iter()
        .filter(|l| !l.said("failed: exit code 7"))
        .collect();
    assert_eq!(healthy.len(), n - 1, "one node's worker failed");
    for l in healthy {
        assert!(
            l.said(&format!("the job failed on another node: {failing}")),
            "{}",
            l.output()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failure_fails_every_node_at_once() {
    a_failure_fails_every_node(false, 2);
}

#[test]
fn a_failure_fails_every_node_at_once_with_the_c10d_backend() {
    a_failure_fails_every_node(true, 2);
}

#[test]
fn a_failure_fails_every_node_of_eight_at_once_with_the_c10d_backend() {
    a_failure_fails_every_node(true, 8);
}

#[test]
fn a_release_ticket_revokes_only_the_lease_the_node_holds() {
    let etcd = Etcd::start();
    let url = etcd.url("ticket", "min_nodes=1&max_nodes=1");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let params = rdzv::Params::from_url(&url).unwrap();
        let node = rdzv::Rendezvous::new(params.clone()).await.unwrap();
        let admin = rdzv::admin::Admin::connect(params).await.unwrap();
        let ticket = node
            .release_ticket()
            .await
            .expect("a live node has a ticket");
        assert_eq!(ticket.node, node.node_id());
        assert_eq!(
            ticket.to_string().parse::<rdzv::ReleaseTicket>().unwrap(),
            ticket
        );
        assert_eq!(admin.status().await.unwrap().alive, 1);
        // Not the node's lease: nothing happens.
        let wrong = rdzv::ReleaseTicket {
            lease: ticket.lease + 1,
            ..ticket.clone()
        };
        assert!(!admin.release(&wrong).await.unwrap());
        assert_eq!(admin.status().await.unwrap().alive, 1);
        // The node's lease: its alive key goes at once.
        assert!(admin.release(&ticket).await.unwrap());
        assert_eq!(admin.status().await.unwrap().alive, 0);
        // Released already: nothing left to revoke.
        assert!(!admin.release(&ticket).await.unwrap());
        let _ = node.shutdown().await;
    });
}
