//! `--rdzv-backend=c10d` without a store service: as torchrun's c10d backend makes the node
//! its endpoint names host a TCPStore, the launcher on that node serves the rendezvous itself
//! from an embedded single-member etcd (the `etcd` binary found on PATH), and every node,
//! that one too, runs the ordinary etcd-v3 rendezvous against it.
//!
//! Invariants:
//! - the etcd is a child of the launcher, started from the main thread with
//!   PR_SET_PDEATHSIG=SIGKILL, so it never outlives the launcher, even a SIGKILLed one; its
//!   data lives in a temporary directory removed when it stops;
//! - "this node" means: the endpoint's host resolves to an address this machine can bind;
//! - when the port is already served on this machine (another launcher of the job on the same
//!   host got there first), this launcher is a client like any other node. Two launchers that
//!   start at the same moment may both try: the loser's etcd exits on the taken port, and it
//!   is a client too.
//!
//! The trade, as with torchrun's c10d: the serving node is a single point of failure (when it
//! goes, the rendezvous goes), where an etcd cluster of three members survives any one.

use crate::output::say;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// An etcd this launcher serves; stopped (SIGTERM, then SIGKILL) and its data removed on drop.
pub struct EmbeddedEtcd {
    child: Child,
    dir: PathBuf,
    /// The client port it serves.
    port: u16,
}

/// Starts the embedded etcd if `endpoint` (HOST:PORT) names this machine (or torch's
/// `is_host` says so: `Some(true)` serves, `Some(false)` never does, whatever the address; a
/// Kubernetes Service name resolves to no address of the pod behind it) and nothing serves
/// the port yet. `Ok(None)`: another node (or launcher) serves it. `Err`: one line saying what
/// to do instead.
pub fn serve_if_here(
    endpoint: &str,
    is_host: Option<bool>,
) -> Result<Option<EmbeddedEtcd>, String> {
    let host_port = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/');
    let Some((host, port)) = host_port
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
    else {
        return Err(format!(
            "--rdzv-endpoint={endpoint}: expected HOST:PORT for --rdzv-backend=c10d"
        ));
    };
    if is_host == Some(false) {
        return Ok(None);
    }
    if is_host.is_none() {
        let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(format!(
                    "--rdzv-endpoint={endpoint}: cannot resolve {host:?}: {e}"
                ))
            }
        };
        // The endpoint names this machine when one of its addresses can be bound here.
        let local = addrs
            .iter()
            .any(|a| TcpListener::bind(SocketAddr::new(a.ip(), 0)).is_ok());
        if !local {
            return Ok(None);
        }
    }
    // Served already on this machine: be a client.
    let any = SocketAddr::from(([0, 0, 0, 0], port));
    match TcpListener::bind(any) {
        Ok(probe) => drop(probe),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            say(format_args!(
                "--rdzv-backend=c10d: port {port} is served on this machine already; joining it"
            ));
            return Ok(None);
        }
        Err(e) => {
            return Err(format!(
                "--rdzv-backend=c10d: cannot listen on port {port}: {e}"
            ))
        }
    }
    let Some(etcd) = find_etcd() else {
        return Err(format!(
            "--rdzv-backend=c10d: this node ({host}) would serve the rendezvous, but no `etcd` \
             is beside this command or on PATH: `pip install \"rdzv[etcd]\"` (or install etcd \
             3.4 or later), or run `etcd --listen-client-urls \
             http://0.0.0.0:{port} --advertise-client-urls http://{host}:{port}` and use \
             --rdzv-backend=etcd-v3 --rdzv-endpoint={host}:{port}"
        ));
    };
    let dir = std::env::temp_dir().join(format!(
        "rdzv-c10d-etcd-{}-{:08x}",
        std::process::id(),
        crate::host::random_u64() as u32
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let peer_port = TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port for etcd's peer URL: {e}"))?;
    let log = std::fs::File::create(dir.join("etcd.log"))
        .map_err(|e| format!("cannot create etcd's log: {e}"))?;
    let advertise = match host.contains(':') {
        true => format!("http://[{host}]:{port}"),
        false => format!("http://{host}:{port}"),
    };
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(&etcd);
    cmd.arg("--name=rdzv-c10d")
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--listen-client-urls=http://0.0.0.0:{port}"))
        .arg(format!("--advertise-client-urls={advertise}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=rdzv-c10d={peer}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
    crate::workers::process::dies_with_launcher(&mut cmd);
    let child = cmd.spawn().map_err(|e| {
        let _ = std::fs::remove_dir_all(&dir);
        format!("--rdzv-backend=c10d: cannot start {}: {e}", etcd.display())
    })?;
    say(format_args!(
        "--rdzv-backend=c10d: serving the rendezvous on port {port} from an embedded etcd \
         ({}, pid {}); it stops with this launcher",
        etcd.display(),
        child.id()
    ));
    Ok(Some(EmbeddedEtcd { child, dir, port }))
}

impl EmbeddedEtcd {
    /// Whether this etcd still serves: one that lost the port to another launcher's (both
    /// started at the same moment) has exited, and its launcher was a client all along.
    pub fn serves(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for EmbeddedEtcd {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: plain syscall on a child this launcher has not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        // Waits for its exit by pidfd, 5 s at most, then SIGKILL.
        // SAFETY: plain syscalls on a child this launcher has not reaped.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd >= 0 {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            unsafe { libc::poll(&mut p, 1, 5000) };
            unsafe { libc::close(fd) };
        }
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The etcd to serve with: the one beside this command first (the `rdzv[etcd]` extra installs
/// one into the same environment's bin directory, which need not be on PATH), else PATH's.
fn find_etcd() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.to_path_buf()));
    crate::host::executable_in("etcd", beside.into_iter().chain(crate::host::path_dirs()))
}

/// How often the connections of the other nodes are counted while lingering: nothing tells
/// when a remote process closes its connection.
const CONNECTIONS_RECOUNT: std::time::Duration = std::time::Duration::from_millis(100);

impl EmbeddedEtcd {
    /// Keeps this etcd serving, after this node has left, until the other nodes are done with
    /// it, or `bound` passes: they learn there how the job ended (closed, failed) and release
    /// their nodes, which they cannot do once it is gone (each would retry it until its
    /// `close_timeout`). Done means no connection to this etcd is left but this launcher's own
    /// and etcd's: another launcher's connections close only when it exits, after its last
    /// request (a node's `alive` key goes first in its shutdown, and the last node out then
    /// cleans up the run, so the run's keys alone cannot tell). An operator's open connection
    /// (`rdzv status --watch`) keeps it to the bound.
    pub async fn linger(&self, bound: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        let (port, etcd_pid) = (self.port, self.child.id());
        let mut said = false;
        loop {
            let others = other_clients(port, etcd_pid);
            if others == 0 || tokio::time::Instant::now() >= deadline {
                return;
            }
            if !std::mem::replace(&mut said, true) {
                say(format_args!(
                    "--rdzv-backend=c10d: keeping the rendezvous served until the other nodes' {others} connection(s) have closed (up to {:.0} s)",
                    bound.as_secs_f64()
                ));
            }
            tokio::time::sleep(CONNECTIONS_RECOUNT).await;
        }
    }
}

/// Connections to this machine's TCP `port` (the embedded etcd's clients) that come neither
/// from this process nor from etcd itself (`etcd_pid`: its gRPC gateway keeps a connection to
/// its own client port), from the kernel's tables (`/proc/net/tcp`, `tcp6`). 0 when they cannot
/// be read.
fn other_clients(port: u16, etcd_pid: u32) -> usize {
    const ESTABLISHED: &str = "01";
    // The sockets of this process and of etcd, by inode.
    let fds = ["/proc/self/fd".to_string(), format!("/proc/{etcd_pid}/fd")];
    let ours: std::collections::HashSet<String> = fds
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    // An address as /proc/net/tcp writes it: an IPv4-mapped one of tcp6 (a dual-stack listener's
    // connections from IPv4 clients) as the IPv4 one tcp shows for the client's end.
    let normal = |addr: &str| -> String {
        match addr.strip_prefix("0000000000000000FFFF0000") {
            Some(v4) if v4.len() == 13 => v4.to_string(),
            _ => addr.to_string(),
        }
    };
    // (local, remote, state, inode) of every TCP socket.
    let sockets: Vec<(String, String, String, String)> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    Some((
                        normal(f.get(1)?),
                        normal(f.get(2)?),
                        f.get(3)?.to_string(),
                        f.get(9)?.to_string(),
                    ))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let port_of = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    // Their own connections to the port, by their local end.
    let our_ends: std::collections::HashSet<&str> = sockets
        .iter()
        .filter(|(_, remote, _, inode)| port_of(remote) == Some(port) && ours.contains(inode))
        .map(|(local, ..)| local.as_str())
        .collect();
    sockets
        .iter()
        .filter(|(local, remote, state, _)| {
            port_of(local) == Some(port)
                && state == ESTABLISHED
                && !our_ends.contains(remote.as_str())
        })
        .count()
}
