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

/// What a lighthouse's /status page says it is, or `None` when it does not answer within
/// 500 ms (a paused process).
pub fn role(address: &str) -> Option<&'static str> {
    use std::io::{Read, Write};
    let host = address.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(
        format!("GET /status HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut page = String::new();
    s.read_to_string(&mut page).ok()?;
    if page.contains("Role: leader") {
        Some("leader")
    } else if page.contains("Role: follower") {
        Some("follower")
    } else {
        None
    }
}

/// The value of series `name` on a lighthouse's /metrics page (its labels checked: the job's
/// `run_id` and the lighthouse's own address as `node`).
pub fn metric(address: &str, job: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let host = address.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).expect("the lighthouse answers");
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    let (head, body) = page.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no {name} on {address}/metrics:\n{body}"));
    assert!(line.contains(&format!("run_id=\"{job}\"")), "{line}");
    assert!(line.contains(&format!("node=\"{address}\"")), "{line}");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// One job's lighthouse keys in etcd, read directly (not through the lighthouses).
pub struct JobKeys {
    client: etcd_client::Client,
    base: String,
}

impl JobKeys {
    pub async fn connect(endpoint: &str, job: &str) -> JobKeys {
        let client = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("the harness etcd");
        JobKeys {
            client,
            base: format!("/rdzv/{job}/"),
        }
    }

    /// A key of the job (`elect/lighthouse/leader`, `store/notes/lighthouse`): its value and
    /// its modification revision.
    /// Retried for up to 5 s (a member answers nothing while etcd elects its leader).
    pub async fn get(&mut self, key: &str) -> Option<(String, i64)> {
        let give_up = Instant::now() + Duration::from_secs(5);
        let got = loop {
            match self.client.get(format!("{}{key}", self.base), None).await {
                Ok(got) => break got,
                Err(e) if Instant::now() < give_up => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("no read of etcd within 5 s: {e}"),
            }
        };
        got.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.mod_revision(),
            )
        })
    }

    /// The address etcd names as the lighthouses' leader.
    pub async fn leader(&mut self) -> Option<String> {
        self.get("elect/lighthouse/leader").await.map(|(v, _)| v)
    }
}

/// Every 20 ms for `window`: `leader`'s /status says it leads, each of `others` that answers
/// says it follows, and etcd names `leader`. Panics at the first sample that shows anything
/// else (a second leader, none, another one in etcd); returns how many samples it took.
pub async fn one_leader_for(
    window: Duration,
    leader: &str,
    others: &[&str],
    etcd: &mut JobKeys,
) -> usize {
    only_leader_for(window, leader, true, others, etcd).await
}

/// As `one_leader_for` for a leader that is paused (SIGSTOP): it cannot answer, and until its
/// lease expires in etcd no other lighthouse may lead.
pub async fn paused_leader_kept_for(
    window: Duration,
    paused: &str,
    others: &[&str],
    etcd: &mut JobKeys,
) -> usize {
    only_leader_for(window, paused, false, others, etcd).await
}

async fn only_leader_for(
    window: Duration,
    leader: &str,
    answers: bool,
    others: &[&str],
    etcd: &mut JobKeys,
) -> usize {
    let deadline = Instant::now() + window;
    let mut samples = 0;
    loop {
        let mut asked: Vec<String> = others.iter().map(|a| a.to_string()).collect();
        if answers {
            asked.insert(0, leader.to_string());
        }
        let mut roles =
            tokio::task::spawn_blocking(move || asked.iter().map(|a| role(a)).collect::<Vec<_>>())
                .await
                .expect("a look at /status");
        let named = etcd.leader().await;
        samples += 1;
        if answers {
            let own = roles.remove(0);
            assert_eq!(
                own,
                Some("leader"),
                "sample {samples}: {leader} does not say it leads (the others: {roles:?}, \
                 etcd names {named:?})"
            );
        }
        for (other, r) in others.iter().zip(&roles) {
            assert_ne!(
                *r,
                Some("leader"),
                "sample {samples}: a second leader, {other}, beside {leader} (etcd names \
                 {named:?})"
            );
        }
        assert_eq!(
            named.as_deref(),
            Some(leader),
            "sample {samples}: etcd names another leader than {leader}"
        );
        if Instant::now() >= deadline {
            return samples;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
