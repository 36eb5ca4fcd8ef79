//! A round while the etcd cluster loses its raft leader: N nodes form a round, then all call
//! `next` again and the leader member is SIGKILLed as they are released; the time is from the
//! kill to the last node's return. The killed member is started again from its own command
//! line (same data directory) and the cluster is healthy again before the next repeat.

use rdzv::{Params, Rendezvous};
use rdzv_bench::stats::{median, ms};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One member of the cluster the benchmark runs against.
struct Member {
    endpoint: String,
    pid: u32,
}

/// The member that is the raft leader now, by asking each member's status.
async fn leader(members: &[Member]) -> usize {
    let mut leader_id = None;
    let mut ids = Vec::new();
    for m in members {
        let mut c = etcd_client::Client::connect([m.endpoint.as_str()], None)
            .await
            .unwrap();
        let status = c.status().await.unwrap();
        leader_id = Some(status.leader());
        ids.push(status.header().unwrap().member_id());
    }
    let leader_id = leader_id.unwrap();
    ids.iter()
        .position(|id| *id == leader_id)
        .expect("the leader is one of the members")
}

/// SIGKILLs member `i`; returns its command line and working directory to start it again.
fn kill(member: &Member) -> (Vec<String>, std::path::PathBuf) {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", member.pid)).unwrap();
    let args = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", member.pid)).unwrap();
    // SAFETY: a plain kill(2) of a process this benchmark was given.
    assert_eq!(unsafe { libc::kill(member.pid as i32, libc::SIGKILL) }, 0);
    (args, cwd)
}

/// Starts a killed member again and waits (at most 60 s) until every member answers with one
/// leader among them.
async fn restart(members: &mut [Member], i: usize, args: Vec<String>, cwd: std::path::PathBuf) {
    let child = std::process::Command::new(&args[0])
        .args(&args[1..])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    members[i].pid = child.id();
    std::mem::forget(child); // lives on as a member of the cluster, as it did before
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut healthy = true;
        for m in members.iter() {
            let ok = async {
                let mut c = etcd_client::Client::connect([m.endpoint.as_str()], None).await?;
                c.status().await
            };
            healthy &= tokio::time::timeout(Duration::from_secs(2), ok)
                .await
                .is_ok_and(|s| s.is_ok_and(|s| s.leader() != 0));
        }
        if healthy {
            return;
        }
        assert!(Instant::now() < deadline, "the cluster did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Time from the kill of the raft leader to the last of `n` nodes in the next round.
async fn one(members: &mut [Member], endpoints: &str, n: usize, run: &str) -> Duration {
    let url = format!("etcd://{endpoints}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=120");
    let params = Params::from_url(&url).unwrap();
    let mut nodes = Vec::new();
    for _ in 0..n {
        nodes.push(Arc::new(Rendezvous::new(params.clone()).await.unwrap()));
    }
    let round = |nodes: &Vec<Arc<Rendezvous>>| {
        nodes
            .iter()
            .map(|node| {
                let node = node.clone();
                tokio::spawn(async move { node.next().await.unwrap().0.round })
            })
            .collect::<Vec<_>>()
    };
    for task in round(&nodes) {
        assert_eq!(task.await.unwrap(), 0);
    }
    let victim = leader(members).await;
    let again = round(&nodes);
    let (args, cwd) = kill(&members[victim]);
    let killed = Instant::now();
    for task in again {
        assert_eq!(task.await.unwrap(), 1);
    }
    let took = killed.elapsed();
    for node in &nodes {
        node.shutdown().await.unwrap();
    }
    restart(members, victim, args, cwd).await;
    took
}

/// `endpoints` and `pids` list the members in the same order.
pub async fn leader_kill(endpoints: &str, pids: &str, sizes: &[usize]) {
    let mut members: Vec<Member> = endpoints
        .split(',')
        .zip(pids.split(','))
        .map(|(e, p)| Member {
            endpoint: e.to_string(),
            pid: p.parse().expect("pids are numbers"),
        })
        .collect();
    assert!(
        members.len() >= 3,
        "--leader-kill needs a cluster of 3 or more"
    );
    let tag = std::process::id();
    println!(
        "etcd raft leader SIGKILLed as N nodes call next: time to the next round (median of 3)"
    );
    for &n in sizes {
        let mut runs = Vec::new();
        for r in 0..3 {
            runs.push(
                one(
                    &mut members,
                    endpoints,
                    n,
                    &format!("leader-kill-{n}-{r}-{tag}"),
                )
                .await,
            );
        }
        println!("N={n:>5}  median {:>10}", ms(median(runs), 2));
    }
}
