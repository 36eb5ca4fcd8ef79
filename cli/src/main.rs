//! `rdzv`: the elastic launcher (`rdzv run`, torchelastic's agent on rdzv's rendezvous) and the
//! operator commands (`status`, `close`, `purge`). It uses only the library's public Rust API.
//!
//! Modules, each depending only on those listed before it: `exit` (exit statuses, the usage
//! error), `output` (every line the command writes), `host` (what the machine has: CPUs,
//! accelerators, NUMA), `cli` (flags into a checked configuration), `ranks` (worker ranks from a round), `workers` (one node's worker
//! processes), `c10d` (the embedded etcd of `--rdzv-backend=c10d`), `watchdog` (the helper
//! that releases the node if the launcher is killed), `agent` (the elastic agent's state
//! machine), `ops` (the operator commands).

mod exit;
mod output;

mod cli;
mod host;

mod c10d;
mod ranks;
mod watchdog;
mod workers;

mod agent;
mod ops;

use clap::Parser;
use cli::{Cli, Command};
use exit::Exit;

fn main() {
    // The watchdog is this binary in a hidden mode, started by `rdzv run` (watchdog.rs).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == watchdog::MODE)
    {
        output::route_library_logs();
        std::process::exit(watchdog::main().code());
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => std::process::exit(usage_error(e).code()),
    };
    output::route_library_logs();
    let code = match cli.command {
        Command::Run(args) => run(args),
        Command::Status(args) => block_on(ops::status(args)),
        Command::Close(args) => block_on(ops::close(args)),
        Command::Purge(args) => block_on(ops::purge(args)),
        Command::Drain(args) => block_on(ops::drain(args)),
    };
    std::process::exit(code.code());
}

fn run(args: Box<cli::RunArgs>) -> Exit {
    if let Some(shell) = &args.print_completion {
        cli::print_completion(shell);
        return Exit::Success;
    }
    let cfg = match cli::run_config(args).and_then(|cfg| cli::check_program(&cfg).map(|()| cfg)) {
        Ok(cfg) => cfg,
        Err(exit::Usage(message)) => {
            output::error(format_args!("{message} (see rdzv run --help)"));
            return Exit::Usage;
        }
    };
    for note in &cfg.notes {
        output::say(note);
    }
    // Started here, on the main thread: its PR_SET_PDEATHSIG follows this thread. Stopped when
    // this function returns, after the agent is through.
    let serve = |endpoint: &str| c10d::serve_if_here(endpoint, cfg.c10d_is_host);
    let _served = match cfg.c10d.as_deref().map(serve).transpose() {
        Ok(served) => served.flatten(),
        Err(message) => {
            output::error(message);
            return Exit::Failure;
        }
    };
    let cpu_binding = match cfg.numa_binding {
        Some(policy) => match host::numa::bindings(policy, cfg.nproc_per_node) {
            Ok(binding) => {
                let each: Vec<String> = binding
                    .iter()
                    .enumerate()
                    .map(|(rank, cpus)| {
                        format!(
                            "local rank {rank} on CPUs {}",
                            host::cpus::format_list(cpus)
                        )
                    })
                    .collect();
                output::say(format_args!(
                    "--numa-binding={}: {}",
                    policy.name(),
                    each.join(", ")
                ));
                binding
            }
            Err(message) => {
                output::error(format_args!("--numa-binding={}: {message}", policy.name()));
                return Exit::Failure;
            }
        },
        None => Vec::new(),
    };
    let handled = cfg.signals.clone();
    // The embedded etcd outlives this node's part until the others have left.
    let linger = match (&_served, &cfg.rendezvous) {
        (Some(_), cli::Rendezvous::Etcd(params)) => Some((
            (**params).clone(),
            cfg.shutdown_timeout + C10D_LINGER_MARGIN,
        )),
        _ => None,
    };
    let agent = match agent::Agent::new(cfg, cpu_binding) {
        Ok(agent) => agent,
        Err(e) => {
            output::error(format_args!("cannot create the log directory: {e}"));
            return Exit::Failure;
        }
    };
    // Workers are spawned from this thread (block_on runs the agent here): their
    // PR_SET_PDEATHSIG follows the thread that forked them, and this one lives to the end.
    block_on(async move {
        let mut signals = match agent::Signals::install(&handled) {
            Ok(s) => s,
            Err(e) => {
                output::error(format_args!("cannot handle signals: {e}"));
                return Exit::Failure;
            }
        };
        let status = agent.run(&mut signals).await;
        if let Some((params, bound)) = &linger {
            tokio::select! {
                _ = c10d::linger(params, *bound) => {}
                _ = signals.recv() => {}
            }
        }
        status
    })
}

/// Beyond the workers' grace period, how long an embedded etcd waits for the other nodes to
/// stop theirs and release their nodes.
const C10D_LINGER_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

fn block_on(f: impl std::future::Future<Output = Exit>) -> Exit {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(f),
        Err(e) => {
            output::error(format_args!("cannot start the runtime: {e}"));
            Exit::Failure
        }
    }
}

/// Help and version go out as clap writes them (exit 0); every other parse error becomes one
/// line naming the problem, exit status 2.
fn usage_error(e: clap::Error) -> Exit {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return match e.kind() {
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => Exit::Usage,
            _ => Exit::Success,
        };
    }
    let text = e.render().to_string();
    // clap's message is its first paragraph (a list of missing arguments continues on the
    // next lines); the usage and tips that follow are left to --help.
    let first = text.split("\n\n").next().unwrap_or("");
    let line = first
        .trim_start_matches("error: ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    output::error(format_args!("{line} (see rdzv --help)"));
    Exit::Usage
}
