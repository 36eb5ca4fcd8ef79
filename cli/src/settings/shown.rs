//! The settings as the launcher tells them at `LOGLEVEL=INFO` (or `RDZV_LOG=info`) and finer,
//! before it starts: torchrun's "Rendezvous info" banner for a made-up standalone run, and its
//! "launch configs" block, under torch's names, so that a user who compares the two logs finds
//! the same lines.

use super::rendezvous::Venue;
use super::RunConfig;

impl RunConfig {
    /// torchrun's banner for `--standalone` (the run id and endpoint it made up); `None` for a
    /// rendezvous the user named.
    pub fn standalone_banner(&self) -> Option<Vec<String>> {
        let Venue::Static(s) = &self.rendezvous else {
            return None;
        };
        if !s.standalone {
            return None;
        }
        let stars = "*".repeat(38);
        Some(vec![
            stars.clone(),
            "Rendezvous info:".into(),
            format!(
                "--rdzv-backend=static --rdzv-endpoint={}:{} --rdzv-id={}",
                s.master_addr,
                s.master_port.unwrap_or(0),
                self.run_id
            ),
            stars,
        ])
    }

    /// The launch settings, one `name : value` line each, under torch's names where it has one.
    pub fn launch_lines(&self) -> Vec<String> {
        let (backend, endpoint, min_nodes, max_nodes, configs) = match &self.rendezvous {
            Venue::Etcd(p) => (
                p.backend().to_string(),
                p.endpoints().join(","),
                p.min_nodes(),
                p.max_nodes(),
                format!(
                    "join_timeout={:?}, last_call_timeout={:?}, lease_ttl={:?}",
                    p.join_timeout(),
                    p.last_call_timeout(),
                    p.lease_ttl()
                ),
            ),
            Venue::Static(s) => (
                "static".into(),
                format!("{}:{}", s.master_addr, s.master_port.unwrap_or(0)),
                s.nnodes,
                s.nnodes,
                format!("node_rank={}", s.node_rank),
            ),
        };
        let log_dir = self
            .log_dir
            .as_ref()
            .map_or("<a temporary directory>".into(), |d| {
                d.display().to_string()
            });
        let m = &self.monitor;
        let hang = match &m.hang {
            Some(t) => format!("{t:?}"),
            None if m.sections.is_empty() => "off".into(),
            None => format!("sections {:?}", m.sections),
        };
        let health = m.health.as_ref().map_or("off".into(), |h| {
            format!("{:?} every {:?}", h.command, h.interval)
        });
        [
            ("entrypoint", self.program.name().to_string()),
            ("min_nodes", min_nodes.to_string()),
            ("max_nodes", max_nodes.to_string()),
            ("nproc_per_node", self.nproc_per_node.to_string()),
            ("run_id", self.run_id.clone()),
            ("rdzv_backend", backend),
            ("rdzv_endpoint", endpoint),
            ("rdzv_configs", configs),
            ("max_restarts", self.max_restarts.to_string()),
            ("monitor_interval", format!("{:?}", self.monitor_interval)),
            ("log_dir", log_dir),
            ("shutdown_timeout", format!("{:?}", self.shutdown_timeout)),
            ("signals_to_handle", self.signals_to_handle.clone()),
            ("hang_timeout", hang),
            ("health_check", health),
        ]
        .into_iter()
        .map(|(name, value)| format!("  {name:<17}: {value}"))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::args::Command;
    use crate::settings::RunConfig;

    fn cfg(args: &[&str]) -> RunConfig {
        let argv = [&["rdzv", "run"], args, &["prog"]].concat();
        match crate::args::try_parse_from(argv).unwrap().command {
            Command::Run(a) => RunConfig::from_args(*a).unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn standalone_shows_torchruns_banner_with_its_made_up_id_and_a_named_job_does_not() {
        let alone = cfg(&["--standalone"]);
        let banner = alone.standalone_banner().unwrap();
        assert_eq!(banner[1], "Rendezvous info:");
        assert!(
            banner[2].contains(&format!("--rdzv-id={}", alone.run_id)),
            "{banner:?}"
        );
        let named = cfg(&["--rdzv-endpoint=e:2379", "--rdzv-id=j", "--nnodes=1:2"]);
        assert!(named.standalone_banner().is_none());
        let lines = named.launch_lines();
        let line = |name: &str| {
            lines
                .iter()
                .find(|l| l.trim_start().starts_with(name))
                .cloned()
        };
        assert_eq!(
            line("min_nodes").unwrap(),
            format!("  {:<17}: 1", "min_nodes")
        );
        assert!(line("max_nodes").unwrap().ends_with(": 2"));
        assert!(line("run_id").unwrap().ends_with(": j"));
        assert!(line("rdzv_endpoint").unwrap().contains("e:2379"));
    }
}
