//! Logging: the one place that decides where the library's `tracing` records go.
//!
//! The rest of the library only calls `tracing` macros, with the fields an operator needs
//! (`run`, `node`, `round`). A Rust program that installs its own subscriber gets the records
//! there. Programs that use the C ABI (and so every binding) get rdzv's own subscriber,
//! installed when they first call rdzv, and only if the process has no global subscriber yet:
//! it keeps the records `RDZV_LOG` asks for (filter syntax of `tracing-subscriber`:
//! `RDZV_LOG=debug`, `RDZV_LOG=rdzv::rendezvous=trace`; warnings by default, see
//! `filter`) and hands each to the handler the host set with `set_handler`, or
//! writes it as one line to stderr.
//!
//! Invariants:
//! - A record is delivered on the thread that made it, before the code that made it goes on,
//!   so records made one after the other (as one node's are, whichever threads its tasks run
//!   on) arrive in the order they were made.
//! - No lock is held while a handler runs: a slow handler delays only the thread that called
//!   it, and a handler may call rdzv (even `set_handler`) without waiting for itself.
//! - A record made on a thread that is already inside the handler (the handler called rdzv,
//!   which logged) is dropped, so a handler never runs inside itself.
//! - Once `set_handler` returns, the previous handler is not running on any other thread and
//!   is never called again.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, Once, RwLock};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
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
    /// The message, then `name=value` for each field (values with spaces, quotes or `=` are
    /// double-quoted with Rust escapes): `round sealed run=job-1 node=ab12 round=3 ...`.
    pub line: &'a str,
}

/// Where records go when the host has set a handler.
pub type Handler = Arc<dyn Fn(&Record<'_>) + Send + Sync>;

/// A handler and the number of threads running it.
struct Slot {
    handler: Handler,
    running: AtomicUsize,
    /// Set once the slot was replaced: the last thread out wakes the replacing one.
    retired: AtomicBool,
}

static CURRENT: RwLock<Option<Arc<Slot>>> = RwLock::new(None);
/// Where `set_handler` waits for the threads still running the handler it replaced.
static DRAINED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
static INSTALL: Once = Once::new();

thread_local! {
    /// The slot whose handler this thread is running (null: none).
    static INSIDE: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
}

/// Sets (or with `None`, removes: records go to stderr again) the host's handler. When this
/// returns, the old handler is no longer running on any other thread and is never called
/// again. Called from inside the old handler, it returns once the other threads are out of
/// it; the calling thread finishes its own call.
pub fn set_handler(handler: Option<Handler>) {
    let new = handler.map(|handler| {
        Arc::new(Slot {
            handler,
            running: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
        })
    });
    let old = std::mem::replace(
        &mut *CURRENT.write().unwrap_or_else(|e| e.into_inner()),
        new,
    );
    let Some(old) = old else { return };
    old.retired.store(true, SeqCst);
    let mine = usize::from(INSIDE.with(Cell::get) == Arc::as_ptr(&old));
    let (lock, cvar) = &DRAINED;
    let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    while old.running.load(SeqCst) > mine {
        guard = cvar.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

/// Installs rdzv's subscriber for C ABI users, once per process, unless the process already
/// has a global subscriber (a Rust host's own).
pub fn install_default() {
    install(None);
}

/// As `install_default`, with the filter `spec` (`RDZV_LOG`'s syntax) instead of the
/// variable's: for a host that takes the level from a setting of its own (the `rdzv`
/// command reads torch's `LOGLEVEL` when `RDZV_LOG` is not set).
pub fn install_with(spec: &str) {
    install(Some(spec));
}

fn install(spec: Option<&str>) {
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry()
            .with(filter(spec))
            .with(HostLayer);
        // Fails only when a global subscriber exists already: then records go there.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// The filter `RDZV_LOG` asks for. A bare level is rdzv's own (`RDZV_LOG=debug` does not turn
/// on the debug records of the gRPC stack); other libraries keep warnings, as does every
/// module the variable does not name (`RDZV_LOG=rdzv::store=debug` adds to warnings). A level
/// below warnings (`error`, `off`) lowers everything. A variable that does not parse is
/// reported once and ignored.
fn filter(given: Option<&str>) -> EnvFilter {
    let spec = match given {
        Some(spec) => spec.to_string(),
        None => std::env::var(ENV_VAR).unwrap_or_default(),
    };
    EnvFilter::builder()
        .parse(directives(&spec))
        .unwrap_or_else(|err| {
            let _ = writeln!(
                std::io::stderr(),
                "rdzv: ignoring {ENV_VAR}={spec:?} ({err}); logging warnings only"
            );
            EnvFilter::new("warn")
        })
}

/// `RDZV_LOG`'s value as `EnvFilter` directives (see `filter`).
fn directives(spec: &str) -> String {
    let mut floor = LevelFilter::WARN;
    let mut directives = Vec::new();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        match d.parse::<LevelFilter>() {
            Ok(level) => {
                floor = floor.min(level);
                directives.push(format!("rdzv={level}"));
            }
            Err(_) => directives.push(d.to_string()),
        }
    }
    directives.insert(0, floor.to_string());
    directives.join(",")
}

/// Formats each event as one line and delivers it.
struct HostLayer;

impl<S: Subscriber> Layer<S> for HostLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        // Made by a handler calling rdzv: dropped (see the module's invariants).
        if !INSIDE.with(Cell::get).is_null() {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let text = match line.message.is_empty() {
            true => line.fields.trim_start().to_string(),
            false => line.message + &line.fields,
        };
        let meta = event.metadata();
        deliver(&Record {
            level: *meta.level(),
            target: meta.target(),
            line: &text,
        });
    }
}

fn deliver(record: &Record<'_>) {
    // Counted as running before the lock is released, so a set_handler that swaps the slot
    // right after either sees this thread in it or was seen by it first.
    let slot = CURRENT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|slot| {
            slot.running.fetch_add(1, SeqCst);
            slot.clone()
        });
    let Some(slot) = slot else {
        // One write of the whole line: `writeln!` on stderr (unbuffered) writes each piece on
        // its own, and a line of the program's own, between two pieces, cut this one in two.
        // Errors ignored: a closed or full stderr must not fail the caller.
        let line = format!(
            "{} rdzv {:>5} {}: {}\n",
            utc_now(),
            record.level,
            record.target,
            record.line
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        return;
    };
    // Restored, not cleared, afterwards: the value is this thread's, whatever ran before.
    let outer = INSIDE.with(|inside| inside.replace(Arc::as_ptr(&slot)));
    // A panicking handler (a bug in the host, or in a binding's glue) must not unwind through
    // rdzv's tasks: the record is dropped instead.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (slot.handler)(record)));
    INSIDE.with(|inside| inside.set(outer));
    slot.running.fetch_sub(1, SeqCst);
    if slot.retired.load(SeqCst) {
        // Every thread leaving a replaced slot wakes the replacing one, not only the last: a
        // set_handler called from inside the slot waits for the count to fall to one (itself),
        // not to zero. Taking the lock orders this wake-up after the waiter's check.
        let _guard = DRAINED.0.lock().unwrap_or_else(|e| e.into_inner());
        DRAINED.1.notify_all();
    }
}

/// Now, as `2026-01-31T23:59:59.123Z`, for the lines written to stderr.
fn utc_now() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    utc(since_epoch)
}

fn utc(since_epoch: std::time::Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm, proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since_epoch.subsec_millis()
    )
}

/// The message, then ` name=value` for every other field.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Line {
    fn field(&mut self, name: &str, value: &str) {
        let plain = !value.is_empty()
            && !value
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=');
        match plain {
            true => {
                let _ = write!(self.fields, " {name}={value}");
            }
            false => {
                let _ = write!(self.fields, " {name}={value:?}");
            }
        }
    }
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => self.field(name, &format!("{value:?}")),
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            name => self.field(name, value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{directives, utc, Line};
    use std::time::Duration;

    #[test]
    fn bare_levels_are_rdzvs_and_warnings_stay_on() {
        assert_eq!(directives(""), "warn");
        assert_eq!(directives("debug"), "warn,rdzv=debug");
        assert_eq!(directives("error"), "error,rdzv=error");
        assert_eq!(directives("OFF"), "off,rdzv=off");
        assert_eq!(
            directives("rdzv::rendezvous=trace, h2=debug"),
            "warn,rdzv::rendezvous=trace,h2=debug"
        );
        assert!(tracing_subscriber::EnvFilter::builder()
            .parse(directives("info,rdzv::store=trace"))
            .is_ok());
    }

    #[test]
    fn utc_times() {
        let at = |secs: u64, ms: u64| utc(Duration::from_secs(secs) + Duration::from_millis(ms));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_767_225_599, 123), "2025-12-31T23:59:59.123Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn values_that_would_split_a_line_are_quoted() {
        let mut line = Line::default();
        line.field("node", "ab12");
        line.field("error", "etcd at 127.0.0.1:1 did not answer");
        line.field("empty", "");
        line.field("eq", "a=b");
        assert_eq!(
            line.fields,
            r#" node=ab12 error="etcd at 127.0.0.1:1 did not answer" empty="" eq="a=b""#
        );
    }
}
