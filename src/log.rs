//! Logging: the one place that decides where the library's `tracing` records go.
//!
//! The rest of the library only calls `tracing` macros, with the fields an operator needs
//! (`run`, `node`, `round`). A Rust program that installs its own subscriber gets the records
//! there. Programs that use the C ABI (and so every binding) get rdzv's own subscriber,
//! installed when they create their first parameters or handle, and only if the process has
//! no global subscriber yet: it keeps records at or above the level `RDZV_LOG` asks for
//! (filter syntax of `tracing-subscriber`: `RDZV_LOG=debug`, `RDZV_LOG=rdzv::rendezvous=trace`;
//! default `warn`) and hands each to the handler the host set with `rdzv_set_log_handler`, or
//! writes it as one line to stderr.
//!
//! Records are delivered on the thread that made them, in the order that thread made them,
//! so one node's records never overtake each other.

use std::fmt::Write as _;
use std::sync::{Arc, Once, RwLock};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{EnvFilter, Layer};

/// The variable that sets the filter.
pub const ENV_VAR: &str = "RDZV_LOG";

/// One record, as handed to a host's handler.
pub struct Record<'a> {
    pub level: Level,
    /// The module that made it (`rdzv::rendezvous`, ...).
    pub target: &'a str,
    /// The message followed by its fields: `round sealed run=job-1 node=ab12 round=3 ...`.
    pub line: &'a str,
}

/// Where records go when the host has set a handler.
pub type Handler = Arc<dyn Fn(&Record<'_>) + Send + Sync>;

static HANDLER: RwLock<Option<Handler>> = RwLock::new(None);
static INSTALL: Once = Once::new();

/// Sets (or with `None`, removes) the host's handler. When this returns, the old handler is
/// no longer running and will not be called again (records in flight finish first).
pub fn set_handler(handler: Option<Handler>) {
    *HANDLER.write().unwrap_or_else(|e| e.into_inner()) = handler;
}

/// Installs rdzv's subscriber for C ABI users, once per process, unless the process already
/// has a global subscriber (a Rust host's own).
pub fn install_default() {
    INSTALL.call_once(|| {
        let filter = EnvFilter::try_from_env(ENV_VAR).unwrap_or_else(|_| EnvFilter::new("warn"));
        let subscriber = tracing_subscriber::registry().with(filter).with(HostLayer);
        // Fails only when a global subscriber exists already: then records go there.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Formats each event as one line and delivers it.
struct HostLayer;

impl<S: Subscriber> Layer<S> for HostLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        line.text.push_str(line.fields.trim_start()); // an event without a message
        let meta = event.metadata();
        let record = Record {
            level: *meta.level(),
            target: meta.target(),
            line: &line.text,
        };
        deliver(&record);
    }
}

fn deliver(record: &Record<'_>) {
    let handler = HANDLER.read().unwrap_or_else(|e| e.into_inner());
    match handler.as_ref() {
        // A panicking handler (a bug in the host, or in a binding's glue) must not unwind
        // through rdzv's tasks: the record is dropped instead.
        Some(h) => {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(record)));
        }
        None => eprintln!(
            "rdzv {:>5} {}: {}",
            record.level, record.target, record.line
        ),
    }
}

/// The message, then `name=value` for every other field.
#[derive(Default)]
struct Line {
    text: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
        self.flush_fields();
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.text.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
        self.flush_fields();
    }
}

impl Line {
    /// Keeps the message first whatever order the fields come in.
    fn flush_fields(&mut self) {
        if !self.text.is_empty() && !self.fields.is_empty() {
            self.text.push_str(&std::mem::take(&mut self.fields));
        }
    }
}
