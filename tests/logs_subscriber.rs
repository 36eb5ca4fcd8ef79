//! A Rust program that installs its own `tracing` subscriber gets rdzv's records there, with
//! their fields, and keeps them even when it also sets a log handler as the C ABI does (rdzv
//! then installs nothing and calls no handler). A test binary of its own: the global subscriber is per process.

use rdzv_test_support as common;

use common::{on_threads, Etcd};
use rdzv::{BlockingRendezvous, Params};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// What the host's subscriber kept of one event.
#[derive(Debug)]
struct Kept {
    level: Level,
    target: String,
    fields: BTreeMap<String, String>,
}

struct Keep(Arc<Mutex<Vec<Kept>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: Subscriber> Layer<S> for Keep {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Kept {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            fields,
        });
    }
}

static HANDLER_CALLS: AtomicUsize = AtomicUsize::new(0);

/// What the C ABI's rdzv_set_log_handler does with a C function: rdzv's subscriber (unless
/// the host has one), then the handler.
fn set_a_handler() {
    rdzv::log::install_default();
    rdzv::log::set_handler(Some(Arc::new(|_: &rdzv::log::Record<'_>| {
        HANDLER_CALLS.fetch_add(1, Ordering::SeqCst);
    })));
}

#[test]
fn a_rust_host_gets_the_records_in_its_own_subscriber() {
    let kept = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Keep(kept.clone())),
    )
    .unwrap();
    // RDZV_LOG is for C ABI users: a Rust host's subscriber decides alone.
    std::env::set_var("RDZV_LOG", "off");
    set_a_handler();

    let etcd = Etcd::start();
    let url = etcd.url("subscriber", "min_nodes=2&max_nodes=2");
    let run = common::node::run_of(&url);
    let ids = on_threads(2, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        node.next().unwrap();
        let id = node.node_id().to_string();
        node.shutdown().unwrap();
        id
    });
    rdzv::log::set_handler(None);

    let kept = kept.lock().unwrap();
    let of = |msg: &str| -> Vec<&Kept> {
        kept.iter()
            .filter(|k| {
                k.fields.get("message").map(String::as_str) == Some(msg)
                    && k.fields.get("run") == Some(&run)
            })
            .collect()
    };
    for id in &ids {
        let joined: Vec<_> = of("joined round")
            .into_iter()
            .filter(|k| k.fields.get("node") == Some(id))
            .collect();
        assert_eq!(joined.len(), 1, "node {id}: {kept:#?}");
        assert_eq!(joined[0].fields["round"], "0");
        assert_eq!(joined[0].level, Level::INFO);
        assert_eq!(joined[0].target, "rdzv::rendezvous");
    }
    let connected = of("connected to etcd");
    assert_eq!(connected.len(), 2);
    assert!(connected[0].fields["etcd_version"].starts_with("3."));
    let sealed = of("round sealed");
    assert_eq!(sealed.len(), 1);
    assert_eq!(sealed[0].fields["trigger"], "max_nodes");
    assert_eq!(sealed[0].fields["world_size"], "2");
    assert_eq!(of("round complete").len(), 2);
    assert_eq!(HANDLER_CALLS.load(Ordering::SeqCst), 0);
}
