//! The watchdog: a small process that releases this node the moment its launcher dies without
//! leaving (SIGKILL, the OOM killer), so the other nodes see the loss at once instead of when
//! the node's lease expires (`lease_ttl`, 10 s by default).
//!
//! ```text
//!   rdzv run ──(pipe: connection line, then "ticket NODE:LEASE" lines)──> rdzv <hidden mode>
//!      │                                                                     │
//!      └─ dies: the kernel closes the pipe ──> EOF ──> Admin::release(ticket) ─┘ (one get, one revoke)
//! ```
//!
//! - The launcher starts the same binary (`/proc/self/exe`) in a hidden mode, with its stdin
//!   on a pipe. The kernel closes the launcher's end when the launcher dies, however it dies,
//!   so end of file is the signal: no polling, no PR_SET_PDEATHSIG (which follows the thread
//!   that forked, not the process).
//! - It is in a session of its own: a SIGKILL to the launcher's process group (a terminal's
//!   Ctrl-C, `kill -9 -PGID`) does not take it along. A whole machine or container that goes
//!   takes it along: then the others still notice by the lease, within `lease_ttl`.
//! - It connects to etcd at once (an `Admin`, which registers nothing), so a release is two
//!   requests on an open connection: a read of the node's `alive` key and the lease's revoke.
//! - It uses the library's public API only: `Rendezvous::release_ticket` in the launcher,
//!   `Admin::release` here. A ticket is revoked only while the node's `alive` key is bound to
//!   it, so an outdated one does nothing.
//! - A launcher that leaves normally shuts its node down itself and then writes `done`: the
//!   watchdog exits without a request.

use crate::exit::Exit;
use crate::output::say;
use rdzv::admin::Admin;
use rdzv::{Params, ReleaseTicket};
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};

/// The first argument that starts the watchdog instead of the command line interface.
pub const MODE: &str = "__watchdog";

/// The launcher's side: the watchdog process and the pipe to it.
pub struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
    sent: Option<ReleaseTicket>,
}

impl Watchdog {
    /// Starts the watchdog for a node of the run `params` names.
    pub fn spawn(params: &Params) -> std::io::Result<Watchdog> {
        // This very binary, even if its file was replaced or deleted since it started.
        let mut command = Command::new("/proc/self/exe");
        command
            .arg(MODE)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let mut pipe = child.stdin.take();
        if let Some(p) = pipe.as_mut() {
            writeln!(p, "{}", connection(params))?;
        }
        Ok(Watchdog {
            child,
            pipe,
            sent: None,
        })
    }

    /// Tells the watchdog the node's current ticket, if it changed.
    pub fn arm(&mut self, ticket: Option<ReleaseTicket>) {
        let Some(ticket) = ticket else { return };
        if self.sent.as_ref() == Some(&ticket) {
            return;
        }
        let written = match self.pipe.as_mut() {
            Some(p) => writeln!(p, "ticket {ticket}").and_then(|()| p.flush()),
            None => return,
        };
        match written {
            Ok(()) => self.sent = Some(ticket),
            Err(e) => {
                say(format_args!(
                    "the watchdog is gone ({e}): if this launcher is killed, the others notice when its lease expires"
                ));
                self.pipe = None;
            }
        }
    }

    /// The launcher leaves normally (its node released by its own shutdown): the watchdog
    /// exits without doing anything, at once (it reads the pipe while it connects).
    pub fn dismiss(mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = writeln!(p, "done");
        }
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

/// What the watchdog needs to reach the run, as one line of JSON (read by `connect_params`).
/// Credentials travel on the pipe, never on a command line.
fn connection(params: &Params) -> String {
    let s = &params.security();
    let mut options = serde_json::Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            options.insert(k.to_string(), v.into());
        }
    };
    put("key_prefix", Some(params.key_prefix().to_string()));
    put(
        "connect_timeout",
        Some(params.connect_timeout().as_secs_f64().to_string()),
    );
    put(
        "protocol",
        Some(if s.https { "https" } else { "http" }.into()),
    );
    put("cacert", s.cacert.clone());
    put("cert", s.cert.clone());
    put("key", s.key.clone());
    put("username", s.username.clone());
    put("password", s.password.clone());
    serde_json::json!({
        "backend": params.backend(),
        "endpoints": params.endpoints().join(","),
        "run_id": params.run_id(),
        "options": options,
    })
    .to_string()
}

fn connect_params(line: &str) -> Result<Params, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let mut params = Params::new(&text("backend"), &text("endpoints"), &text("run_id"), 1, 1)
        .map_err(|e| e.message().to_string())?;
    if let Some(options) = v["options"].as_object() {
        for (k, value) in options {
            let value = value.as_str().unwrap_or_default();
            params.set(k, value).map_err(|e| e.message().to_string())?;
        }
    }
    Ok(params)
}

/// The watchdog process: reads the connection line, connects, keeps the latest ticket, and
/// releases it when the pipe ends without a `done`.
pub fn main() -> Exit {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return Exit::Failure,
    };
    runtime.block_on(watch())
}

async fn watch() -> Exit {
    // The pipe is read by a plain thread; its lines arrive here, and the channel closes at
    // end of file (or a read error: the launcher is gone either way).
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let params = match lines.recv().await {
        Some(line) => match connect_params(&line) {
            Ok(p) => p,
            Err(e) => {
                crate::output::error(format_args!("watchdog: bad connection line: {e}"));
                return Exit::Usage;
            }
        },
        _ => return Exit::Success,
    };
    // Connected ahead of need, while the pipe is read (a `done` does not wait for it); if etcd
    // cannot be reached now, try again when it matters.
    let connecting = tokio::spawn(Admin::connect(params.clone()));
    let mut ticket: Option<ReleaseTicket> = None;
    loop {
        match lines.recv().await {
            Some(line) if line == "done" => return Exit::Success,
            Some(line) => {
                if let Some(t) = line.strip_prefix("ticket ") {
                    if let Ok(t) = t.parse() {
                        ticket = Some(t);
                    }
                }
            }
            // End of file: the launcher died without leaving.
            None => break,
        }
    }
    let Some(ticket) = ticket else {
        return Exit::Success;
    };
    let mut admin = connecting.await.ok().and_then(Result::ok);
    if admin.is_none() {
        admin = Admin::connect(params).await.ok();
    }
    let released = match &admin {
        Some(admin) => admin.release(&ticket).await,
        None => {
            say(format_args!(
                "watchdog: the launcher of node {} died and etcd cannot be reached: the others notice when its lease expires",
                ticket.node
            ));
            return Exit::Failure;
        }
    };
    match released {
        Ok(true) => {
            say(format_args!(
                "watchdog: the launcher of node {} died: released the node (its lease revoked), so the others re-form now",
                ticket.node
            ));
            Exit::Success
        }
        Ok(false) => Exit::Success,
        Err(e) => {
            say(format_args!(
                "watchdog: the launcher of node {} died; could not release it ({}): the others notice when its lease expires",
                ticket.node,
                e.message()
            ));
            Exit::Failure
        }
    }
}
