//! The typed values of `rdzv run`'s flags and their parsers. clap calls a parser on the flag's
//! text (from the command line or its `PET_*` variable) and keeps what it returns, so a value
//! is read once, here; an error is a `Usage` line naming the flag and the form it expects,
//! which `args::parse` prints as it is. What needs the machine (how many GPUs `gpu` means) or
//! another flag (a static job's node rank) is left to the settings.

use crate::exit::{usage, Usage};
use crate::host::numa::Policy;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use std::time::Duration;

/// `--nnodes`: `N` or `MIN:MAX`, with 1 <= MIN <= MAX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nnodes {
    pub min: u32,
    pub max: u32,
    /// The flag's text: messages quote it, and a `--rdzv` URL's node counts give way to it
    /// only when it was not the default (`1:1`).
    pub given: String,
}

impl Nnodes {
    pub fn is_default(&self) -> bool {
        self.given == "1:1"
    }
}

pub fn nnodes(s: &str) -> Result<Nnodes, Usage> {
    let bad = || {
        usage(format!(
            "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got {s:?}"
        ))
    };
    let count = |v: &str| -> Result<u32, Usage> {
        match v.trim().parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(bad()),
        }
    };
    let (min, max) = match s.split_once(':') {
        Some((a, b)) => (count(a)?, count(b)?),
        None => {
            let n = count(s)?;
            (n, n)
        }
    };
    if min > max {
        return Err(bad());
    }
    Ok(Nnodes {
        min,
        max,
        given: s.to_string(),
    })
}

/// `--nproc-per-node`: a number, or a kind of device to start one worker per.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NprocPerNode {
    Count(u32),
    Cpu,
    Gpu,
    Xpu,
    /// torch's accelerator if the machine has one, else the CPUs.
    Auto,
}

pub fn nproc_per_node(s: &str) -> Result<NprocPerNode, Usage> {
    Ok(match s {
        "cpu" => NprocPerNode::Cpu,
        "gpu" => NprocPerNode::Gpu,
        "xpu" => NprocPerNode::Xpu,
        "auto" => NprocPerNode::Auto,
        _ => match s.parse::<u32>() {
            Ok(n) if n >= 1 => NprocPerNode::Count(n),
            _ => {
                return Err(usage(format!(
                    "--nproc-per-node: expected a number >= 1, cpu, gpu, xpu or auto, got {s:?}"
                )))
            }
        },
    })
}

impl std::fmt::Display for NprocPerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NprocPerNode::Count(n) => write!(f, "{n}"),
            NprocPerNode::Cpu => f.write_str("cpu"),
            NprocPerNode::Gpu => f.write_str("gpu"),
            NprocPerNode::Xpu => f.write_str("xpu"),
            NprocPerNode::Auto => f.write_str("auto"),
        }
    }
}

/// `--rdzv-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    EtcdV3,
    /// `etcd` or `etcd-v2` (the name given): torch's etcd backends, spoken as etcd-v3 (a note
    /// says so).
    EtcdAlias(&'static str),
    /// torch's c10d: the endpoint's node serves the rendezvous from an embedded etcd.
    C10d,
    /// No rendezvous: fixed node ranks and rank 0's address.
    Static,
}

pub fn backend(s: &str) -> Result<Backend, Usage> {
    Ok(match s {
        "etcd-v3" => Backend::EtcdV3,
        "etcd" => Backend::EtcdAlias("etcd"),
        "etcd-v2" => Backend::EtcdAlias("etcd-v2"),
        "c10d" => Backend::C10d,
        "static" => Backend::Static,
        other => {
            return Err(usage(format!(
                "--rdzv-backend: expected etcd-v3, c10d, static (or etcd, etcd-v2), got {other:?}"
            )))
        }
    })
}

/// Plain non-negative seconds (`0.5`, `30`); `flag` names where they came from.
pub fn seconds(flag: &str, s: &str, zero_ok: bool) -> Result<Duration, Usage> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && (zero_ok || v > 0.0) && v < 1e9 => {
            Ok(Duration::from_secs_f64(v))
        }
        _ => Err(usage(format!(
            "{flag}: expected a number of seconds{}, got {s:?}",
            if zero_ok { "" } else { " above 0" }
        ))),
    }
}

pub fn monitor_interval(s: &str) -> Result<Duration, Usage> {
    seconds("--monitor-interval", s, false)
}

pub fn shutdown_timeout(s: &str) -> Result<Duration, Usage> {
    seconds("--shutdown-timeout", s, true)
}

pub fn exit_barrier_timeout(s: &str) -> Result<Duration, Usage> {
    seconds("--exit-barrier-timeout", s, true)
}

pub fn in_process_timeout(s: &str) -> Result<Duration, Usage> {
    seconds("--in-process-timeout", s, false)
}

/// `--numa-binding`: one of torchrun's policy names, which clap lists in the help and in the
/// error for another.
pub fn numa_binding() -> impl TypedValueParser<Value = Policy> {
    PossibleValuesParser::new(Policy::NAMES)
        .map(|name| Policy::parse(&name).expect("a name of the list"))
}

/// Which of a worker's streams a `--redirects`/`--tee` spec selects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdout: bool,
    pub stderr: bool,
}

/// A `--redirects`/`--tee` spec: one setting for every local rank, or one per local rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamSpec {
    All(Streams),
    PerRank(Vec<(u32, Streams)>),
}

impl StreamSpec {
    pub fn for_rank(&self, local_rank: u32) -> Streams {
        match self {
            StreamSpec::All(s) => *s,
            StreamSpec::PerRank(map) => map
                .iter()
                .find(|(r, _)| *r == local_rank)
                .map_or_else(Streams::default, |(_, s)| *s),
        }
    }

    pub fn any(&self) -> bool {
        match self {
            StreamSpec::All(s) => s.stdout || s.stderr,
            StreamSpec::PerRank(map) => map.iter().any(|(_, s)| s.stdout || s.stderr),
        }
    }
}

/// torchrun's `Std` spec: `0`-`3` for every rank, or `LOCAL_RANK:0-3,...`.
pub fn stream_spec(flag: &str, s: &str) -> Result<StreamSpec, Usage> {
    let bad = || {
        usage(format!(
            "{flag}: expected 0, 1, 2, 3 or LOCAL_RANK:N,... (e.g. 0:3,1:2), got {s:?}"
        ))
    };
    let one = |v: &str| -> Result<Streams, Usage> {
        let (stdout, stderr) = match v.trim() {
            "0" => (false, false),
            "1" => (true, false),
            "2" => (false, true),
            "3" => (true, true),
            _ => return Err(bad()),
        };
        Ok(Streams { stdout, stderr })
    };
    if !s.contains(':') {
        return Ok(StreamSpec::All(one(s)?));
    }
    let map = s
        .split(',')
        .map(|item| {
            let (rank, v) = item.split_once(':').ok_or_else(bad)?;
            let rank = rank.trim().parse::<u32>().map_err(|_| bad())?;
            Ok((rank, one(v)?))
        })
        .collect::<Result<Vec<_>, Usage>>()?;
    Ok(StreamSpec::PerRank(map))
}

pub fn redirects(s: &str) -> Result<StreamSpec, Usage> {
    stream_spec("--redirects", s)
}

pub fn tee(s: &str) -> Result<StreamSpec, Usage> {
    stream_spec("--tee", s)
}

/// `--local-ranks-filter`: the local ranks whose output the console shows (empty: all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFilter(pub Vec<u32>);

pub fn local_ranks_filter(s: &str) -> Result<RankFilter, Usage> {
    if s.is_empty() {
        return Ok(RankFilter(Vec::new()));
    }
    s.split(',')
        .map(|r| r.trim().parse::<u32>())
        .collect::<Result<Vec<_>, _>>()
        .map(RankFilter)
        .map_err(|_| {
            usage(format!(
                "--local-ranks-filter: expected local ranks like 0,1,2, got {s:?}"
            ))
        })
}

/// `--signals-to-handle`: the signals forwarded to the workers, and the flag's text, which the
/// workers see (TORCHELASTIC_SIGNALS_TO_HANDLE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandledSignals {
    pub numbers: Vec<i32>,
    pub text: String,
}

/// Signal names (SIGUSR1, or USR1), comma-separated.
pub fn signals_to_handle(s: &str) -> Result<HandledSignals, Usage> {
    let mut numbers = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let sig = match name.trim_start_matches("SIG") {
            "TERM" => libc::SIGTERM,
            "INT" => libc::SIGINT,
            "HUP" => libc::SIGHUP,
            "QUIT" => libc::SIGQUIT,
            "USR1" => libc::SIGUSR1,
            "USR2" => libc::SIGUSR2,
            "ALRM" => libc::SIGALRM,
            "XCPU" => libc::SIGXCPU,
            "PWR" => libc::SIGPWR,
            _ => {
                return Err(usage(format!(
                    "--signals-to-handle: expected signal names like SIGTERM,SIGUSR1 \
                     (TERM INT HUP QUIT USR1 USR2 ALRM XCPU PWR), got {name:?}"
                )))
            }
        };
        if !numbers.contains(&sig) {
            numbers.push(sig);
        }
    }
    if numbers.is_empty() {
        return Err(usage("--signals-to-handle: expected at least one signal"));
    }
    Ok(HandledSignals {
        numbers,
        text: s.to_string(),
    })
}

/// torchrun's comma-separated list, where `,,` stands for a comma; empty items dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommaList(pub Vec<String>);

pub fn comma_list(s: &str) -> Result<CommaList, Usage> {
    let placeholder = "\u{0}";
    Ok(CommaList(
        s.replace(",,", placeholder)
            .split(',')
            .map(|item| item.replace(placeholder, ","))
            .filter(|item| !item.is_empty())
            .collect(),
    ))
}

pub fn role(s: &str) -> Result<String, Usage> {
    match s.is_empty() {
        true => Err(usage("--role: expected a non-empty name")),
        false => Ok(s.to_string()),
    }
}

/// The framework the workers use, for what it needs from the launcher beyond torchrun's
/// environment.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// torchrun's environment and nothing else (also what Lightning and DeepSpeed read).
    Torch,
    /// Also JAX's: JAX_COORDINATOR_ADDRESS on a port of its own, and the process count, id and
    /// local id where `jax.distributed.initialize()` finds them (Open MPI's names).
    Jax,
}

/// The shells `--print-completion` writes for (torchrun's).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Tcsh,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnodes_are_a_count_or_a_range() {
        let range = |s: &str| nnodes(s).map(|n| (n.min, n.max));
        assert_eq!(range("2").unwrap(), (2, 2));
        assert_eq!(range("1:4").unwrap(), (1, 4));
        for bad in ["3:2", "0", "0:2", "a", "1:2:3", ""] {
            let Err(Usage(message)) = nnodes(bad) else {
                panic!("{bad} accepted")
            };
            assert!(
                message.starts_with("--nnodes: expected N or MIN:MAX"),
                "{message}"
            );
        }
        assert!(nnodes("1:1").unwrap().is_default() && !nnodes("1").unwrap().is_default());
    }

    #[test]
    fn nproc_per_node_is_a_number_or_a_device_kind() {
        assert_eq!(nproc_per_node("4").unwrap(), NprocPerNode::Count(4));
        for kind in ["cpu", "gpu", "xpu", "auto"] {
            assert_eq!(nproc_per_node(kind).unwrap().to_string(), kind);
        }
        let Err(Usage(message)) = nproc_per_node("0") else {
            panic!("0 accepted")
        };
        assert!(
            message.contains("--nproc-per-node: expected a number >= 1"),
            "{message}"
        );
    }

    #[test]
    fn backends_and_seconds() {
        assert_eq!(backend("etcd-v2").unwrap(), Backend::EtcdAlias("etcd-v2"));
        assert!(backend("zookeeper")
            .unwrap_err()
            .0
            .contains("--rdzv-backend"));
        assert_eq!(monitor_interval("0.5").unwrap(), Duration::from_millis(500));
        assert!(monitor_interval("0").unwrap_err().0.contains("above 0"));
        assert_eq!(shutdown_timeout("0").unwrap(), Duration::ZERO);
        assert!(exit_barrier_timeout("-1").is_err());
    }

    #[test]
    fn stream_specs() {
        assert_eq!(
            redirects("3").unwrap().for_rank(5),
            Streams {
                stdout: true,
                stderr: true
            }
        );
        let per = redirects("0:1,1:2").unwrap();
        assert!(per.for_rank(0).stdout && !per.for_rank(0).stderr);
        assert!(per.for_rank(1).stderr && !per.for_rank(1).stdout);
        assert_eq!(per.for_rank(2), Streams::default());
        assert!(tee("4").unwrap_err().0.starts_with("--tee:"));
    }

    #[test]
    fn signals_and_comma_lists() {
        assert_eq!(
            signals_to_handle("SIGTERM,USR1, SIGUSR2").unwrap().numbers,
            vec![libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2]
        );
        assert!(signals_to_handle("SIGKILL").is_err());
        assert!(signals_to_handle("").is_err());
        assert_eq!(comma_list("a,,b,c").unwrap().0, vec!["a,b", "c"]);
        assert!(comma_list("").unwrap().0.is_empty());
        assert_eq!(local_ranks_filter("0, 2").unwrap().0, vec![0, 2]);
        assert!(local_ranks_filter("").unwrap().0.is_empty());
        assert!(local_ranks_filter("x").is_err());
    }
}
