//! Test harness (the crate `rdzv-test-support`, shared by the tests of `rdzv-tests`, of the
//! `rdzv` command and by the `etcd-test-server` fixture): a real etcd server (`etcd::Etcd`,
//! started per test binary or per test) or a cluster of them, with what tests do to them and
//! helpers that wait on them; `rdzv-node` processes (`node`); network namespaces (`netns`); a
//! proxy that holds traffic (`slow_proxy`); test PKI and etcd over TLS (`tls`); the library's
//! log records kept in the test process (`records`); what killed runs left behind
//! (`leftovers`).

pub mod etcd;
pub mod leftovers;
pub mod netns;
pub mod node;
pub mod records;
pub mod slow_proxy;
pub mod tls;

pub use etcd::*;
pub use netns::NetNs;
pub use slow_proxy::{Hold, SlowProxy};

use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

impl Etcd {
    /// Adds a learner member (a non-voting member being added, which refuses every client
    /// request but serializable reads and Status) and starts it; ready when it says so.
    pub fn add_learner(&self) -> Learner {
        let client_port = free_port();
        let peer = format!("http://127.0.0.1:{}", free_port());
        let (rt, mut client) = etcd_client(self);
        let add = etcd_client::MemberAddOptions::new().with_is_learner();
        rt.block_on(client.member_add([peer.clone()], Some(add)))
            .expect("adding a learner member");
        let name = format!("{}-learner", self.name);
        let data_dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&data_dir);
        let extra: Vec<std::ffi::OsString> = ["--initial-cluster-state", "existing"]
            .iter()
            .map(Into::into)
            .collect();
        let (child, ready_rx) = spawn_etcd(EtcdCommand {
            program: None,
            name: &name,
            data_dir: &data_dir,
            client_urls: &format!("http://127.0.0.1:{client_port}"),
            peer_url: &peer,
            initial_cluster: &format!(
                "{}=http://127.0.0.1:{},{name}={peer}",
                self.name, self.peer_port
            ),
            extra: &extra,
        });
        let learner = Learner {
            child,
            client_port,
            data_dir,
        };
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the learner did not report ready within 30 s");
        learner
    }
}

/// A learner member of a test's etcd (`Etcd::add_learner`), killed on drop.
pub struct Learner {
    child: Child,
    client_port: u16,
    data_dir: PathBuf,
}

impl Learner {
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
}

impl Drop for Learner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Raw access to a test's etcd (for planting data and checking what a run left), with the
/// runtime its calls block on.
pub fn etcd_client(etcd: &Etcd) -> (tokio::runtime::Runtime, etcd_client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(etcd_client::Client::connect([etcd.endpoint()], None))
        .unwrap();
    (rt, client)
}

/// Runs `f` on `n` threads at once and returns their results in thread order.
pub fn on_threads<T: Send + 'static>(
    n: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || f(i))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("thread panicked"))
        .collect()
}

/// Reads the keys under `prefix` and, after every change to them (by watch), reads again,
/// until `check` returns a value; at most 30 s.
pub fn watch_until<T>(
    endpoint: &str,
    prefix: &str,
    mut check: impl FnMut(&[etcd_client::KeyValue]) -> Option<T>,
) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        // Watch first, then read: a change between the two is not missed.
        let watch = etcd_client::WatchOptions::new().with_prefix();
        let mut stream = client.watch(prefix, Some(watch)).await.unwrap();
        let wait = async {
            loop {
                let read = etcd_client::GetOptions::new().with_prefix();
                let resp = client.get(prefix, Some(read)).await.unwrap();
                if let Some(found) = check(resp.kvs()) {
                    return found;
                }
                stream.message().await.unwrap().unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("keys under {prefix} never matched"))
    })
}

/// Waits until a round's leader key exists under `prefix`; returns the leader's node id.
pub fn wait_for_leader(endpoint: &str, prefix: &str) -> String {
    watch_until(endpoint, prefix, |kvs| {
        kvs.iter()
            .find(|kv| kv.key_str().unwrap().ends_with("/leader"))
            .map(|kv| kv.value_str().unwrap().to_string())
    })
}

/// A multi-member etcd cluster on this machine: every member on its own free client and peer
/// ports with its own temporary data directory, all started together (a member reports ready
/// only once the cluster has a quorum and a leader), each killed on drop.
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    /// Addresses every member serves clients on; the first is 127.0.0.1.
    client_hosts: Vec<String>,
    /// `--initial-cluster` and `--initial-cluster-token` of every member.
    initial_cluster: String,
    tag: String,
    /// The etcd binary members start from (`None`: PATH's); `upgrade` changes it.
    program: Option<PathBuf>,
}

struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    child: Option<Child>,
}

impl EtcdCluster {
    /// `n` members serving clients on 127.0.0.1.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_on(n, &[])
    }

    /// `n` members serving clients on 127.0.0.1 and also on each of `extra_hosts` (addresses
    /// of this machine, such as the host side of a veth pair).
    pub fn start_on(n: usize, extra_hosts: &[&str]) -> EtcdCluster {
        EtcdCluster::start_from(n, extra_hosts, None)
    }

    /// `n` members of the etcd binary `program` (PATH's when `None`). A port picked free can
    /// be taken before its member binds it (by a cluster another test starts at the same
    /// moment, or an outgoing connection): a member that exits before it is ready has the
    /// whole cluster started again on other ports, 3 times in all, as `Etcd` does.
    pub fn start_from(n: usize, extra_hosts: &[&str], program: Option<PathBuf>) -> EtcdCluster {
        for attempt in 1.. {
            match EtcdCluster::try_start(n, extra_hosts, program.clone()) {
                Ok(cluster) => return cluster,
                Err(why) if attempt < 3 => {
                    eprintln!("{why}; starting the cluster again on other ports")
                }
                Err(why) => panic!("{why} (3 times)"),
            }
        }
        unreachable!()
    }

    fn try_start(
        n: usize,
        extra_hosts: &[&str],
        program: Option<PathBuf>,
    ) -> Result<EtcdCluster, String> {
        let tag = format!(
            "rdzv-cluster-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let members: Vec<EtcdMember> = (0..n)
            .map(|i| {
                let name = format!("{tag}-m{i}");
                let data_dir = std::env::temp_dir().join(&name);
                let _ = std::fs::remove_dir_all(&data_dir);
                EtcdMember {
                    name,
                    client_port: free_port(),
                    peer_port: free_port(),
                    data_dir,
                    child: None,
                }
            })
            .collect();
        let mut client_hosts = vec!["127.0.0.1".to_string()];
        client_hosts.extend(extra_hosts.iter().map(|h| h.to_string()));
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            client_hosts,
            initial_cluster,
            tag,
            program,
        };
        let ready: Vec<_> = (0..n).map(|i| cluster.launch(i)).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for (i, r) in ready.iter().enumerate() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match r.recv_timeout(left) {
                Ok(_) => {}
                // The cluster is dropped: its members killed, their data removed.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "etcd member {i} exited before it was ready (its stderr is above)"
                    ))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("etcd member {i} did not report ready within 30 s")
                }
            }
        }
        Ok(cluster)
    }

    /// Starts member `i` (on its ports and data directory); the channel receives once it is
    /// ready to serve clients.
    fn launch(&mut self, i: usize) -> mpsc::Receiver<String> {
        let member = &self.members[i];
        let clients = self
            .client_hosts
            .iter()
            .map(|h| format!("http://{h}:{}", member.client_port))
            .collect::<Vec<_>>()
            .join(",");
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        // Ignored by etcd once the data directory holds the member (a restart).
        let extra: Vec<std::ffi::OsString> = [
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            &self.tag,
        ]
        .iter()
        .map(Into::into)
        .collect();
        let (child, ready_rx) = spawn_etcd(EtcdCommand {
            program: self.program.as_deref(),
            name: &member.name,
            data_dir: &member.data_dir,
            client_urls: &clients,
            peer_url: &peer,
            initial_cluster: &self.initial_cluster,
            extra: &extra,
        });
        self.members[i].child = Some(child);
        ready_rx
    }

    /// Starts member `i` again on its data directory (after `kill`) and waits, at most 30 s,
    /// until it is ready to serve clients (it has rejoined the cluster).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.launch(i)
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!("etcd member {i} did not report ready within 30 s of a restart")
            });
    }

    /// A rolling upgrade's step: stops member `i` as an operator would (SIGTERM, at most 30 s),
    /// starts it from the binary `program` on the same data directory, and waits, at most 30 s,
    /// until it serves clients again. Members started after this use `program` too.
    pub fn upgrade(&mut self, i: usize, program: &std::path::Path) {
        if let Some(mut child) = self.members[i].child.take() {
            // SAFETY: plain syscall on a child this process has not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        self.program = Some(program.to_path_buf());
        self.launch(i)
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!("etcd member {i} did not come back within 30 s as {program:?}")
            });
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// `127.0.0.1:port` of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// Member `i`'s client endpoint on `host` (one of the hosts it was started on).
    pub fn endpoint_on(&self, host: &str, i: usize) -> String {
        assert!(
            self.client_hosts.iter().any(|h| h == host),
            "etcd does not serve on {host}"
        );
        format!("{host}:{}", self.members[i].client_port)
    }

    /// A rendezvous URL naming every member on 127.0.0.1, with a unique run id.
    pub fn url(&self, run: &str, query: &str) -> String {
        self.url_on("127.0.0.1", run, query)
    }

    /// A rendezvous URL naming every member on `host`, with a unique run id.
    pub fn url_on(&self, host: &str, run: &str, query: &str) -> String {
        let endpoints = (0..self.member_count())
            .map(|i| self.endpoint_on(host, i))
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "etcd://{endpoints}/{run}-{}?{query}",
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// SIGKILL member `i`, as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The index of the raft leader, asking every running member for its status (each within
    /// 5 s): the leader is the member whose reported leader is its own member id.
    pub fn raft_leader(&self) -> usize {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut leaders = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let endpoint = self.endpoint(i);
            let status = rt.block_on(async {
                let ask = async {
                    let mut c = etcd_client::Client::connect([endpoint.as_str()], None).await?;
                    c.status().await
                };
                tokio::time::timeout(Duration::from_secs(5), ask).await
            });
            let status = status
                .unwrap_or_else(|_| panic!("member {i} did not answer status within 5 s"))
                .unwrap_or_else(|e| panic!("member {i} status failed: {e}"));
            let own = status.header().expect("status has a header").member_id();
            if status.leader() == own {
                leaders.push(i);
            }
        }
        assert_eq!(
            leaders.len(),
            1,
            "exactly one member must be the raft leader"
        );
        leaders[0]
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
            release_port(self.members[i].client_port);
            release_port(self.members[i].peer_port);
            let _ = std::fs::remove_dir_all(&self.members[i].data_dir);
        }
    }
}

/// Waits until the number of keys under `prefix` satisfies `done`.
pub fn wait_for_key_count(endpoint: &str, prefix: &str, done: impl Fn(usize) -> bool) {
    watch_until(endpoint, prefix, |kvs| done(kvs.len()).then_some(()))
}
