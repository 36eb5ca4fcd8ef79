//! The worker processes themselves: how one is started (its own session, death with the
//! launcher, its CPUs), how its end is seen (a waiting thread per worker, so an exit reaches
//! the agent at once) and how its process group is signalled.
//!
//! Invariants that make "no orphan survives its launcher" hold:
//! - every worker leads a session, and so a process group, of its own: a signal to the group
//!   reaches what it started too (and Ctrl-C on the terminal reaches only the launcher, which
//!   forwards it);
//! - every worker has PR_SET_PDEATHSIG=SIGKILL, so it dies with the launcher even when the
//!   launcher is SIGKILLed. The kernel ties that to the *thread* that forked, so workers are
//!   only ever spawned from the main thread (the one running `block_on`), which lives until
//!   the process exits.

use super::env::GroupSpec;
use super::logs::Route;
use crate::exit::signal_name;
use crate::output;
use crate::ranks::WorkerRanks;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use tokio::sync::mpsc;

/// How a worker ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

impl Ended {
    pub fn of(status: ExitStatus) -> Ended {
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(sig)) => Ended::Signal(sig),
            (None, None) => Ended::Code(-1),
        }
    }
    pub fn success(self) -> bool {
        self == Ended::Code(0)
    }

    /// torch's exit code: the process's, or a signal's negative number.
    pub fn exitcode(self) -> i32 {
        match self {
            Ended::Code(code) => code,
            Ended::Signal(sig) => -sig,
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Code(c) => write!(f, "exit code {c}"),
            Ended::Signal(s) => write!(f, "signal {}", signal_name(*s)),
        }
    }
}

/// The command that starts worker `r` with its environment and stream routes. It must be
/// spawned on the main thread (see the module comment).
pub fn command(
    spec: &GroupSpec<'_>,
    r: &WorkerRanks,
    env: Vec<(String, String)>,
    routes: &[Route],
) -> Command {
    let mut cmd = Command::new(&spec.command[0]);
    // torchrun's `${local_rank}` in the program's arguments (its `macros.substitute`).
    cmd.args(
        spec.command[1..]
            .iter()
            .map(|a| a.replace("${local_rank}", &r.local_rank.to_string())),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let stdio = |route: &Route| match route {
        Route::Inherit => Stdio::inherit(),
        Route::Discard => Stdio::null(),
        Route::Pump(_) => Stdio::piped(),
    };
    // stdin and the streams nobody redirects are the launcher's own, as under torchrun: a
    // worker on a terminal sees one (isatty, `\r` progress bars, pdb and input()).
    cmd.stdin(Stdio::inherit())
        .stdout(stdio(&routes[0]))
        .stderr(stdio(&routes[1]));
    own_session(&mut cmd);
    dies_with_launcher(&mut cmd);
    if let Some(cpus) = spec.cpu_binding.get(r.local_rank as usize) {
        runs_on(&mut cmd, cpus);
    }
    cmd
}

/// Makes the worker lead a session (and so a process group) of its own, as torchrun's
/// `start_new_session`: a signal to its group reaches what it started, Ctrl-C on the terminal
/// reaches only the launcher (which forwards it), and, holding no controlling terminal, it
/// reads an inherited terminal without being stopped as a background job (pdb, input()).
fn own_session(cmd: &mut Command) {
    // SAFETY: setsid is async-signal-safe; it runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| match libc::setsid() {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
}

/// Makes the process `cmd` starts run on `cpus` only (its CPU affinity, which its threads and
/// children inherit), as `numactl --physcpubind` does.
fn runs_on(cmd: &mut Command, cpus: &crate::host::cpus::Cpus) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; built here, before the fork.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity is a plain syscall, async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            match libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// Makes the process `cmd` starts die (SIGKILL) with the launcher, however the launcher ends:
/// a SIGKILLed launcher leaves no worker or embedded etcd behind.
pub fn dies_with_launcher(cmd: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the line above took effect: nothing will reap us.
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Copies the piped streams of `child` through their pumps (plain threads, never the async
/// runtime: a console that reads slowly must not delay the node's lease refreshes); `done`
/// hears when each is through, so its last lines are out before the group is reported on.
/// Returns how many pumps there are.
pub fn pump_streams(
    child: &mut Child,
    routes: Vec<Route>,
    done: &mpsc::UnboundedSender<()>,
    progress: &std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> usize {
    let streams = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ];
    let mut pumps = 0;
    for (stream, route) in streams.into_iter().zip(routes) {
        let (Some(stream), Route::Pump(to)) = (stream, route) else {
            continue;
        };
        let done = done.clone();
        pumps += 1;
        let pump = output::pump(stream, to, progress.clone());
        std::thread::spawn(move || {
            let _ = pump.join();
            let _ = done.send(());
        });
    }
    pumps
}

/// Waits for `child` on a thread of its own and sends its exit status, with its pid, to
/// `exits` the moment it ends.
pub fn wait_in_thread(child: Child, exits: &mpsc::UnboundedSender<(u32, ExitStatus)>) {
    let tx = exits.clone();
    let pid = child.id();
    let mut child = child;
    std::thread::spawn(move || {
        if let Ok(status) = child.wait() {
            let _ = tx.send((pid, status));
        }
    });
}

/// Sends `signal` to the process group a worker leads (ESRCH for an empty group is fine).
pub fn signal_group(pid: u32, signal: i32) {
    // SAFETY: plain syscall on a process group this launcher created (pgid == pid).
    unsafe { libc::killpg(pid as i32, signal) };
}
