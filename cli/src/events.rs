//! The job's events and metrics, as torchelastic's agent records them (`--events-file`,
//! `--metrics-file`; `docs/EVENTS.md`): one JSON object a line, appended to a file or written
//! to stderr (`-`), in the shapes of torch's `Event.serialize()` and `MetricData`:
//!
//! ```text
//! {"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 1733100000123,
//!  "metadata": {"run_id": ..., "global_rank": 1, "group_rank": 0, "worker_id": "4242", ...}}
//! {"timestamp": 1733100000, "group": "torchelastic", "name": "workers.default.run_total", "value": 1}
//! ```
//!
//! Each line is one `write` of the whole line to a file opened for appending, so lines of
//! several launchers sharing a file do not mix.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Who an event is about, as torch's `EventSource`.
#[derive(Clone, Copy)]
pub enum Source {
    Agent,
    Worker,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Agent => "AGENT",
            Source::Worker => "WORKER",
        }
    }
}

enum Sink {
    Stderr,
    File(Mutex<std::fs::File>),
}

impl Sink {
    fn open(path: &Path) -> std::io::Result<Sink> {
        if path == Path::new("-") {
            return Ok(Sink::Stderr);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Sink::File(Mutex::new(file)))
    }

    /// One line, in one write. A failed write is said once on the console and not retried: the
    /// job goes on without its records rather than stopping for them.
    fn line(&self, value: &serde_json::Value) {
        let mut text = value.to_string();
        text.push('\n');
        let written = match self {
            Sink::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
            Sink::File(file) => file
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(text.as_bytes()),
        };
        if let Err(e) = written {
            crate::output::error(format_args!("cannot record an event: {e}"));
        }
    }
}

/// Where the job's events and metrics go; either may go nowhere.
pub struct Recorder {
    events: Option<Sink>,
    metrics: Option<Sink>,
}

fn millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Recorder {
    pub fn open(events: Option<&PathBuf>, metrics: Option<&PathBuf>) -> std::io::Result<Recorder> {
        Ok(Recorder {
            events: events.map(|p| Sink::open(p)).transpose()?,
            metrics: metrics.map(|p| Sink::open(p)).transpose()?,
        })
    }

    /// An event: torch's `Event(name, source, timestamp, metadata)`.
    pub fn event(&self, name: &str, source: Source, metadata: serde_json::Value) {
        if let Some(sink) = &self.events {
            sink.line(&serde_json::json!({
                "name": name,
                "source": source.name(),
                "timestamp": millis(),
                "metadata": metadata,
            }));
        }
    }

    /// A metric: torch's `put_metric(name, value)` in the `torchelastic` group.
    pub fn metric(&self, name: &str, value: i64) {
        if let Some(sink) = &self.metrics {
            sink.line(&serde_json::json!({
                "timestamp": millis() / 1000,
                "group": "torchelastic",
                "name": name,
                "value": value,
            }));
        }
    }
}
