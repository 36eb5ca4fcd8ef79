//! The command line as clap sees it: the subcommands and every flag with its type, its
//! torchrun spelling and its `PET_*` variable. A value is parsed once, here, into the type the
//! settings use; a bad one is a usage error that names the flag and the form it expects (exit
//! 2). Nothing here reads the machine, starts a process or talks to etcd.
//!
//! Submodules, each using only those listed before it: `values` (typed flag values and their
//! parsers), `rendezvous` (the flags that name a run, shared by `run` and the operator
//! commands), `monitor` (`rdzv run`'s hang, progress and health flags), `run` (`rdzv run`), `ops` (`status`, `close`, `purge`, `drain`),
//! `lighthouse` (`rdzv lighthouse`).

pub mod values;

pub mod rendezvous;

pub mod monitor;

pub mod lighthouse;
pub mod ops;
pub mod run;

use crate::exit::{Exit, Usage};
use crate::output;
use clap::{Parser, Subcommand};
use lighthouse::LighthouseArgs;
use ops::{CloseArgs, DrainArgs, ExporterArgs, PurgeArgs, StatusArgs};
use run::RunArgs;
use values::Shell;

#[derive(Parser, Debug)]
#[command(
    name = "rdzv",
    version,
    about = "Elastic launcher and operator commands for rdzv runs (etcd v3)",
    long_about = "Elastic launcher and operator commands for rdzv runs (etcd v3).\n\n\
        `rdzv run` is torchrun's elastic agent as a native program: it joins a rendezvous on \
        etcd, starts --nproc-per-node workers of any program with torchrun's environment \
        (RANK, WORLD_SIZE, MASTER_ADDR, ...), and keeps the job going through worker failures \
        (up to --max-restarts) and nodes joining or leaving. `status`, `close` and `purge` \
        look at, end and clean up a run.\n\n\
        Exit status: 0 success, 1 runtime failure (workers failed, etcd unreachable), 2 usage \
        error, 128+N when stopped by signal N."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run PROGRAM as an elastic job: --nproc-per-node workers on this node, every round.
    #[command(
        after_help = "Every option is also read from PET_<NAME> (PET_NNODES, PET_NPROC_PER_NODE, \
            PET_RDZV_ENDPOINT, ...) as torchrun does; a flag wins over its variable.\n\n\
            Examples:\n  \
            rdzv run --nnodes=2 --nproc-per-node=4 --rdzv-endpoint=etcd:2379 --rdzv-id=job42 train.py --lr 0.1\n  \
            rdzv run --rdzv 'etcd://etcd:2379/job42?min_nodes=1&max_nodes=4' ./worker\n  \
            rdzv run --standalone --nproc-per-node=cpu ./worker\n  \
            rdzv run --nnodes=2 --node-rank=0 --master-addr=node0 --master-port=29500 train.py\n\n\
            A flag given twice takes its last value, as in torchrun.",
        args_override_self = true
    )]
    Run(Box<RunArgs>),
    /// Show a run: open or closed, its rounds, members in rank order, waiting and lost nodes.
    #[command(args_override_self = true)]
    Status(StatusArgs),
    /// Close a run: every launcher ends its workers gracefully and exits.
    #[command(args_override_self = true)]
    Close(CloseArgs),
    /// Delete what a run left in etcd (refused while any of its nodes is alive).
    #[command(args_override_self = true)]
    Purge(PurgeArgs),
    /// Announce that a node will leave (preemption, maintenance, scale-down): the others re-form
    /// without it at once, and its launcher stops its workers and exits 0.
    // URL may be left out before NODE_ID when the flags name the run.
    #[command(args_override_self = true, allow_missing_positional = true)]
    Drain(DrainArgs),
    /// Serve torchft's Lighthouse (quorums for torchft's managers) with its state on etcd: any
    /// number of lighthouses per job, one leads, the others forward to it.
    #[command(
        args_override_self = true,
        after_help = "Example:\n  \
            rdzv lighthouse --min_replicas=2 --bind=[::]:29510 --rdzv-endpoint=etcd:2379 --rdzv-id=job42\n\n\
            torchft's managers reach it as TORCHFT_LIGHTHOUSE=http://HOST:29510."
    )]
    Lighthouse(Box<LighthouseArgs>),
    /// Serve every run on one etcd as Prometheus series (for a scheduler's dashboards): nodes,
    /// rounds, waiting and lost nodes, incidents and effective training time, by run_id.
    #[command(
        args_override_self = true,
        after_help = "Example:\n  rdzv exporter --etcd etcd:2379 --port 9401"
    )]
    Exporter(ExporterArgs),
}

/// The command line of this process. Help and version go out as clap writes them (exit 0);
/// every other error becomes one line naming the problem, and `Err` is the exit status.
pub fn parse() -> Result<Cli, Exit> {
    try_parse_from(std::env::args_os()).map_err(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                let _ = e.print();
                Exit::Success
            }
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                Exit::Usage
            }
            _ => {
                let subcommand = std::env::args().nth(1);
                output::error(usage_line(&e, subcommand.as_deref()));
                Exit::Usage
            }
        }
    })
}

/// Parses a command line as clap does, with one rule clap cannot state: an operator command's
/// URL and a `--rdzv-endpoint` given on the command line exclude each other, but the URL wins
/// over `PET_RDZV_ENDPOINT` (an operator may work from inside a job's environment).
pub fn try_parse_from<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().try_get_matches_from(argv)?;
    if let Some((name, sub)) = matches.subcommand() {
        if !matches!(name, "run" | "lighthouse" | "exporter")
            && ops::NamedRun::url_and_endpoint_flag(sub)
        {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "the argument '[URL]' cannot be used with '--rdzv-endpoint <HOST:PORT>'",
            ));
        }
    }
    Cli::from_arg_matches(&matches)
}

/// A parse error as one line. A flag's own parser said what was wrong in a line of ours: it is
/// shown as it is, pointing at the subcommand's help. Otherwise clap's message is its first
/// paragraph (a list of missing arguments continues on the next lines); the usage and tips
/// that follow are left to --help.
fn usage_line(e: &clap::Error, subcommand: Option<&str>) -> String {
    use std::error::Error;
    if let Some(Usage(message)) = e.source().and_then(|s| s.downcast_ref::<Usage>()) {
        let known = |name: &str| {
            use clap::CommandFactory;
            Cli::command()
                .get_subcommands()
                .any(|c| c.get_name() == name)
        };
        return match subcommand.filter(|s| known(s)) {
            Some(name) => format!("{message} (see rdzv {name} --help)"),
            None => format!("{message} (see rdzv --help)"),
        };
    }
    let text = e.render().to_string();
    let first = text.split("\n\n").next().unwrap_or("");
    let line = first
        .trim_start_matches("error: ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    format!("{line} (see rdzv --help)")
}

/// `rdzv run --print-completion SHELL`: a completion script for the whole command (torchrun
/// 2.15 prints one for itself).
pub fn print_completion(shell: Shell) {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut out = std::io::stdout();
    match shell {
        Shell::Bash => {
            clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, "rdzv", &mut out)
        }
        Shell::Zsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, "rdzv", &mut out)
        }
        Shell::Tcsh => {
            // tcsh: subcommands first, then the long flags of any of them.
            let subcommands: Vec<String> = cmd
                .get_subcommands()
                .map(|c| c.get_name().to_string())
                .collect();
            let mut flags: Vec<String> = cmd
                .get_subcommands()
                .flat_map(|c| {
                    c.get_arguments()
                        .filter_map(|a| a.get_long())
                        .map(str::to_string)
                })
                .collect();
            flags.sort();
            flags.dedup();
            println!(
                "complete rdzv 'p/1/({})/' 'c/--/({})/'",
                subcommands.join(" "),
                flags.join(" ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rdzv run ARGS prog`, parsed by clap.
    fn parse_run(args: &[&str]) -> Result<Box<RunArgs>, clap::Error> {
        let argv = [&["rdzv", "run"], args, &["prog"]].concat();
        match try_parse_from(argv)?.command {
            Command::Run(a) => Ok(a),
            _ => unreachable!(),
        }
    }

    /// The rows of docs/LAUNCHER.md's parity table: (spellings, example value, test name).
    fn parity_table() -> Vec<(Vec<String>, String, String)> {
        let doc = include_str!("../../../docs/LAUNCHER.md");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        doc.lines()
            .skip_while(|l| !l.starts_with("| torchrun flag |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                assert_eq!(cells.len(), 6, "a row of four cells: {row}");
                let example = ticked(cells[2]).concat();
                let test = ticked(cells[4]).concat();
                (ticked(cells[1]), example, test)
            })
            .collect()
    }

    #[test]
    fn every_torchrun_flag_of_the_parity_table_parses_in_both_spellings() {
        let rows = parity_table();
        // torchrun 2.15's parser, flag by flag (torch/distributed/run.py).
        let torchrun = [
            "--nnodes",
            "--nproc-per-node",
            "--rdzv-backend",
            "--rdzv-endpoint",
            "--rdzv-id",
            "--rdzv-conf",
            "--standalone",
            "--max-restarts",
            "--monitor-interval",
            "--start-method",
            "--event-log-handler",
            "--role",
            "--module",
            "--no-python",
            "--run-path",
            "--log-dir",
            "--redirects",
            "--tee",
            "--local-ranks-filter",
            "--duplicate-stdout-filters",
            "--duplicate-stderr-filters",
            "--node-rank",
            "--master-addr",
            "--master-port",
            "--local-addr",
            "--logs-specs",
            "--numa-binding",
            "--signals-to-handle",
            "--shutdown-timeout",
            "--virtual-local-rank",
            "--log-line-prefix-template",
        ];
        for flag in torchrun {
            assert!(
                rows.iter()
                    .any(|(spellings, _, _)| spellings.iter().any(|s| s == flag)),
                "{flag} has no row in the parity table"
            );
        }
        // The launcher's end-to-end suites, where the table's tests live: the modules of
        // tests/launcher/ and tests/launcher_torch.rs.
        let suites = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
        let mut tests = std::fs::read_to_string(suites.join("launcher_torch.rs")).unwrap();
        for module in std::fs::read_dir(suites.join("launcher")).unwrap() {
            tests += &std::fs::read_to_string(module.unwrap().path()).unwrap();
        }
        for (spellings, example, test) in &rows {
            assert!(!spellings.is_empty() && !test.is_empty(), "{spellings:?}");
            assert!(
                tests.contains(&format!("fn {test}(")),
                "the table names a test that does not exist: {test}"
            );
            let long = spellings.iter().find(|s| s.starts_with("--")).unwrap();
            if long[2..].contains('-') {
                let underscore = format!("--{}", long[2..].replace('-', "_"));
                assert!(
                    spellings.contains(&underscore),
                    "{long}: the table lists no {underscore}"
                );
            }
            for spelling in spellings {
                let arg = match (example.is_empty(), spelling.starts_with("--")) {
                    (true, _) => spelling.clone(),
                    (false, true) => format!("{spelling}{example}"),
                    (false, false) => format!("{spelling}{}", &example[1..]),
                };
                if let Err(e) = parse_run(&[&arg]) {
                    panic!("{arg}: {e}");
                }
            }
        }
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value() {
        let a = parse_run(&[
            "--nproc-per-node=2",
            "--nproc_per_node=3",
            "--tee=1",
            "-t",
            "3",
        ])
        .unwrap();
        assert_eq!(a.nproc_per_node, values::NprocPerNode::Count(3));
        assert_eq!(a.tee, values::tee("3").unwrap());
        let a = parse_run(&[
            "--no-python",
            "--no_python",
            "--max-restarts=1",
            "--max-restarts=4",
        ])
        .unwrap();
        assert!(a.no_python);
        assert_eq!(a.max_restarts, 4);
    }

    #[test]
    fn print_completion_needs_no_program_and_knows_torchruns_shells() {
        let argv = ["rdzv", "run", "--print_completion", "zsh"];
        let Command::Run(a) = try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        assert_eq!(a.print_completion, Some(Shell::Zsh));
        assert!(try_parse_from(["rdzv", "run", "--print-completion", "fish"]).is_err());
        assert!(
            try_parse_from(["rdzv", "run"]).is_err(),
            "PROGRAM stays required"
        );
    }

    /// torchrun hands everything after the script to it: flags of rdzv's own included.
    #[test]
    fn everything_from_the_program_on_is_the_programs() {
        let argv = [
            "rdzv",
            "run",
            "--standalone",
            "train.py",
            "--help",
            "--log_dir",
            "D",
            "-m",
            "--max-restarts=3",
            "--role",
            "X",
            "-t",
            "3",
            "--nnodes=5",
            "--",
            "x",
        ];
        let Command::Run(a) = try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        assert_eq!(a.command, &argv[3..]);
        assert!(a.log_dir.is_none() && !a.module && a.max_restarts == 0);
        assert_eq!(
            (a.role.as_str(), a.tee.any(), a.nnodes.given.as_str()),
            ("default", false, "1:1")
        );
        // An unknown flag before the program is still a usage error, not a program.
        assert!(try_parse_from(["rdzv", "run", "--bogus", "train.py"]).is_err());
        assert!(try_parse_from(["rdzv", "run", "--standalone"]).is_err());
    }

    /// A bad value is one line of ours, naming the flag and pointing at the subcommand's help.
    #[test]
    fn a_bad_value_is_the_flags_own_line() {
        let e = parse_run(&["--nproc-per-node=zero"]).unwrap_err();
        assert_eq!(
            usage_line(&e, Some("run")),
            "--nproc-per-node: expected a number >= 1, cpu, gpu, xpu or auto, got \"zero\" \
             (see rdzv run --help)"
        );
        let e = try_parse_from(["rdzv", "run", "--bogus", "x"]).unwrap_err();
        let line = usage_line(&e, Some("run"));
        assert!(
            line.contains("--bogus") && line.ends_with("(see rdzv --help)"),
            "{line}"
        );
    }

    /// The operator commands name a run by URL or by `rdzv run`'s flags, not both.
    #[test]
    fn operator_commands_take_a_url_or_runs_flags() {
        let url = |argv: &[&str]| -> Result<String, String> {
            let cli = try_parse_from(argv).map_err(|e| e.to_string())?;
            let run = match &cli.command {
                Command::Status(a) => &a.run,
                Command::Close(a) => &a.run,
                Command::Purge(a) => &a.run,
                Command::Drain(a) => &a.run,
                Command::Run(_) | Command::Lighthouse(_) | Command::Exporter(_) => unreachable!(),
            };
            run.url().map_err(|e| e.0)
        };
        let flags = [
            "--rdzv-endpoint=h:1",
            "--rdzv_id=job",
            "--rdzv-conf=lease_ttl=2",
        ];
        for command in ["status", "close", "purge"] {
            let by_url = url(&["rdzv", command, "etcd://h:1/job"]).unwrap();
            assert_eq!(by_url, "etcd://h:1/job");
            let by_flags = url(&[&["rdzv", command][..], &flags].concat()).unwrap();
            assert_eq!(by_flags, "etcd://h:1/job?lease_ttl=2");
            assert!(url(&["rdzv", command, "--rdzv-endpoint=h:1", "etcd://h:1/x"]).is_err());
            assert!(url(&["rdzv", command, "etcd://h:1/x", "--rdzv-id=y"]).is_ok());
            assert!(url(&["rdzv", command]).is_err());
        }
        let drain = |argv: &[&str]| match try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Drain(a)) => Ok((a.run.url().unwrap(), a.node_id)),
            Ok(_) => unreachable!(),
            Err(e) => Err(e),
        };
        assert_eq!(
            drain(&["rdzv", "drain", "etcd://h:1/job", "node-1"]).unwrap(),
            ("etcd://h:1/job".into(), "node-1".into())
        );
        assert_eq!(
            drain(&[
                "rdzv",
                "drain",
                "--rdzv-endpoint=h:1",
                "--rdzv-id=job",
                "node-1"
            ])
            .unwrap(),
            ("etcd://h:1/job".into(), "node-1".into())
        );
        assert!(drain(&["rdzv", "drain", "node-1"]).is_err(), "no run named");
        assert!(
            drain(&["rdzv", "drain", "--rdzv-endpoint=h:1"]).is_err(),
            "no node"
        );
    }
}
