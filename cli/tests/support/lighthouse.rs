//! The harness of the `rdzv lighthouse` tests: lighthouse processes on a harness etcd, read
//! line by line, and replica groups that act as torchft's managers do (a heartbeat every
//! 100 ms, a long-poll quorum call per step), through a client generated from the same proto.
#![allow(dead_code)] // each test module uses a part of it

use crate::common::SpawnTied;
use crate::proto::lighthouse_service_client::LighthouseServiceClient;
use crate::proto::{LighthouseHeartbeatRequest, LighthouseQuorumRequest, Quorum, QuorumMember};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub const RDZV: &str = env!("CARGO_BIN_EXE_rdzv");
pub const HEARTBEAT_TIMEOUT_MS: u64 = 1000;

/// One `rdzv lighthouse` process and the lines it writes.
pub struct Lighthouse {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    pub address: String,
}

impl Lighthouse {
    pub fn start(endpoint: &str, job: &str) -> Lighthouse {
        Lighthouse::start_with(endpoint, job, &[])
    }

    /// Starts one with `flags` in place of the defaults of the same name (`--rdzv-conf=...`).
    pub fn start_with(endpoint: &str, job: &str, flags: &[&str]) -> Lighthouse {
        let mut args: Vec<String> = [
            "--bind=127.0.0.1:0",
            "--min_replicas=2",
            "--join_timeout_ms=300",
            "--quorum_tick_ms=20",
            &format!("--heartbeat_timeout_ms={HEARTBEAT_TIMEOUT_MS}"),
            &format!("--rdzv-endpoint={endpoint}"),
            &format!("--rdzv-id={job}"),
            "--rdzv-conf=lease_ttl=2",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        for flag in flags {
            let name = flag.split('=').next().unwrap_or(flag);
            args.retain(|a| a.split('=').next() != Some(name));
            args.push(flag.to_string());
        }
        let mut child = Command::new(RDZV)
            .arg("lighthouse")
            .args(&args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn_tied()
            .expect("starting rdzv lighthouse");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut l = Lighthouse {
            child,
            lines,
            seen: vec![],
            address: String::new(),
        };
        let line = l.wait_line(Duration::from_secs(20), "serving on ");
        l.address = line
            .split("serving on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("an address after 'serving on'")
            .to_string();
        l
    }

    /// Waits for a line containing `what`, written by now or within `within`.
    pub fn wait_line(&mut self, within: Duration, what: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(what)) {
            return line.clone();
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(what) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {what:?} within {within:?}; the lighthouse wrote:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Whether this lighthouse has said it leads, looking at what arrived so far.
    pub fn said_leading(&mut self) -> bool {
        self.said_line("lighthouse: leading")
    }

    /// Whether this lighthouse says it leads within `within`: its output reaches the test
    /// through a reader thread, so a line written before an answer may come after it.
    pub fn says_leading_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.said_leading() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => return false,
            }
        }
        true
    }

    /// Whether this lighthouse has written a line containing `what`, so far.
    pub fn said_line(&mut self, what: &str) -> bool {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen.iter().any(|l| l.contains(what))
    }
}

impl Drop for Lighthouse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() || std::env::var_os("LIGHTHOUSE_TEST_LINES").is_some() {
            while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                self.seen.push(line);
            }
            eprintln!(
                "lighthouse {} wrote:\n{}",
                self.address,
                self.seen.join("\n")
            );
        }
    }
}

pub async fn client(address: &str) -> LighthouseServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(address.to_string())
        .expect("a lighthouse address")
        .connect_lazy();
    LighthouseServiceClient::new(channel)
}

/// A replica group as a torchft manager drives one: a heartbeat every 100 ms (a task) and a
/// quorum request per step.
pub struct Replica {
    pub id: String,
    lighthouse: LighthouseServiceClient<Channel>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl Replica {
    pub async fn start(id: &str, address: &str) -> Replica {
        let lighthouse = client(address).await;
        let heartbeats = Self::heartbeat(id, lighthouse.clone()).await;
        Replica {
            id: id.into(),
            lighthouse,
            heartbeats,
        }
    }

    /// Starts heartbeating without waiting for a first heartbeat to be taken: a manager that
    /// starts while the lighthouses elect a leader asks at once all the same.
    pub async fn join(id: &str, address: &str) -> Replica {
        let lighthouse = client(address).await;
        let (heartbeats, _) = Self::beating(id, lighthouse.clone());
        Replica {
            id: id.into(),
            lighthouse,
            heartbeats,
        }
    }

    /// Starts heartbeating, and returns once the lighthouse has taken a first heartbeat (a
    /// manager heartbeats from its start, so the lighthouse knows it before its first ask).
    pub async fn heartbeat(
        id: &str,
        c: LighthouseServiceClient<Channel>,
    ) -> tokio::task::JoinHandle<()> {
        let (task, mut first) = Self::beating(id, c);
        tokio::time::timeout(Duration::from_secs(10), first.wait_for(|t| *t))
            .await
            .expect("a first heartbeat taken within 10 s")
            .expect("the heartbeat task runs");
        task
    }

    /// A heartbeat every 100 ms; the flag turns true once one is taken.
    fn beating(
        id: &str,
        mut c: LighthouseServiceClient<Channel>,
    ) -> (
        tokio::task::JoinHandle<()>,
        tokio::sync::watch::Receiver<bool>,
    ) {
        let id = id.to_string();
        let (taken, first) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let beat = LighthouseHeartbeatRequest {
                    replica_id: id.clone(),
                };
                if c.heartbeat(beat).await.is_ok() {
                    taken.send_replace(true);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        (task, first)
    }

    /// Talks to another lighthouse from now on (heartbeats too).
    pub async fn switch_to(&mut self, address: &str) {
        self.heartbeats.abort();
        self.lighthouse = client(address).await;
        self.heartbeats = Self::heartbeat(&self.id, self.lighthouse.clone()).await;
    }

    pub fn stop_heartbeats(&self) {
        self.heartbeats.abort();
    }

    /// Asks for a quorum (a future of its own, so several replicas ask at once).
    pub fn quorum(
        &self,
        step: i64,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<Quorum, tonic::Status>> + Send + 'static {
        let mut request = tonic::Request::new(LighthouseQuorumRequest {
            requester: Some(QuorumMember {
                replica_id: self.id.clone(),
                address: format!("manager-{}", self.id),
                store_address: format!("store-{}", self.id),
                step,
                world_size: 1,
                ..Default::default()
            }),
        });
        request.set_timeout(timeout);
        let mut c = self.lighthouse.clone();
        async move {
            Ok(c.quorum(request)
                .await?
                .into_inner()
                .quorum
                .expect("a quorum"))
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

/// Every replica of `group` asks at once; each gets the same quorum, returned.
pub async fn step(group: &[&Replica], step: i64) -> Quorum {
    let asks = group
        .iter()
        .map(|r| r.quorum(step, Duration::from_secs(15)));
    let got: Vec<Quorum> = futures_join(asks).await;
    let first = got[0].clone();
    for (r, q) in group.iter().zip(&got) {
        assert_eq!(
            q.quorum_id, first.quorum_id,
            "replica {} got another quorum",
            r.id
        );
        assert_eq!(ids(q), ids(&first), "replica {} got other members", r.id);
    }
    first
}

pub async fn futures_join<
    F: std::future::Future<Output = Result<Quorum, tonic::Status>> + Send + 'static,
>(
    asks: impl Iterator<Item = F>,
) -> Vec<Quorum> {
    let handles: Vec<_> = asks.map(tokio::spawn).collect();
    let mut out = vec![];
    for h in handles {
        out.push(h.await.expect("a replica task").expect("a quorum"));
    }
    out
}

pub fn ids(q: &Quorum) -> Vec<String> {
    q.participants
        .iter()
        .map(|p| p.replica_id.clone())
        .collect()
}
