//! Network namespaces for partition tests. A test process killed by SIGKILL runs no destructor,
//! so its namespaces and veth pairs outlive it, holding their /30s. One CI run failed for that:
//! 7 of its 8 chaos nodes were given /30s still routed to such leftovers, so etcd's answers
//! never reached them. Creating a namespace therefore first removes what dead test processes
//! left, then takes a /30 that no interface on the machine holds, all under one lock shared by
//! every test process.

use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

use super::leftovers::process_alive;

/// Names carry the creating process's pid, so leftovers of dead processes can be told apart:
/// `rdzv-{pid}-{seq}` for a namespace, `rz{pid}h{seq}` and `rz{pid}n{seq}` for its veth ends.
const NS_PREFIX: &str = "rdzv-";
const VETH_PREFIX: &str = "rz";
/// 10.213.0.0/16 split into /30s.
const BLOCKS: u32 = 16384;

/// A network namespace joined to this one by a veth pair with a private /30: the host side
/// is `host_addr`, the namespace side `ns_addr`. Traffic never leaves the machine. The link can
/// be cut (`cut`) to partition whatever runs inside. Removed on drop, even after a failure.
pub struct NetNs {
    pub name: String,
    host_veth: String,
    ns_veth: String,
    pub host_addr: String,
    pub ns_addr: String,
    created_ns: bool,
    created_veth: bool,
}

fn ip(args: &[&str]) -> Result<(), String> {
    ip_output(args).map(drop)
}

fn ip_output(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Held while a namespace is created: no two test processes pick the same /30, and none
/// removes what another is still setting up. The file is never read: its open descriptor is
/// the lock, let go when it is dropped.
struct CreateLock(#[allow(dead_code)] std::fs::File);

impl CreateLock {
    fn take() -> Result<CreateLock, String> {
        let path = std::env::temp_dir().join("rdzv-test-netns.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor this File owns; released when it is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "cannot lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(CreateLock(file))
    }
}

/// The pid in a name made by `NetNs::create`.
fn creator_pid(name: &str) -> Option<u32> {
    if let Some(rest) = name.strip_prefix(NS_PREFIX) {
        let (pid, seq) = rest.split_once('-')?;
        seq.parse::<u32>().ok()?;
        return pid.parse().ok();
    }
    let rest = name.strip_prefix(VETH_PREFIX)?;
    let (pid, seq) = rest.split_once(['h', 'n'])?;
    seq.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// Removes the namespaces and veth ends whose creating process is gone. Deleting a namespace
/// deletes the veth end inside it, and with it the pair.
fn remove_leftovers() {
    let dead = |name: &str| creator_pid(name).is_some_and(|pid| !process_alive(pid));
    for line in ip_output(&["netns", "list"]).unwrap_or_default().lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(NS_PREFIX) && dead(name) {
            let _ = ip(&["netns", "del", name]);
        }
    }
    // A pair whose namespace end was never moved (the process died in between) is left.
    for line in ip_output(&["-o", "link", "show"])
        .unwrap_or_default()
        .lines()
    {
        // "7: rz123h0@rz123n0: <...>"
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        if name.starts_with(VETH_PREFIX) && dead(name) {
            let _ = ip(&["link", "del", name]);
        }
    }
}

/// The IPv4 addresses on this machine's interfaces. A /30 holding none of them is free: a
/// broader network around it (10.0.0.0/8 on the machine's own link) loses to the /30's more
/// specific route.
fn addresses_in_use() -> Result<Vec<u32>, String> {
    let text = ip_output(&["-4", "-o", "addr", "show"])?;
    let mut addresses = Vec::new();
    for line in text.lines() {
        // "2: eth0    inet 192.0.2.2/24 brd ..."
        let mut words = line.split_whitespace();
        if words.by_ref().any(|w| w == "inet") {
            let address = words.next().and_then(|c| c.split('/').next());
            if let Some(Ok(address)) = address.map(str::parse::<std::net::Ipv4Addr>) {
                addresses.push(u32::from(address));
            }
        }
    }
    Ok(addresses)
}

/// The /30 `block` of 10.213.0.0/16: its network address.
pub fn block_network(block: u32) -> u32 {
    u32::from(std::net::Ipv4Addr::new(10, 213, 0, 0)) + block * 4
}

/// The first /30 from `start` on (wrapping) that holds none of `in_use`.
fn free_block(start: u32, in_use: &[u32]) -> Option<u32> {
    (0..BLOCKS)
        .map(|i| (start + i) % BLOCKS)
        .find(|&b| !in_use.iter().any(|&a| a & !3 == block_network(b)))
}

impl NetNs {
    /// Creates the namespace and veth pair, or says why it could not (no root, no netns
    /// support in this sandbox). Names carry the pid; the /30 is the first free one from a
    /// start derived from the pid, so concurrent runs rarely even look at the same one.
    pub fn create() -> Result<NetNs, String> {
        let hint = super::SEQ.load(Ordering::Relaxed);
        NetNs::create_from(std::process::id().wrapping_mul(7).wrapping_add(hint))
    }

    /// `create`, with the search for a free /30 starting at block `start` of 10.213.0.0/16.
    pub fn create_from(start: u32) -> Result<NetNs, String> {
        let seq = super::SEQ.fetch_add(1, Ordering::Relaxed);
        let _lock = CreateLock::take()?;
        remove_leftovers();
        let block = free_block(start % BLOCKS, &addresses_in_use()?)
            .ok_or("no free /30 left in 10.213.0.0/16")?;
        let host = std::net::Ipv4Addr::from(block_network(block) + 1);
        let guest = std::net::Ipv4Addr::from(block_network(block) + 2);
        let pid = std::process::id();
        let mut ns = NetNs {
            name: format!("{NS_PREFIX}{pid}-{seq}"),
            // Interface names are limited to 15 bytes.
            host_veth: format!("{VETH_PREFIX}{}h{seq}", pid % 10_000_000),
            ns_veth: format!("{VETH_PREFIX}{}n{seq}", pid % 10_000_000),
            host_addr: host.to_string(),
            ns_addr: guest.to_string(),
            created_ns: false,
            created_veth: false,
        };
        let ns_veth = ns.ns_veth.clone();
        ip(&["netns", "add", &ns.name])?;
        ns.created_ns = true;
        ip(&[
            "link",
            "add",
            &ns.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &ns_veth,
        ])?;
        ns.created_veth = true;
        ip(&["link", "set", &ns_veth, "netns", &ns.name])?;
        let host_cidr = format!("{}/30", ns.host_addr);
        let ns_cidr = format!("{}/30", ns.ns_addr);
        ip(&["addr", "add", &host_cidr, "dev", &ns.host_veth])?;
        ip(&["link", "set", &ns.host_veth, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns.name.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", &ns_cidr, "dev", &ns_veth])?;
        inside(&["link", "set", &ns_veth, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Cuts the namespace off: the host side of the veth goes down, so nothing passes either
    /// way (no resets, no errors: packets are simply not delivered).
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_veth, "down"]).expect("cannot cut the veth link");
    }

    /// Cuts the namespace off as a pulled cable or a dead machine does: the namespace's end of
    /// the veth goes down, and the host keeps its route there (its end has only lost the
    /// carrier), so what the host sends to the namespace is lost without a reset or an error.
    /// (After `cut`, the host has no route to the namespace: a connection to it may be refused
    /// by whatever the host's default route leads to.)
    pub fn pull_cable(&self) {
        ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "link",
            "set",
            &self.ns_veth,
            "down",
        ])
        .expect("cannot take the namespace's end of the veth down");
    }

    /// Undoes `cut`: the link comes back up, and connections that were cut off carry on.
    pub fn heal(&self) {
        ip(&["link", "set", &self.host_veth, "up"]).expect("cannot bring the veth link up");
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.created_veth {
            // Deleting one end deletes the pair (the other end may already be gone with the
            // namespace).
            let _ = ip(&["link", "del", &self.host_veth]);
        }
        if self.created_ns {
            let _ = ip(&["netns", "del", &self.name]);
        }
    }
}
