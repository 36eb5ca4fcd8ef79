//! Test harness: a real etcd server on free loopback ports with a temporary data directory,
//! started per test binary or per test, ready when etcd says so, killed on drop.
#![allow(dead_code)]

pub mod launch;
pub mod leftovers;
pub mod netns;
pub mod node;

#[allow(unused_imports)]
pub use netns::NetNs;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

pub struct Etcd {
    child: Option<Child>,
    pub client_port: u16,
    peer_port: u16,
    pub data_dir: PathBuf,
    name: String,
    /// More flags for etcd (`Etcd::start_with`), kept for a restart.
    flags: Vec<std::ffi::OsString>,
}

/// A port for a test's etcd, free a moment ago. Outside the kernel's ephemeral range, as
/// rdzv's MASTER_PORT: a port from `bind(0)` can be taken by any outgoing connection on the
/// machine before etcd binds it (a member of a test cluster once exited for that, beside
/// another test run).
pub fn free_port() -> u16 {
    rdzv::free_master_port()
}

/// One etcd member's command line. `client_urls` may list several URLs (comma-separated).
pub struct EtcdCommand<'a> {
    pub name: &'a str,
    pub data_dir: &'a std::path::Path,
    pub client_urls: &'a str,
    pub peer_url: &'a str,
    pub initial_cluster: &'a str,
    pub extra: &'a [std::ffi::OsString],
}

/// The server version in one of etcd's startup log lines: `etcd Version: 3.4.23` (3.4) or
/// `"etcd-version":"3.7.3"` (3.5 and later, JSON).
fn version_in_log(line: &str) -> Option<&str> {
    let (_, rest) = line
        .split_once("etcd Version: ")
        .or_else(|| line.split_once("\"etcd-version\":\""))?;
    rest.split(|c: char| c == '"' || c.is_whitespace()).next()
}

/// Starts etcd (the first `etcd` on PATH) and returns it with a channel that receives once etcd
/// says it is ready to serve clients (its own log line, not a guessed delay). Says on stderr
/// which etcd version became ready where (shown with a failing test's output).
pub fn spawn_etcd(cmd: EtcdCommand<'_>) -> (Child, mpsc::Receiver<()>) {
    leftovers::remove_data_dirs_of_dead_processes();
    let mut etcd = Command::new("etcd");
    etcd.args(["--name", cmd.name, "--data-dir"])
        .arg(cmd.data_dir)
        .args(["--listen-client-urls", cmd.client_urls])
        .args(["--advertise-client-urls", cmd.client_urls])
        .args(["--listen-peer-urls", cmd.peer_url])
        .args(["--initial-advertise-peer-urls", cmd.peer_url])
        .args(["--initial-cluster", cmd.initial_cluster])
        .args(cmd.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = spawn(etcd).expect("etcd must be installed (Debian package etcd-server)");
    let stderr = child.stderr.take().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let urls = cmd.client_urls.to_string();
    std::thread::spawn(move || {
        let mut version = None;
        let mut ready = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if version.is_none() {
                version = version_in_log(&line).map(str::to_string);
            }
            if !ready && line.contains("ready to serve client requests") {
                ready = true;
                let version = version.as_deref().unwrap_or("(version not logged)");
                eprintln!("etcd {version} ready at {urls}");
                let _ = ready_tx.send(());
            }
        }
    });
    (child, ready_rx)
}

/// Starts `command` as a child that dies with this test process, however the process ends
/// (a failed assertion, a watchdog, SIGKILL): no etcd or node outlives its test. And with
/// SIGINT, SIGTERM, SIGHUP and SIGQUIT at their defaults, whatever the test runner inherited
/// (a background job ignores SIGINT), so a test's signals do what it expects.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, and test threads end
/// with their test: children are forked by one thread that lives as long as the process.
pub fn spawn(mut command: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::{Mutex, OnceLock};
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let test_process = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec, only async-signal-safe calls (prctl, signal, getppid,
    // _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_DFL);
            }
            // The test process died before prctl took effect: nothing would kill this child.
            if libc::getppid() != test_process {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("a thread to spawn children from");
        Mutex::new(tx)
    });
    let (reply, child) = mpsc::channel();
    spawner
        .lock()
        .unwrap()
        .send((command, reply))
        .expect("the spawner thread lives as long as the process");
    child.recv().expect("the spawner thread answers")
}

/// `spawn` at the end of a builder chain: `Command::new(x).arg(y).spawn_tied()`.
pub trait SpawnTied {
    fn spawn_tied(&mut self) -> std::io::Result<Child>;
}

impl SpawnTied for Command {
    fn spawn_tied(&mut self) -> std::io::Result<Child> {
        spawn(std::mem::replace(self, Command::new("")))
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_with(&[])
    }

    /// Starts etcd with more flags, such as `--quota-backend-bytes=16777216`.
    pub fn start_with(flags: &[&str]) -> Etcd {
        let name = format!(
            "rdzv-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let data_dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut etcd = Etcd {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            data_dir,
            name,
            flags: flags.iter().map(Into::into).collect(),
        };
        etcd.launch_on_free_ports();
        etcd
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The etcd process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("etcd is running").id()
    }

    /// One value of etcd's Prometheus metrics (served on the client URL), e.g.
    /// `etcd_debugging_mvcc_events_total` (watch events sent) or `..._watcher_total`.
    pub fn metric(&self, name: &str) -> i64 {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(self.endpoint()).expect("etcd metrics");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).expect("etcd metrics");
        body.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("etcd reports no metric {name}")) as i64
    }

    /// A rendezvous URL on this server with a run id unique to the calling test.
    pub fn url(&self, run: &str, query: &str) -> String {
        format!(
            "etcd://{}/{run}-{}?{query}",
            self.endpoint(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Starts etcd on fresh ports, again if it exits before it is ready: a port picked free can
    /// be taken (by another test's server or an outgoing connection) before etcd binds it.
    fn launch_on_free_ports(&mut self) {
        for attempt in 1.. {
            match self.try_launch() {
                Ok(()) => return,
                Err(why) if attempt < 3 => {
                    eprintln!("{why}; starting it again on other ports");
                    self.client_port = free_port();
                    self.peer_port = free_port();
                    let _ = std::fs::remove_dir_all(&self.data_dir);
                }
                Err(why) => panic!("{why} (3 times)"),
            }
        }
    }

    fn launch(&mut self) {
        if let Err(why) = self.try_launch() {
            panic!("{why}");
        }
    }

    fn try_launch(&mut self) -> Result<(), String> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let (child, ready_rx) = spawn_etcd(EtcdCommand {
            name: &self.name,
            data_dir: &self.data_dir,
            client_urls: &client,
            peer_url: &peer,
            initial_cluster: &format!("{}={peer}", self.name),
            extra: &self.flags,
        });
        self.child = Some(child);
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(()) => Ok(()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.kill();
                Err(format!("etcd exited before it was ready on {client}"))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("etcd did not report ready within 30 s")
            }
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Sends `signal` to the etcd process (SIGSTOP freezes it: requests hang, as with a server
    /// that stopped answering; SIGCONT resumes it).
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("etcd is running");
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

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
        };
        let ready: Vec<_> = (0..n).map(|i| cluster.launch(i)).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for (i, r) in ready.iter().enumerate() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match r.recv_timeout(left) {
                Ok(()) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("etcd member {i} exited before it was ready (its stderr is above)")
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("etcd member {i} did not report ready within 30 s")
                }
            }
        }
        cluster
    }

    /// Starts member `i` (on its ports and data directory); the channel receives once it is
    /// ready to serve clients.
    fn launch(&mut self, i: usize) -> mpsc::Receiver<()> {
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
            let _ = std::fs::remove_dir_all(&self.members[i].data_dir);
        }
    }
}

/// Waits until the number of keys under `prefix` satisfies `done`.
pub fn wait_for_key_count(endpoint: &str, prefix: &str, done: impl Fn(usize) -> bool) {
    watch_until(endpoint, prefix, |kvs| done(kvs.len()).then_some(()))
}
