//! Log records reach a host's handler set through the C ABI (`rdzv_set_log_handler`) with the
//! fields an operator needs, and a flood of them from many threads neither deadlocks nor
//! reorders one node's records. Real etcd; one test, since the handler is process-wide.

mod common;

use common::{on_threads, Etcd};
use rdzv::ffi::{rdzv_log_level_t, rdzv_set_log_handler, rdzv_status_name};
use rdzv::{BlockingRendezvous, Params};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

struct Line {
    level: rdzv_log_level_t,
    target: String,
    text: String,
}

static LINES: Mutex<Vec<Line>> = Mutex::new(Vec::new());

unsafe extern "C" fn collect(
    level: rdzv_log_level_t,
    target: *const c_char,
    line: *const c_char,
    user_data: *mut c_void,
) {
    assert_eq!(user_data as usize, 0x5eed, "user_data comes back untouched");
    // Calling back into rdzv from the handler is allowed.
    assert!(!rdzv_status_name(0).is_null());
    let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string();
    LINES.lock().unwrap().push(Line {
        level,
        target: text(target),
        text: text(line),
    });
}

/// The value of `name=` in a record's line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
}

#[test]
fn records_reach_the_host_handler_with_run_node_and_round_and_stay_in_order() {
    std::env::set_var("RDZV_LOG", "debug");
    rdzv_set_log_handler(Some(collect), 0x5eed as *mut c_void);
    let etcd = Etcd::start();

    // One round of three nodes.
    let url = etcd.url("logs", "min_nodes=3&max_nodes=3");
    let run = common::node::run_of(&url);
    let ids = on_threads(3, {
        let url = url.clone();
        move |_| {
            let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
            node.next().unwrap();
            let id = node.node_id().to_string();
            node.shutdown().unwrap();
            id
        }
    });
    {
        let lines = LINES.lock().unwrap();
        let of_run = |msg: &str| -> Vec<&Line> {
            lines
                .iter()
                .filter(|l| l.text.starts_with(msg) && field(&l.text, "run") == Some(run.as_str()))
                .collect()
        };
        assert!(
            lines.iter().any(|l| l.text.starts_with("connected to etcd")
                && field(&l.text, "etcd_version").is_some_and(|v| v.starts_with("3."))),
            "a connect record with the server's version"
        );
        let complete = of_run("round complete");
        assert_eq!(complete.len(), 3, "one per node");
        for id in &ids {
            let mine: Vec<_> = complete
                .iter()
                .filter(|l| field(&l.text, "node") == Some(id))
                .collect();
            assert_eq!(mine.len(), 1, "node {id}");
            assert_eq!(field(&mine[0].text, "round"), Some("0"));
            assert_eq!(field(&mine[0].text, "world_size"), Some("3"));
            assert_eq!(mine[0].level, rdzv_log_level_t::RDZV_LOG_INFO);
            assert_eq!(mine[0].target, "rdzv::rendezvous");
        }
        let sealed = of_run("round sealed");
        assert_eq!(sealed.len(), 1, "one leader seals");
        assert!(
            sealed[0].text.contains(" trigger=max_nodes "),
            "{}",
            sealed[0].text
        );
        assert_eq!(of_run("joined round").len(), 3);
        assert_eq!(
            of_run("joined round")
                .iter()
                .filter(|l| field(&l.text, "role") == Some("leader"))
                .count(),
            1
        );
    }

    // A flood: 8 nodes on threads, 15 rounds each, at debug; every node's records must come
    // in the order it made them (joined r before complete r, rounds increasing).
    let url = etcd.url("flood", "min_nodes=8&max_nodes=8");
    let run = common::node::run_of(&url);
    on_threads(8, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        for _ in 0..15 {
            node.next().unwrap();
        }
        node.shutdown().unwrap();
    });
    let lines = LINES.lock().unwrap();
    let mut by_node: HashMap<&str, Vec<(&str, u64)>> = HashMap::new();
    for l in lines
        .iter()
        .filter(|l| field(&l.text, "run") == Some(run.as_str()))
    {
        let kind = if l.text.starts_with("joined round") {
            "joined"
        } else if l.text.starts_with("round complete") {
            "complete"
        } else {
            continue;
        };
        let round = field(&l.text, "round").unwrap().parse().unwrap();
        by_node
            .entry(field(&l.text, "node").unwrap())
            .or_default()
            .push((kind, round));
    }
    assert_eq!(by_node.len(), 8);
    for (node, seq) in by_node {
        let expected: Vec<(&str, u64)> = (0..15)
            .flat_map(|r| [("joined", r), ("complete", r)])
            .collect();
        assert_eq!(seq, expected, "node {node}: records out of order");
    }
    drop(lines);
    rdzv_set_log_handler(None, std::ptr::null_mut());
}
