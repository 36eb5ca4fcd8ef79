//! rdzv's log records in this test process: one global subscriber, installed by the first test
//! that asks, keeps every record of rdzv's own targets (every level) as text, each field as
//! `name=value`. Tests share the process, so each looks only for the records of its own run.
//! A process that tests the library's default subscriber (`tests/logs*.rs`) must not use it.

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub struct Records {
    lines: Mutex<Vec<String>>,
    added: Condvar,
}

struct Keep(&'static Records);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Keep {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields<'a>(&'a mut String);
        impl tracing::field::Visit for Fields<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={v:?}", field.name()));
            }
        }
        let mut line = String::new();
        event.record(&mut Fields(&mut line));
        self.0
            .lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
        self.0.added.notify_all();
    }
}

/// The process's records, the subscriber installed on first use. Only rdzv's targets are
/// enabled, so the gRPC stack's trace records cost the other tests nothing.
pub fn records() -> &'static Records {
    static RECORDS: OnceLock<&'static Records> = OnceLock::new();
    RECORDS.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let records: &'static Records = Box::leak(Box::new(Records {
            lines: Mutex::new(Vec::new()),
            added: Condvar::new(),
        }));
        let rdzv_only =
            tracing_subscriber::filter::filter_fn(|meta| meta.target().starts_with("rdzv"));
        let subscriber = tracing_subscriber::registry().with(Keep(records).with_filter(rdzv_only));
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        records
    })
}

impl Records {
    /// How many records there are: `await_line` looks only at later ones.
    pub fn mark(&self) -> usize {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Every record so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits (at most 20 s) for a record after `since` that names `run` and contains `what`.
    pub fn await_line(&self, since: usize, run: &str, what: &str) {
        let give_up = Instant::now() + Duration::from_secs(20);
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if lines[since..]
                .iter()
                .any(|l| l.contains(run) && l.contains(what))
            {
                return;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no record {what:?} of run {run}");
            lines = self.added.wait_timeout(lines, left).unwrap().0;
        }
    }
}
