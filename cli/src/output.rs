//! Everything the `rdzv` command writes goes through here: its own lines (`[rdzv] ...` on
//! stderr, one event per line), the library's log records (same place, same shape), worker
//! output copied line by line (as the worker wrote it, or with torchrun's `[default0]:` prefix
//! when teed), and the product of the operator commands on stdout.
//!
//! Each line is written with one `write_all` under the stream's lock, so lines from the
//! launcher and from many workers never interleave mid-line. Worker output is pumped by plain
//! threads, never by the async runtime: a console that reads slowly may block a pump, but must
//! not stall the runtime that keeps this node's etcd lease alive.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// The launcher's own line: what it is doing, for the person watching the job.
pub fn say(message: impl std::fmt::Display) {
    let line = format!("[rdzv] {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A line on stderr as it is, without the launcher's prefix: torchrun's failure report, which
/// tools parse.
pub fn plain(message: impl std::fmt::Display) {
    let line = format!("{message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A failure that ends the command (the last thing it says).
pub fn error(message: impl std::fmt::Display) {
    let line = format!("rdzv: error: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A line of a command's result (a status table, JSON), on stdout.
pub fn result(line: impl std::fmt::Display) {
    let line = format!("{line}\n");
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

/// How much the launcher says beyond its event lines: `RDZV_LOG`'s level for rdzv (its bare
/// level: `RDZV_LOG=debug`), else torch's `LOGLEVEL` (`DEBUG`, `INFO`, `WARNING`, `ERROR`,
/// `CRITICAL`), as torchrun's agent reads it. At info, the launch's settings before it
/// starts; at debug, also each step of the agent (`debug`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    Quiet,
    Info,
    Debug,
}

static VERBOSITY: AtomicU8 = AtomicU8::new(0);

/// The level `RDZV_LOG` (else `LOGLEVEL`) asks for, and the library filter that goes with it.
fn level_from_env() -> (Verbosity, Option<String>) {
    let bare_level = |spec: &str| {
        spec.split(',')
            .map(|d| d.trim().to_ascii_lowercase())
            .filter_map(|d| match d.as_str() {
                "trace" | "debug" => Some(Verbosity::Debug),
                "info" => Some(Verbosity::Info),
                "warn" | "error" | "off" => Some(Verbosity::Quiet),
                _ => None,
            })
            .max()
    };
    if let Some(spec) = std::env::var(rdzv::log::ENV_VAR)
        .ok()
        .filter(|s| !s.is_empty())
    {
        // The library reads the variable itself.
        return (bare_level(&spec).unwrap_or(Verbosity::Quiet), None);
    }
    let torch = std::env::var("LOGLEVEL")
        .unwrap_or_default()
        .to_ascii_uppercase();
    let (verbosity, library) = match torch.as_str() {
        "DEBUG" => (Verbosity::Debug, "debug"),
        "INFO" => (Verbosity::Info, "info"),
        "ERROR" | "CRITICAL" | "FATAL" => (Verbosity::Quiet, "error"),
        _ => return (Verbosity::Quiet, None),
    };
    (verbosity, Some(library.to_string()))
}

/// Whether the launcher says this much.
pub fn verbose(at: Verbosity) -> bool {
    VERBOSITY.load(Relaxed) >= at as u8
}

/// A step of the agent, said at debug (`RDZV_LOG=debug` or `LOGLEVEL=DEBUG`).
pub fn debug(message: impl std::fmt::Display) {
    if verbose(Verbosity::Debug) {
        say(format_args!("debug: {message}"));
    }
}

/// Routes the library's log records into the launcher's lines (warnings by default;
/// `RDZV_LOG=info` and finer ask for more, and so does torch's `LOGLEVEL` when `RDZV_LOG` is
/// not set), and sets the launcher's own verbosity from the same variables.
pub fn route_library_logs() {
    let (verbosity, library) = level_from_env();
    VERBOSITY.store(verbosity as u8, Relaxed);
    match library {
        Some(spec) => rdzv::log::install_with(&spec),
        None => rdzv::log::install_default(),
    }
    rdzv::log::set_handler(Some(std::sync::Arc::new(
        |record: &rdzv::log::Record<'_>| {
            say(format_args!(
                "{} {}: {}",
                record.level.as_str().to_lowercase(),
                record.target,
                record.line
            ))
        },
    )));
}

/// Which console stream a worker stream is copied to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Console {
    Stdout,
    Stderr,
}

/// A file that receives the lines (of any worker of a node) containing one of `filters`:
/// torchrun's `--duplicate-stdout-filters`.
#[derive(Clone)]
pub struct Duplicate {
    pub filters: Vec<String>,
    pub file: std::sync::Arc<std::sync::Mutex<File>>,
}

/// Where one worker stream goes.
pub struct Destination {
    /// Prefix (empty unless teed: `[default3]:`) and console stream, or `None` when the
    /// console does not show it.
    pub console: Option<(String, Console)>,
    /// A log file receiving the lines unprefixed.
    pub file: Option<File>,
    /// Matching lines also go there, unprefixed.
    pub duplicate: Option<Duplicate>,
}

/// A long line is written in pieces of this size (under the stream's lock, so it stays whole):
/// each piece counts as progress (`pump`), however slowly the console reads.
const PIECE: usize = 64 * 1024;

/// Writes `bytes` to `out` piece by piece, counting each piece in `progress`.
fn write_counted(
    out: &mut impl Write,
    bytes: &[u8],
    progress: &std::sync::atomic::AtomicU64,
) -> std::io::Result<()> {
    for piece in bytes.chunks(PIECE) {
        out.write_all(piece)?;
        progress.fetch_add(piece.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// Copies `stream` line by line to its destination until the worker closes it. Runs on a
/// thread of its own; returns when the stream ends (the worker and everything it started
/// have exited or closed it). `progress` grows with every piece read or written, so that
/// whoever waits for the pump can tell a slow one from a stuck one.
pub fn pump(
    stream: impl std::io::Read + Send + 'static,
    mut to: Destination,
    progress: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            progress.fetch_add(line.len() as u64, std::sync::atomic::Ordering::Relaxed);
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            if let Some(file) = to.file.as_mut() {
                let _ = write_counted(file, &line, &progress);
            }
            if let Some(dup) = &to.duplicate {
                let text = String::from_utf8_lossy(&line);
                if dup.filters.iter().any(|f| text.contains(f.as_str())) {
                    // As torchrun's filtered files: the line as the console shows it.
                    let prefix = to.console.as_ref().map_or("", |(p, _)| p.as_str());
                    if let Ok(mut file) = dup.file.lock() {
                        let _ = file.write_all(&[prefix.as_bytes(), &line].concat());
                    }
                }
            }
            if let Some((prefix, console)) = &to.console {
                let mut out = Vec::with_capacity(prefix.len() + line.len());
                out.extend_from_slice(prefix.as_bytes());
                out.extend_from_slice(&line);
                let _ = match console {
                    Console::Stdout => {
                        write_counted(&mut std::io::stdout().lock(), &out, &progress)
                    }
                    Console::Stderr => {
                        write_counted(&mut std::io::stderr().lock(), &out, &progress)
                    }
                };
            }
        }
    })
}

/// Opens a worker log file for appending (a group restarted for a membership change writes
/// on after the previous one).
pub fn log_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}
