//! Test harness: a real etcd server on free loopback ports with a temporary data directory,
//! started per test binary or per test, ready when etcd says so, killed on drop.
#![allow(dead_code)]

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
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Etcd {
    pub fn start() -> Etcd {
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
        };
        etcd.launch();
        etcd
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// A rendezvous URL on this server with a run id unique to the calling test.
    pub fn url(&self, run: &str, query: &str) -> String {
        format!(
            "etcd://{}/{run}-{}?{query}",
            self.endpoint(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn launch(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut child = Command::new("etcd")
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.data_dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("{}={peer}", self.name)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcd must be installed (Debian package etcd-server)");
        let stderr = child.stderr.take().unwrap();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("ready to serve client requests") {
                    let _ = ready_tx.send(());
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("etcd did not report ready within 30 s");
        self.child = Some(child);
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
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
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

/// Waits (by watch) until the round's leader key exists and returns the leader's node id.
pub fn wait_for_leader(endpoint: &str, prefix: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let opts = etcd_client::GetOptions::new().with_prefix();
        let resp = client.get(prefix, Some(opts)).await.unwrap();
        let leader_of = |kv: &etcd_client::KeyValue| {
            kv.key_str()
                .unwrap()
                .ends_with("/leader")
                .then(|| kv.value_str().unwrap().to_string())
        };
        if let Some(leader) = resp.kvs().iter().find_map(leader_of) {
            return leader;
        }
        let from = resp.header().unwrap().revision() + 1;
        let wopts = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(from);
        let mut stream = client.watch(prefix, Some(wopts)).await.unwrap();
        let wait = async {
            loop {
                let msg = stream.message().await.unwrap().unwrap();
                if let Some(leader) = msg
                    .events()
                    .iter()
                    .filter_map(|e| e.kv())
                    .find_map(leader_of)
                {
                    return leader;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("no leader appeared")
    })
}
