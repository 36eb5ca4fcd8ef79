//! Rendezvous parameters: what to join (endpoints, run id, node counts) and how (timeouts,
//! TLS, credentials). Built from a URL or from explicit values plus `key=value` options, the
//! way torchrun's `--rdzv-*` flags and `--rdzv-conf` describe a rendezvous.
//!
//! Invariant: a `Params` that exists has passed `validate`, so the layers below never see
//! min > max, an empty run id or a malformed endpoint. The fields are private, read through
//! getters and changed only through `set` (or made by `new`/`from_url`), which validates: so
//! no way of setting an option can undo another silently (`max_nodes` follows `min_nodes` only
//! until it is given, and that is recorded where every change goes through).

mod url;

use crate::error::{Error, Result};
use std::fmt;
use std::time::Duration;

/// Backend names accepted for the etcd v3 backend.
pub const BACKEND_NAMES: &[&str] = &["etcd-v3", "etcd"];

/// Every option `set` understands, with its aliases after a `|`. Kept in one place so the
/// "unknown option" error can list them.
pub const KNOWN_OPTIONS: &[&str] = &[
    "min_nodes|min_workers",
    "max_nodes|max_workers",
    "nnodes",
    "local_addr",
    "join_timeout|timeout",
    "last_call_timeout",
    "close_timeout",
    "lease_ttl|keep_alive_ttl",
    "peer_timeout",
    "connect_timeout",
    "store_timeout",
    "retention",
    "key_prefix|etcd_prefix",
    "protocol",
    "cacert",
    "cert",
    "key",
    "username",
    "password",
];

/// Transport security and credentials for etcd.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Security {
    pub https: bool,
    pub cacert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// A validated description of one node's view of a rendezvous: made by `new` or `from_url`,
/// read through its getters, changed only by `set` (every option, by the names of
/// `KNOWN_OPTIONS`), which keeps it valid.
///
/// ```
/// use rdzv::Params;
///
/// let mut params = Params::from_url("etcd://127.0.0.1:2379/job-42?min_nodes=2").unwrap();
/// assert_eq!((params.min_nodes(), params.max_nodes()), (2, 2)); // max follows min...
/// params.set("max_nodes", "8").unwrap();
/// params.set("min_nodes", "4").unwrap();
/// assert_eq!((params.min_nodes(), params.max_nodes()), (4, 8)); // ...until it is given
/// assert!(params.set("min_nodes", "9").is_err()); // more than max_nodes: unchanged
/// assert_eq!(params.run_id(), "job-42");
/// ```
///
/// The fields are not public, so no assignment can go around `set` and be undone by it:
///
/// ```compile_fail
/// let mut params = rdzv::Params::from_url("etcd://127.0.0.1:2379/job-42").unwrap();
/// params.max_nodes = 8;
/// ```
#[derive(Clone, PartialEq)]
pub struct Params {
    backend: String,
    endpoints: Vec<String>,
    run_id: String,
    min_nodes: u32,
    max_nodes: u32,
    local_addr: Option<String>,
    join_timeout: Duration,
    last_call_timeout: Duration,
    close_timeout: Duration,
    lease_ttl: Duration,
    peer_timeout: Duration,
    connect_timeout: Duration,
    store_timeout: Duration,
    retention: Duration,
    key_prefix: String,
    security: Security,
    /// Whether `max_nodes` was given; until it is, it follows `min_nodes` (so that
    /// `min_nodes=4` alone means exactly 4 nodes rather than an error against the default 1).
    max_nodes_given: bool,
}

// Passwords and key paths stay out of logs: Debug shows only whether they are set.
impl fmt::Debug for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Params")
            .field("backend", &self.backend)
            .field("endpoints", &self.endpoints)
            .field("run_id", &self.run_id)
            .field("min_nodes", &self.min_nodes)
            .field("max_nodes", &self.max_nodes)
            .field("local_addr", &self.local_addr)
            .field("join_timeout", &self.join_timeout)
            .field("last_call_timeout", &self.last_call_timeout)
            .field("lease_ttl", &self.lease_ttl)
            .field("peer_timeout", &self.peer_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("https", &self.security.https)
            .field("client_cert", &self.security.cert.is_some())
            .field("username", &self.security.username.is_some())
            .finish_non_exhaustive()
    }
}

/// etcd refuses lease TTLs below its minimum (about 2 s at the default heartbeat).
const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// No timeout may exceed a year: larger values are almost certainly unit mistakes.
const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

impl Params {
    /// Explicit parameters, as torch's `RendezvousParameters(backend, endpoint, run_id,
    /// min_nodes, max_nodes)`. `endpoints` is a comma-separated list of `host:port`
    /// (optionally `http://` or `https://`).
    pub fn new(
        backend: &str,
        endpoints: &str,
        run_id: &str,
        min_nodes: u32,
        max_nodes: u32,
    ) -> Result<Params> {
        let mut params = Params::unchecked(backend, run_id);
        params.endpoints = parse_endpoints(endpoints)?;
        params.min_nodes = min_nodes;
        params.max_nodes = max_nodes;
        params.max_nodes_given = true;
        params.validate()?;
        Ok(params)
    }

    /// Parses `etcd://host:port[,host:port...]/RUN_ID?option=value&...`.
    pub fn from_url(url: &str) -> Result<Params> {
        url::parse(url)
    }

    fn unchecked(backend: &str, run_id: &str) -> Params {
        Params {
            backend: backend.to_string(),
            endpoints: Vec::new(),
            run_id: run_id.to_string(),
            min_nodes: 1,
            max_nodes: 1,
            local_addr: None,
            join_timeout: Duration::from_secs(600),
            last_call_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(30),
            lease_ttl: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            store_timeout: Duration::from_secs(300),
            retention: Duration::from_secs(3600),
            key_prefix: "/rdzv".to_string(),
            security: Security::default(),
            max_nodes_given: false,
        }
    }

    /// Sets one option by name (see `KNOWN_OPTIONS`), then re-validates. On error the
    /// parameters are unchanged.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let mut next = self.clone();
        next.apply(name, value)?;
        next.validate()?;
        *self = next;
        Ok(())
    }

    fn apply(&mut self, name: &str, value: &str) -> Result<()> {
        let seconds = |v: &str| parse_seconds(name, v);
        match name {
            "min_nodes" | "min_workers" => {
                self.min_nodes = parse_count(name, value)?;
                if !self.max_nodes_given {
                    self.max_nodes = self.min_nodes;
                }
            }
            "max_nodes" | "max_workers" => {
                self.max_nodes = parse_count(name, value)?;
                self.max_nodes_given = true;
            }
            "nnodes" => {
                let (min, max) = match value.split_once(':') {
                    Some((a, b)) => (parse_count(name, a)?, parse_count(name, b)?),
                    None => {
                        let n = parse_count(name, value)?;
                        (n, n)
                    }
                };
                self.min_nodes = min;
                self.max_nodes = max;
                self.max_nodes_given = true;
            }
            "local_addr" => {
                if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(Error::invalid(format!(
                        "option local_addr: expected a host name or IP address, got {}",
                        shown(value)
                    )));
                }
                // What a host name can be (and what MASTER_ADDR is read back as): refused, never
                // cut.
                if value.len() > MAX_ADDR_BYTES {
                    return Err(Error::invalid(format!(
                        "option local_addr: expected at most {MAX_ADDR_BYTES} bytes (a host name's limit), got {} bytes: {}",
                        value.len(),
                        shown(value)
                    )));
                }
                self.local_addr = Some(value.to_string());
            }
            "join_timeout" | "timeout" => self.join_timeout = seconds(value)?,
            "last_call_timeout" => self.last_call_timeout = seconds(value)?,
            "close_timeout" => self.close_timeout = seconds(value)?,
            "lease_ttl" | "keep_alive_ttl" => self.lease_ttl = seconds(value)?,
            "peer_timeout" => self.peer_timeout = seconds(value)?,
            "connect_timeout" => self.connect_timeout = seconds(value)?,
            "store_timeout" => self.store_timeout = seconds(value)?,
            "retention" => self.retention = seconds(value)?,
            "key_prefix" | "etcd_prefix" => self.key_prefix = value.to_string(),
            "protocol" => {
                self.security.https = match value.to_ascii_lowercase().as_str() {
                    "http" => false,
                    "https" => true,
                    _ => {
                        return Err(Error::invalid(format!(
                            "option protocol: expected \"http\" or \"https\", got {}",
                            shown(value)
                        )))
                    }
                }
            }
            "cacert" => self.security.cacert = Some(non_empty(name, value)?),
            "cert" => self.security.cert = Some(non_empty(name, value)?),
            "key" => self.security.key = Some(non_empty(name, value)?),
            "username" => self.security.username = Some(non_empty(name, value)?),
            "password" => self.security.password = Some(value.to_string()),
            _ => {
                return Err(Error::invalid(format!(
                    "unknown option {name:?}; known options: {}",
                    KNOWN_OPTIONS.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// Checks the relations between fields; every message names the field and what was
    /// expected.
    pub fn validate(&self) -> Result<()> {
        if !BACKEND_NAMES.contains(&self.backend.as_str()) {
            return Err(Error::invalid(format!(
                "backend: expected one of {}, got {}",
                BACKEND_NAMES.join(", "),
                shown(&self.backend)
            )));
        }
        if self.endpoints.is_empty() {
            return Err(Error::invalid("endpoint: expected at least one host:port"));
        }
        if self.run_id.is_empty() {
            return Err(Error::invalid("run_id: expected a non-empty string"));
        }
        if self.run_id.len() > 512 {
            return Err(Error::invalid("run_id: expected at most 512 bytes"));
        }
        if self.run_id.contains('\0') {
            return Err(Error::invalid(format!(
                "run_id: expected no NUL byte (C reads the run id up to it), got {}",
                shown(&self.run_id)
            )));
        }
        if self.key_prefix.contains('\0') {
            return Err(Error::invalid(format!(
                "key_prefix: expected no NUL byte, got {}",
                shown(&self.key_prefix)
            )));
        }
        if self.min_nodes < 1 {
            return Err(Error::invalid(format!(
                "min_nodes: expected at least 1, got {}",
                self.min_nodes
            )));
        }
        if self.max_nodes < self.min_nodes {
            return Err(Error::invalid(format!(
                "max_nodes: expected at least min_nodes ({}), got {}",
                self.min_nodes, self.max_nodes
            )));
        }
        if self.lease_ttl < MIN_LEASE_TTL {
            return Err(Error::invalid(format!(
                "lease_ttl: expected at least {} seconds (etcd's minimum lease), got {}",
                MIN_LEASE_TTL.as_secs(),
                self.lease_ttl.as_secs_f64()
            )));
        }
        for (name, value) in [
            ("join_timeout", self.join_timeout),
            ("connect_timeout", self.connect_timeout),
            ("close_timeout", self.close_timeout),
            ("retention", self.retention),
        ] {
            if value.is_zero() {
                return Err(Error::invalid(format!(
                    "{name}: expected more than 0 seconds"
                )));
            }
        }
        if !self.key_prefix.starts_with('/') {
            return Err(Error::invalid(format!(
                "key_prefix: expected a path starting with '/', got {}",
                shown(&self.key_prefix)
            )));
        }
        let tls_files = [
            &self.security.cacert,
            &self.security.cert,
            &self.security.key,
        ];
        if tls_files.iter().any(|f| f.is_some()) && !self.security.https {
            return Err(Error::invalid(
                "cacert/cert/key: TLS files given but protocol is http; set protocol=https",
            ));
        }
        if self.security.cert.is_some() != self.security.key.is_some() {
            return Err(Error::invalid(
                "cert/key: a client certificate needs both cert and key",
            ));
        }
        if self.security.password.is_some() && self.security.username.is_none() {
            return Err(Error::invalid("password: given without username"));
        }
        Ok(())
    }

    /// The address rank 0 publishes as MASTER_ADDR: `local_addr`, else the host name.
    pub fn advertised_addr(&self) -> String {
        self.local_addr.clone().unwrap_or_else(hostname)
    }

    /// The backend name (`etcd-v3` or `etcd`).
    pub fn backend(&self) -> &str {
        &self.backend
    }
    /// etcd's endpoints, `host:port` (with `http://` or `https://` when given so).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
    /// These parameters for run `run_id` instead (`Admin::for_run`).
    pub(crate) fn with_run_id(&self, run_id: &str) -> Result<Params> {
        let mut params = self.clone();
        params.run_id = run_id.to_string();
        params.validate()?;
        Ok(params)
    }

    /// The run id: every node of one job uses the same.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
    /// The fewest nodes a round forms with (`min_nodes`).
    pub fn min_nodes(&self) -> u32 {
        self.min_nodes
    }
    /// The most nodes a round takes (`max_nodes`; `min_nodes` unless given).
    pub fn max_nodes(&self) -> u32 {
        self.max_nodes
    }
    /// The `local_addr` option: what rank 0 publishes as MASTER_ADDR, if given.
    pub fn local_addr(&self) -> Option<&str> {
        self.local_addr.as_deref()
    }
    /// How long `next` may block (`join_timeout`).
    pub fn join_timeout(&self) -> Duration {
        self.join_timeout
    }
    /// How long a round waits for more nodes once `min_nodes` have joined.
    pub fn last_call_timeout(&self) -> Duration {
        self.last_call_timeout
    }
    /// The bound on `set_closed` and `shutdown`.
    pub fn close_timeout(&self) -> Duration {
        self.close_timeout
    }
    /// A node cut off from etcd is dropped after this (`lease_ttl`); one whose processes are
    /// all gone, or that no peer can reach, sooner (`peer_timeout`).
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }
    /// How long a member of a round may go unreachable by its peer before it is suspected
    /// (`peer_timeout`, 1 s by default; 0 turns peer watching off, leaving `lease_ttl`). A
    /// member whose processes are gone is suspected at the next probe. A suspect that still
    /// reaches etcd answers and keeps its place; one that does not is evicted (its lease is
    /// revoked) half a second later.
    pub fn peer_timeout(&self) -> Duration {
        self.peer_timeout
    }
    /// etcd must answer within this (`connect_timeout`).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// The default timeout of the store's waits (`store_timeout`).
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }
    /// How long a closed run's marker stays in etcd (`retention`).
    pub fn retention(&self) -> Duration {
        self.retention
    }
    /// Where runs live in etcd (`key_prefix`).
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }
    /// TLS and credentials.
    pub fn security(&self) -> &Security {
        &self.security
    }
}

fn non_empty(name: &str, value: &str) -> Result<String> {
    if value.is_empty() {
        return Err(Error::invalid(format!(
            "option {name}: expected a non-empty value"
        )));
    }
    Ok(value.to_string())
}

/// The longest `local_addr`: a DNS name's limit (RFC 1035), and what rank 0 can publish whole.
pub(crate) const MAX_ADDR_BYTES: usize = 253;

/// A value as an error message shows it: quoted, and cut after 80 characters (with its length),
/// so that a megabyte of bad input does not make a megabyte of message.
pub(crate) fn shown(value: &str) -> String {
    const SHOWN: usize = 80;
    match value.char_indices().nth(SHOWN) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &value[..cut], value.len()),
    }
}

/// Strict unsigned integer: digits only, no sign, no spaces.
pub(crate) fn parse_count(name: &str, value: &str) -> Result<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::invalid(format!(
            "{name}: expected a whole number, got {}",
            shown(value)
        )));
    }
    value.parse::<u32>().map_err(|_| {
        Error::invalid(format!(
            "{name}: expected a whole number below 2^32, got {}",
            shown(value)
        ))
    })
}

/// Seconds as a plain non-negative decimal number (`30`, `0.5`).
pub(crate) fn parse_seconds(name: &str, value: &str) -> Result<Duration> {
    let plain = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && value.bytes().filter(|&b| b == b'.').count() <= 1
        && value != ".";
    let secs = if plain {
        value.parse::<f64>().ok()
    } else {
        None
    };
    // try_from: a 40-digit number must be an error, not a panic.
    match secs.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        Some(d) if d <= MAX_TIMEOUT => Ok(d),
        _ => Err(Error::invalid(format!(
            "option {name}: expected a number of seconds between 0 and {} (e.g. 30 or 0.5), got {}",
            MAX_TIMEOUT.as_secs(),
            shown(value)
        ))),
    }
}

/// Splits and checks `host:port[,host:port]`, keeping an explicit `http://`/`https://`.
pub(crate) fn parse_endpoints(list: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for raw in list.split(',') {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(Error::invalid(format!(
                "endpoint: expected host:port[,host:port...], got {}",
                shown(list)
            )));
        }
        let rest = raw
            .strip_prefix("http://")
            .or_else(|| raw.strip_prefix("https://"))
            .unwrap_or(raw);
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            match v6.split_once(']') {
                Some((h, tail)) if tail.is_empty() || tail.starts_with(':') => {
                    (&rest[..h.len() + 2], tail.strip_prefix(':'))
                }
                _ => {
                    return Err(Error::invalid(format!(
                        "endpoint {}: expected [ipv6]:port",
                        shown(raw)
                    )))
                }
            }
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        if host.is_empty() || host.contains('/') || host.chars().any(char::is_whitespace) {
            return Err(Error::invalid(format!(
                "endpoint {}: expected host:port",
                shown(raw)
            )));
        }
        let port = match port {
            None => 2379,
            Some(p) => match p.parse::<u32>() {
                Ok(n) if (1..=65535).contains(&n) && p.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => {
                    return Err(Error::invalid(format!(
                        "endpoint {}: port must be a number from 1 to 65535, got {}",
                        shown(raw),
                        shown(p)
                    )))
                }
            },
        };
        let scheme = if raw.starts_with("https://") {
            "https://"
        } else if raw.starts_with("http://") {
            "http://"
        } else {
            ""
        };
        out.push(format!("{scheme}{host}:{port}"));
    }
    Ok(out)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests;
