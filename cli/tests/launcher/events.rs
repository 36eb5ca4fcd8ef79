//! `--events-file` and `--metrics-file`: a job with a failure, a restart and a success records
//! torchelastic's events (names, source, every metadata field of the seed agent's
//! `_construct_event`) and metrics (`_record_metrics`), and rdzv's own.

use crate::common::Etcd;
use crate::support::{rdzv, Scratch, WorkerLines, FAST};
use serde_json::Value;
use std::collections::BTreeSet;

/// The metadata fields of torchelastic's worker and agent events.
const SEED_FIELDS: [&str; 12] = [
    "run_id",
    "global_rank",
    "group_rank",
    "worker_id",
    "role",
    "hostname",
    "state",
    "total_run_time",
    "rdzv_backend",
    "raw_error",
    "metadata",
    "agent_restarts",
];

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn a_failure_a_restart_and_a_success_are_recorded_as_torchelastic_records_them() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("events", &format!("min_nodes=1&max_nodes=1&{FAST}"));
    let (events, metrics) = (s.path("events.jsonl"), s.path("metrics.jsonl"));
    let worker = s.worker();
    let mut l = rdzv(&[
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--events-file",
        events.to_str().unwrap(),
        "--metrics-file",
        metrics.to_str().unwrap(),
        &worker,
        "fail-once",
    ]);
    l.exits_with(0, 60);

    let events = lines(&events);
    let worker_events: Vec<&Value> = events.iter().filter(|e| e["source"] == "WORKER").collect();
    for e in events
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("torchelastic."))
    {
        let fields: BTreeSet<&str> = e["metadata"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(fields, SEED_FIELDS.into_iter().collect(), "{e}");
        assert!(e["timestamp"].as_u64().unwrap() > 0, "{e}");
        let state = e["metadata"]["state"].as_str().unwrap();
        assert_eq!(
            e["name"],
            format!("torchelastic.worker.status.{state}"),
            "{e}"
        );
        assert_eq!(e["metadata"]["rdzv_backend"], "etcd-v3", "{e}");
        assert_eq!(e["metadata"]["role"], "default", "{e}");
        let md: Value = serde_json::from_str(e["metadata"]["metadata"].as_str().unwrap()).unwrap();
        assert_eq!(md["group_world_size"], 1, "{md}");
        assert!(
            md["entry_point"].as_str().unwrap().contains("worker.sh"),
            "{md}"
        );
    }
    // The first attempt fails on both ranks (each fails, or is stopped after the other did),
    // and costs the one restart; the second succeeds.
    let of = |state: &str, restarts: u64| -> BTreeSet<u64> {
        worker_events
            .iter()
            .filter(|e| {
                e["metadata"]["state"] == state && e["metadata"]["agent_restarts"] == restarts
            })
            .map(|e| e["metadata"]["global_rank"].as_u64().unwrap())
            .collect()
    };
    let first: BTreeSet<u64> = of("FAILED", 0)
        .union(&of("TERMINATED", 0))
        .copied()
        .collect();
    assert_eq!(first, BTreeSet::from([0, 1]), "{events:#?}");
    assert!(!of("FAILED", 0).is_empty(), "{events:#?}");
    assert_eq!(of("SUCCEEDED", 1), BTreeSet::from([0, 1]), "{events:#?}");
    for e in &worker_events {
        let md: Value = serde_json::from_str(e["metadata"]["metadata"].as_str().unwrap()).unwrap();
        assert!(md["local_rank"][0].is_u64(), "{md}");
        assert!(
            e["metadata"]["worker_id"]
                .as_str()
                .unwrap()
                .parse::<u32>()
                .is_ok(),
            "{e}"
        );
    }
    let agent: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["source"] == "AGENT" && e["name"].as_str().unwrap().starts_with("torchelastic.")
        })
        .collect();
    assert_eq!(agent.len(), 1, "{events:#?}");
    assert_eq!(agent[0]["name"], "torchelastic.worker.status.SUCCEEDED");
    assert!(agent[0]["metadata"]["global_rank"].is_null());
    let formed = events
        .iter()
        .filter(|e| e["name"] == "rdzv.round.formed")
        .count();
    assert_eq!(formed, 2, "a round for each attempt: {events:#?}");

    let metrics = lines(&metrics);
    let last = |name: &str| -> i64 {
        metrics
            .iter()
            .rev()
            .find(|m| m["name"] == format!("workers.default.{name}"))
            .unwrap_or_else(|| panic!("no {name}: {metrics:#?}"))["value"]
            .as_i64()
            .unwrap()
    };
    assert!(metrics.iter().all(|m| m["group"] == "torchelastic"));
    assert_eq!(last("run_total"), 1);
    assert_eq!(last("run_success_with_retries"), 1);
    assert_eq!(last("run_success_no_retries"), 0);
    assert_eq!(last("run_failed_with_retries"), 0);
    assert_eq!(last("run_failed_no_retries"), 0);
    // torch: 100 - 100 * (remaining restarts + 1) / (max restarts + 1), with none remaining.
    assert_eq!(last("flakiness"), 50);
    assert_eq!(last("remaining_restarts"), 0);
    assert!(metrics
        .iter()
        .any(|m| m["name"] == "workers.default.remaining_restarts" && m["value"] == 1));
    assert_eq!(last("FAILED"), 1);
    assert_eq!(last("SUCCEEDED"), 1);
}
