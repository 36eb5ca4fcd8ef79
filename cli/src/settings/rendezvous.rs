//! Where the rendezvous happens, from torchrun's rendezvous flags: on etcd (with its
//! parameters, `--rdzv-conf` included, and what `--rdzv-backend=c10d` serves), or nowhere (a
//! fixed layout: `--standalone`, or torchrun's static backend). torch's own c10d `--rdzv-conf`
//! keys are taken as torchrun takes them (`TorchConf`).

use crate::args::run::RunArgs;
use crate::args::values::Backend;
use crate::exit::{usage, Usage};
use rdzv::Params;

/// Where the rendezvous happens.
#[derive(Debug, Clone)]
pub enum Venue {
    /// On etcd, with these parameters.
    Etcd(Box<Params>),
    /// No etcd: a fixed layout (`--standalone`, or torchrun's static backend).
    Static(StaticRound),
}

/// The one round of a job without a rendezvous: this node's place and rank 0's address.
#[derive(Debug, Clone)]
pub struct StaticRound {
    pub node_rank: u32,
    pub nnodes: u32,
    pub master_addr: String,
    /// `None`: a free port of this machine, picked anew for each group.
    pub master_port: Option<u16>,
    /// One node on this machine (`--standalone`, or no rendezvous flags at all).
    pub standalone: bool,
}

impl StaticRound {
    fn standalone() -> StaticRound {
        StaticRound {
            node_rank: 0,
            nnodes: 1,
            master_addr: "localhost".into(),
            master_port: None,
            standalone: true,
        }
    }
}

/// `--rdzv-backend=c10d`: the endpoint (HOST:PORT) an embedded etcd serves when this node is
/// the one it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct C10d {
    pub endpoint: String,
    /// torch's `is_host` (`--rdzv-conf`): this node serves it (true) or never does (false),
    /// whatever the endpoint's address; unset, the address decides.
    pub is_host: Option<bool>,
}

/// The rendezvous the flags ask for, and the c10d endpoint to serve if any. Notes on accepted
/// aliases and defaults taken go to `notes`.
pub fn from_args(a: &RunArgs, notes: &mut Vec<String>) -> Result<(Venue, Option<C10d>), Usage> {
    let max_nodes = a.nnodes.max;
    let endpoint = a.rdzv_flags.rdzv_endpoint.as_deref();
    let static_flags = a.node_rank.is_some() || a.master_addr.is_some() || a.master_port.is_some();
    let fixed = match (&a.rdzv, endpoint, a.standalone) {
        (_, _, true) => {
            if max_nodes > 1 {
                return Err(usage(format!(
                    "--standalone: runs one node, but --nnodes={} asks for up to {max_nodes}",
                    a.nnodes.given
                )));
            }
            StaticRound::standalone()
        }
        (None, endpoint, false)
            if a.rdzv_backend == Backend::Static || (endpoint.is_none() && static_flags) =>
        {
            static_round(a, endpoint)?
        }
        (None, None, false) if max_nodes == 1 => {
            // torchrun without rendezvous flags runs a single node too.
            notes.push(
                "no --rdzv-endpoint: running one node on this machine (as --standalone)".into(),
            );
            StaticRound::standalone()
        }
        (None, None, false) => {
            return Err(usage(format!(
                "--rdzv-endpoint: required for --nnodes={} (or give --rdzv URL, --standalone for \
                 one node, or --node-rank/--master-addr/--master-port for a static job)",
                a.nnodes.given
            )))
        }
        (None, Some(endpoint), false)
            if a.rdzv_backend == Backend::C10d && endpoint.ends_with(":0") =>
        {
            // torch's c10d on port 0 (what its --standalone is made of, and a programmatic
            // launch's usual single-node form): a store on a port of this machine picked at
            // start, which no other node could find.
            if max_nodes > 1 {
                return Err(usage(format!(
                    "--rdzv-endpoint={endpoint}: port 0 is picked when the job starts, so other                      nodes cannot find it; give a port for --nnodes={} (or run one node)",
                    a.nnodes.given
                )));
            }
            StaticRound::standalone()
        }
        (url, endpoint, false) => return on_etcd(a, url.as_deref(), endpoint, notes),
    };
    Ok((Venue::Static(fixed), None))
}

/// The etcd rendezvous: from `--rdzv` or `--rdzv-endpoint`/`--rdzv-id`, then `--rdzv-conf`
/// (torch's keys taken apart), `--local-addr`, and c10d's endpoint.
fn on_etcd(
    a: &RunArgs,
    url: Option<&str>,
    endpoint: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<(Venue, Option<C10d>), Usage> {
    let (min_nodes, max_nodes) = (a.nnodes.min, a.nnodes.max);
    match a.rdzv_backend {
        Backend::EtcdV3 | Backend::C10d => {}
        Backend::EtcdAlias(name) => notes.push(format!(
            "--rdzv-backend={name}: rdzv speaks etcd's v3 API (etcd 3.4 and later); using etcd-v3"
        )),
        Backend::Static => {
            return Err(usage(
                "--rdzv-backend=static: give --rdzv-endpoint=HOST:PORT or --master-addr/--master-port, not --rdzv",
            ))
        }
    }
    let c10d = a.rdzv_backend == Backend::C10d;
    if c10d && url.is_some() {
        return Err(usage(
            "--rdzv-backend=c10d: give --rdzv-endpoint=HOST:PORT, not --rdzv",
        ));
    }
    let mut params = match (url, endpoint) {
        (Some(url), _) => {
            let mut p =
                Params::from_url(url).map_err(|e| usage(format!("--rdzv: {}", e.message())))?;
            if !a.nnodes.is_default() {
                p.set("nnodes", &format!("{min_nodes}:{max_nodes}"))
                    .map_err(|e| usage(format!("--nnodes: {}", e.message())))?;
            }
            p
        }
        (None, Some(endpoint)) => {
            // torchrun's c10d endpoint defaults to port 29400.
            let endpoint = match c10d && !endpoint.contains(':') {
                true => format!("{endpoint}:29400"),
                false => endpoint.to_string(),
            };
            let run_id = &a.rdzv_flags.rdzv_id;
            Params::new("etcd-v3", &endpoint, run_id, min_nodes, max_nodes)
                .map_err(|e| usage(format!("--rdzv-endpoint/--rdzv-id: {}", e.message())))?
        }
        (None, None) => unreachable!("a rendezvous without etcd is static"),
    };
    let conf = a.rdzv_flags.conf();
    let torch = torch_conf(conf, notes)?;
    for (key, value) in conf
        .iter()
        .filter(|(k, _)| !TORCH_CONF.contains(&k.as_str()))
    {
        params
            .set(key, value)
            .map_err(|e| usage(format!("--rdzv-conf: {}", e.message())))?;
    }
    let lease_given = conf
        .iter()
        .any(|(k, _)| k == "lease_ttl" || k == "keep_alive_ttl");
    if let (Some(ttl), false) = (torch.lease_ttl, lease_given) {
        params
            .set("lease_ttl", &ttl.to_string())
            .map_err(|e| usage(format!("--rdzv-conf: keep_alive_interval: {}", e.message())))?;
    }
    if let Some(addr) = &a.local_addr {
        params
            .set("local_addr", addr)
            .map_err(|e| usage(format!("--local-addr: {}", e.message())))?;
    }
    let serve =
        match c10d {
            true if params.endpoints().len() != 1 => return Err(usage(
                "--rdzv-backend=c10d: expected one HOST:PORT, the node that serves the rendezvous",
            )),
            true => Some(C10d {
                endpoint: params.endpoints()[0].clone(),
                is_host: torch.is_host,
            }),
            false => None,
        };
    if a.node_rank.is_some() || a.master_addr.is_some() || a.master_port.is_some() {
        notes.push(
            "--node-rank/--master-addr/--master-port apply to the static backend only: ignored"
                .into(),
        );
    }
    Ok((Venue::Etcd(Box::new(params)), serve))
}

/// torchrun's static backend: a fixed --nnodes, this node's --node-rank, and rank 0's address
/// from --master-addr/--master-port (or --rdzv-endpoint, which torchrun prefers).
fn static_round(a: &RunArgs, endpoint: Option<&str>) -> Result<StaticRound, Usage> {
    let (min_nodes, max_nodes) = (a.nnodes.min, a.nnodes.max);
    if min_nodes != max_nodes {
        return Err(usage(format!(
            "--nnodes={}: the static backend needs a fixed number of nodes",
            a.nnodes.given
        )));
    }
    let node_rank = a.node_rank.unwrap_or(0);
    if node_rank >= max_nodes {
        return Err(usage(format!(
            "--node-rank={node_rank}: expected 0..{} for --nnodes={max_nodes}",
            max_nodes - 1
        )));
    }
    let (master_addr, master_port) = match endpoint {
        Some(e) => e
            .rsplit_once(':')
            .and_then(|(h, p)| {
                Some((
                    h.trim_matches(['[', ']']).to_string(),
                    p.parse::<u16>().ok()?,
                ))
            })
            .ok_or_else(|| usage(format!("--rdzv-endpoint: expected HOST:PORT, got {e:?}")))?,
        None => (
            a.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
            a.master_port.unwrap_or(29500),
        ),
    };
    if master_addr.is_empty() {
        return Err(usage("--master-addr: expected a host name or address"));
    }
    Ok(StaticRound {
        node_rank,
        nnodes: max_nodes,
        master_addr,
        master_port: Some(master_port),
        standalone: false,
    })
}

/// torch's c10d `--rdzv-conf` keys, which are not rdzv options: taken by `torch_conf`.
const TORCH_CONF: [&str; 5] = [
    "is_host",
    "read_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "use_libuv",
];

/// What torch's own `--rdzv-conf` keys mean here.
#[derive(Debug, Default, PartialEq)]
struct TorchConf {
    is_host: Option<bool>,
    /// `keep_alive_interval` x `keep_alive_max_attempt`: when torch's c10d declares a silent
    /// node dead, which is what `lease_ttl` is here.
    lease_ttl: Option<f64>,
}

fn torch_conf(conf: &[(String, String)], notes: &mut Vec<String>) -> Result<TorchConf, Usage> {
    let get = |key: &str| {
        conf.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let number = |key: &str, v: &str| -> Result<f64, Usage> {
        v.parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n > 0.0)
            .ok_or_else(|| {
                usage(format!(
                    "--rdzv-conf: {key}: expected a number above 0, got {v:?}"
                ))
            })
    };
    let mut torch = TorchConf::default();
    if let Some(v) = get("is_host") {
        torch.is_host = Some(match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "y" | "on" => true,
            "0" | "false" | "no" | "n" | "off" => false,
            _ => {
                return Err(usage(format!(
                    "--rdzv-conf: is_host: expected true or false, got {v:?}"
                )))
            }
        });
    }
    let interval = get("keep_alive_interval")
        .map(|v| number("keep_alive_interval", v))
        .transpose()?;
    let attempts = get("keep_alive_max_attempt")
        .map(|v| number("keep_alive_max_attempt", v))
        .transpose()?;
    if interval.is_some() || attempts.is_some() {
        // torch's defaults: a heartbeat every 5 s, dead after 3 missed.
        let ttl = (interval.unwrap_or(5.0) * attempts.unwrap_or(3.0)).max(2.0);
        notes.push(format!(
            "--rdzv-conf: keep_alive_interval x keep_alive_max_attempt: a silent node is lost after {ttl} s (lease_ttl), unless lease_ttl is given"
        ));
        torch.lease_ttl = Some(ttl);
    }
    for key in ["read_timeout", "use_libuv"] {
        if let Some(v) = get(key) {
            if key == "read_timeout" {
                number(key, v)?;
            }
            notes.push(format!(
                "--rdzv-conf: {key}={v} is for torch's TCPStore: no effect on etcd, whose every call has a deadline of its own"
            ));
        }
    }
    Ok(torch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::rendezvous::rdzv_conf;

    #[test]
    fn torchs_own_rdzv_conf_keys() {
        let conf = |s: &str| {
            let mut notes = Vec::new();
            torch_conf(&rdzv_conf(s).unwrap().0, &mut notes).map(|t| (t, notes))
        };
        let (t, notes) = conf("is_host=true,read_timeout=60,use_libuv=1").unwrap();
        assert_eq!(
            t,
            TorchConf {
                is_host: Some(true),
                lease_ttl: None
            }
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(conf("is_host=0").unwrap().0.is_host, Some(false));
        // torch's c10d declares a node dead after keep_alive_max_attempt missed heartbeats.
        assert_eq!(
            conf("keep_alive_interval=2").unwrap().0.lease_ttl,
            Some(6.0)
        );
        assert_eq!(
            conf("keep_alive_interval=1,keep_alive_max_attempt=4")
                .unwrap()
                .0
                .lease_ttl,
            Some(4.0)
        );
        for bad in ["is_host=maybe", "read_timeout=-1", "keep_alive_interval=x"] {
            let Err(Usage(message)) = conf(bad) else {
                panic!("{bad} accepted")
            };
            assert!(
                message.contains(bad.split('=').next().unwrap()),
                "{message}"
            );
        }
    }
}
