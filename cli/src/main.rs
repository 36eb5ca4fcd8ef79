//! `rdzv`: the elastic launcher (`rdzv run`, torchelastic's agent on rdzv's rendezvous) and the
//! operator commands (`status`, `close`, `purge`, `drain`). It uses only the library's public
//! Rust API.
//!
//! Modules, each using only those listed before it:
//! - `exit`: exit statuses, the usage error, signal names;
//! - `output`: every line the command writes;
//! - `host`: what the machine has (CPUs, accelerators, NUMA, its name);
//! - `store_wait`: a wait on a round's store until another node sets a key;
//! - `args`: the command line, each flag parsed into its type;
//! - `settings`: `rdzv run`'s flags combined and checked into a `RunConfig`;
//! - `ranks`: worker ranks from a round;
//! - `workers`: one node's worker processes;
//! - `monitor`: what no exit reports beside a running group (hangs, progress, health);
//! - `c10d`: the embedded etcd of `--rdzv-backend=c10d`;
//! - `watchdog`: the helper that releases the node if the launcher is killed;
//! - `events`: the job's events and metrics in torchelastic's shapes (`--events-file`);
//! - `prometheus`: this node's metrics served for Prometheus (`--metrics-port`);
//! - `incidents`: the job's incident records in the run's notes, and its effective training
//!   time;
//! - `agent`: the elastic agent's state machine;
//! - `ops`: the operator commands;
//! - `exporter`: every run on one etcd as Prometheus series (`rdzv exporter`);
//! - `lighthouse`: torchft's Lighthouse served from etcd (`rdzv lighthouse`).

mod exit;

mod output;

mod host;

mod store_wait;

mod args;

mod settings;

mod ranks;

mod workers;

mod monitor;

mod c10d;

mod watchdog;

mod events;

mod prometheus;

mod incidents;

mod agent;

mod ops;

mod exporter;

mod lighthouse;

use args::Command;
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
    let cli = match args::parse() {
        Ok(cli) => cli,
        Err(exit) => std::process::exit(exit.code()),
    };
    output::route_library_logs();
    let code = match cli.command {
        Command::Run(args) => run(args),
        Command::Status(args) => block_on(ops::status(args)),
        Command::Close(args) => block_on(ops::close(args)),
        Command::Purge(args) => block_on(ops::purge(args)),
        Command::Drain(args) => block_on(ops::drain(args)),
        Command::Lighthouse(args) => block_on_one_thread(lighthouse::serve(*args)),
        Command::Exporter(args) => block_on(exporter::serve(args)),
    };
    std::process::exit(code.code());
}

fn run(args: Box<args::run::RunArgs>) -> Exit {
    if let Some(shell) = args.print_completion {
        args::print_completion(shell);
        return Exit::Success;
    }
    let checked =
        settings::RunConfig::from_args(*args).and_then(|cfg| cfg.program.check().map(|()| cfg));
    let cfg = match checked {
        Ok(cfg) => cfg,
        Err(exit::Usage(message)) => {
            output::error(format_args!("{message} (see rdzv run --help)"));
            return Exit::Usage;
        }
    };
    for note in &cfg.notes {
        output::say(note);
    }
    if output::verbose(output::Verbosity::Info) {
        for line in cfg.standalone_banner().into_iter().flatten() {
            output::say(line);
        }
        output::say("starting the elastic agent with launch configs:");
        for line in cfg.launch_lines() {
            output::say(line);
        }
    }
    // Started here, on the main thread: its PR_SET_PDEATHSIG follows this thread. Stopped when
    // this function returns, after the agent is through.
    let serve = |c: &settings::rendezvous::C10d| c10d::serve_if_here(&c.endpoint, c.is_host);
    let mut served = match cfg.c10d.as_ref().map(serve).transpose() {
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
    let linger = served
        .is_some()
        .then_some(cfg.shutdown_timeout + C10D_LINGER_MARGIN);
    let agent = match agent::Agent::new(cfg, cpu_binding) {
        Ok(agent) => agent,
        Err(e) => {
            output::error(format_args!("cannot create the log directory: {e}"));
            return Exit::Failure;
        }
    };
    // Borrowed by the agent's future, so that it is stopped after that, outside the runtime.
    let served = &mut served;
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
        // An etcd that lost the port to another launcher's serves no one: nothing to keep up.
        let serves = served.as_mut().is_some_and(c10d::EmbeddedEtcd::serves);
        if let (Some(bound), true, Some(etcd)) = (linger, serves, served.as_ref()) {
            tokio::select! {
                _ = etcd.linger(bound) => {}
                _ = signals.recv() => {}
            }
        }
        status
    })
}

/// Beyond the workers' grace period, how long an embedded etcd waits for the other nodes to
/// stop theirs and release their nodes.
const C10D_LINGER_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// A runtime of one thread: the lighthouse's work is short calls under one lock, and a call
/// forwarded by a follower answered without crossing threads took half the time (0.5 ms
/// instead of 1.0 for one replica group; as fast at 256: docs/BENCHMARKS-HISTORY.md).
fn block_on_one_thread(f: impl std::future::Future<Output = Exit>) -> Exit {
    run_on(tokio::runtime::Builder::new_current_thread(), f)
}

fn block_on(f: impl std::future::Future<Output = Exit>) -> Exit {
    let mut two = tokio::runtime::Builder::new_multi_thread();
    two.worker_threads(2);
    run_on(two, f)
}

fn run_on(
    mut builder: tokio::runtime::Builder,
    f: impl std::future::Future<Output = Exit>,
) -> Exit {
    match builder.enable_all().build() {
        Ok(rt) => rt.block_on(f),
        Err(e) => {
            output::error(format_args!("cannot start the runtime: {e}"));
            Exit::Failure
        }
    }
}
