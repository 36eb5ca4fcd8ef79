//! `rdzv lighthouse`: torchft's `torchft_lighthouse` flags (both spellings, as `rdzv run`
//! takes torchrun's), and the run whose etcd keeps the lighthouses' shared state, named as
//! `rdzv run` names it.

use super::rendezvous::RdzvFlags;
use crate::exit::{usage, Usage};
use clap::Args;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct LighthouseArgs {
    /// Address to serve torchft's LighthouseService (gRPC) and /status on (port 0: any free
    /// port; the address served is printed).
    #[arg(long, default_value = "[::]:29510", value_name = "HOST:PORT")]
    pub bind: String,
    /// Minimum number of replica groups of a quorum (when not every member of the last quorum
    /// is still there).
    #[arg(long, alias = "min_replicas", value_name = "N", value_parser = min_replicas)]
    pub min_replicas: u64,
    /// How long to wait for heartbeating stragglers to join before a quorum forms without them.
    #[arg(long, alias = "join_timeout_ms", default_value = "60000", value_name = "MS",
        value_parser = |s: &str| millis("--join-timeout-ms", s))]
    pub join_timeout_ms: Duration,
    /// How often to look for a quorum while waiting for stragglers.
    #[arg(long, alias = "quorum_tick_ms", default_value = "100", value_name = "MS",
        value_parser = |s: &str| positive_millis("--quorum-tick-ms", s))]
    pub quorum_tick_ms: Duration,
    /// How long without a heartbeat before a replica group is taken as dead.
    #[arg(long, alias = "heartbeat_timeout_ms", default_value = "5000", value_name = "MS",
        value_parser = |s: &str| positive_millis("--heartbeat-timeout-ms", s))]
    pub heartbeat_timeout_ms: Duration,
    /// The address other lighthouses forward to when this one leads (default: the bound
    /// address, or this host's name when bound to every interface).
    #[arg(long, alias = "advertise_addr", value_name = "HOST:PORT")]
    pub advertise_addr: Option<String>,
    /// The etcd and the job: every lighthouse of one job passes the same --rdzv-endpoint and
    /// --rdzv-id (lease_ttl in --rdzv-conf: how soon a killed leader is replaced).
    #[command(flatten)]
    pub rdzv: RdzvFlags,
}

fn min_replicas(s: &str) -> Result<u64, Usage> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(usage(format!(
            "--min-replicas: expected a whole number of at least 1, got {s:?}"
        ))),
    }
}

fn millis(flag: &str, s: &str) -> Result<Duration, Usage> {
    s.trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            usage(format!(
                "{flag}: expected milliseconds (a whole number), got {s:?}"
            ))
        })
}

fn positive_millis(flag: &str, s: &str) -> Result<Duration, Usage> {
    match millis(flag, s)? {
        d if d.is_zero() => Err(usage(format!("{flag}: expected at least 1 ms, got {s:?}"))),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use crate::args::{try_parse_from, Command};

    fn parse(args: &[&str]) -> Result<super::LighthouseArgs, clap::Error> {
        let argv = [&["rdzv", "lighthouse"], args].concat();
        match try_parse_from(argv)?.command {
            Command::Lighthouse(a) => Ok(*a),
            _ => unreachable!(),
        }
    }

    #[test]
    fn torchft_spellings_and_ours() {
        let a = parse(&[
            "--min_replicas=2",
            "--join_timeout_ms=100",
            "--quorum_tick_ms",
            "10",
            "--heartbeat_timeout_ms=300",
            "--bind=127.0.0.1:0",
            "--rdzv_endpoint=h:1",
            "--rdzv_id=job",
        ])
        .unwrap();
        assert_eq!(a.min_replicas, 2);
        assert_eq!(a.join_timeout_ms.as_millis(), 100);
        assert_eq!(a.quorum_tick_ms.as_millis(), 10);
        assert_eq!(a.heartbeat_timeout_ms.as_millis(), 300);
        assert_eq!(a.rdzv.url().unwrap(), "etcd://h:1/job");
        let b = parse(&["--min-replicas", "1", "--heartbeat-timeout-ms=7"]).unwrap();
        assert_eq!(b.join_timeout_ms.as_millis(), 60000);
        assert_eq!(b.heartbeat_timeout_ms.as_millis(), 7);
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (&["--min-replicas=0"][..], "--min-replicas"),
            (
                &["--min-replicas=1", "--quorum-tick-ms=0"],
                "--quorum-tick-ms",
            ),
            (
                &["--min-replicas=1", "--join-timeout-ms=soon"],
                "--join-timeout-ms",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.to_string().contains(flag), "{e}");
        }
        assert!(
            parse(&[]).is_err(),
            "--min-replicas is required, as in torchft"
        );
    }
}
