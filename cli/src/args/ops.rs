//! The operator commands' arguments. Each names its run by URL, or by the flags `rdzv run`
//! takes (`--rdzv-endpoint`, `--rdzv-id`, `--rdzv-conf`, and their `PET_*` variables), so
//! the job's own command line or environment is enough to reach it.

use super::rendezvous::RdzvFlags;
use crate::exit::Usage;
use clap::Args;

/// The run an operator command acts on: URL, or `rdzv run`'s flags.
#[derive(Args, Debug)]
pub struct NamedRun {
    #[command(flatten)]
    pub flags: RdzvFlags,
    /// The run: etcd://HOST:PORT[,HOST:PORT...]/RUN_ID[?key_prefix=...&...], or named as
    /// `rdzv run` names it, by --rdzv-endpoint, --rdzv-id and --rdzv-conf.
    // Not `conflicts_with`: clap counts PET_RDZV_ENDPOINT as the flag (`args::try_parse_from`).
    #[arg(required_unless_present = "rdzv_endpoint")]
    pub url: Option<String>,
}

impl NamedRun {
    /// Whether these arguments give both URL and `--rdzv-endpoint` on the command line.
    pub fn url_and_endpoint_flag(matches: &clap::ArgMatches) -> bool {
        use clap::parser::ValueSource;
        matches.contains_id("url")
            && matches.value_source("rdzv_endpoint") == Some(ValueSource::CommandLine)
    }

    /// The run's URL, as given or from `rdzv run`'s flags.
    pub fn url(&self) -> Result<String, Usage> {
        match &self.url {
            Some(url) => Ok(url.clone()),
            None => self.flags.url(),
        }
    }
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print one JSON object (with --watch, one per line).
    #[arg(long)]
    pub json: bool,
    /// Keep watching: one line per change as it happens, until interrupted.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub run: NamedRun,
}

#[derive(Args, Debug)]
pub struct CloseArgs {
    #[command(flatten)]
    pub run: NamedRun,
}

#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Delete even while nodes of the run are alive (they will fail).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub run: NamedRun,
}

#[derive(Args, Debug)]
pub struct DrainArgs {
    /// Why the node leaves: shown to the node and in logs.
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub run: NamedRun,
    /// The node's id, as `rdzv status` lists it (and its launcher prints when it joins).
    pub node_id: String,
}

#[derive(Args, Debug)]
pub struct ExporterArgs {
    /// The etcd: HOST:PORT[,HOST:PORT...] (optionally http:// or https://).
    #[arg(long, value_name = "ENDPOINTS")]
    pub etcd: String,
    /// The key prefix the jobs use (their URLs' key_prefix).
    #[arg(long, default_value = "/rdzv", value_name = "PREFIX")]
    pub key_prefix: String,
    /// The port to serve /metrics on, on every address (0: any free port; the port served is
    /// printed).
    #[arg(long, value_name = "PORT")]
    pub port: u16,
    /// At most this many runs are read per scrape.
    #[arg(long, default_value = "1000", value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runs: u32,
}
