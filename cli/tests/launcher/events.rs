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
    let charged: Vec<&Value> = events
        .iter()
        .filter(|e| e["name"] == "rdzv.restart.charged")
        .collect();
    assert_eq!(charged.len(), 1, "{events:#?}");
    assert_eq!(charged[0]["metadata"]["restarts"], 1);
    assert_eq!(charged[0]["metadata"]["max_restarts"], 1);
    assert!(charged[0]["metadata"]["run_id"].is_string());

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

/// GET `path` from 127.0.0.1:`port`: the response's head and body, once something answers
/// (within 30 s).
fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            write!(
                c,
                "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut response = String::new();
            if c.read_to_string(&mut response).is_ok() {
                if let Some((head, body)) = response.split_once("\r\n\r\n") {
                    return (head.to_string(), body.to_string());
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing answers on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A port that was free a moment ago: bound, then closed.
fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}

/// A Prometheus server (Debian's `prometheus`) scraping 127.0.0.1:`target` every 200 ms, with
/// its data in `dir`; killed when dropped.
struct Prometheus {
    child: std::process::Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &std::path::Path, target: u16) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\nscrape_configs:\n  - job_name: rdzv\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus is needed (scripts/install-deps.sh installs Debian's prometheus)");
        Prometheus { child, port }
    }

    /// The first sample of the instant query `query` once it has one (within 30 s).
    fn sample(&self, query: &str) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let (_, body) = http_get(self.port, &format!("/api/v1/query?query={query}"));
            if let Ok(answer) = serde_json::from_str::<serde_json::Value>(&body) {
                if let Some(first) = answer["data"]["result"].get(0) {
                    return first.clone();
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Prometheus has no {query}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn metrics_port_serves_openmetrics_that_prometheus_scrapes() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("prom", &format!("min_nodes=1&max_nodes=1&{FAST}"));
    let port = free_port();
    let worker = s.worker();
    let port_text = port.to_string();
    let mut l = rdzv(&[
        "run",
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--metrics-port",
        &port_text,
        &worker,
        "hold",
    ]);
    l.start(30);
    l.start(30);
    let run_id = crate::common::node::run_of(&url);
    // The workers print START as soon as they run, which may be before the agent has set its
    // gauge after starting them: the page is read again until it shows them (within 10 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (head, text) = loop {
        let (head, text) = http_get(port, "/metrics");
        let running = text
            .lines()
            .any(|l| l.starts_with("rdzv_workers_running{") && l.ends_with(" 2"));
        if running || std::time::Instant::now() >= deadline {
            break (head, text);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let series = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"));
        assert!(line.contains(&format!("run_id=\"{run_id}\"")), "{line}");
        assert!(line.contains("role=\"default\""), "{line}");
        assert!(line.contains("node=\""), "{line}");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(series("rdzv_rounds_formed_total"), 1.0, "{text}");
    assert_eq!(series("rdzv_world_size"), 2.0, "{text}");
    assert_eq!(series("rdzv_nodes"), 1.0, "{text}");
    assert_eq!(series("rdzv_workers_running"), 2.0, "{text}");
    assert_eq!(series("rdzv_round_formation_seconds_count"), 1.0, "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    // A real scraper: Prometheus reads the page and answers queries on it.
    let prometheus = Prometheus::start(&s.dir, port);
    let up = prometheus.sample("up");
    assert_eq!(up["value"][1], "1", "the target is up: {up}");
    let rounds = prometheus.sample("rdzv_rounds_formed_total");
    assert_eq!(rounds["value"][1], "1", "{rounds}");
    assert_eq!(rounds["metric"]["run_id"], run_id.as_str(), "{rounds}");
    let running = prometheus.sample("rdzv_workers_running");
    assert_eq!(running["value"][1], "2", "{running}");
    l.terminate();
}

#[test]
fn rdzv_exporter_serves_every_run_on_one_etcd_to_prometheus() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let worker = s.worker();
    let urls: Vec<String> = (0..2)
        .map(|_| etcd.url("exported", &format!("min_nodes=1&max_nodes=1&{FAST}")))
        .collect();
    let mut jobs: Vec<_> = urls
        .iter()
        .map(|url| {
            let mut l = rdzv(&["run", "--rdzv", url, &worker, "hold"]);
            l.start(30);
            l
        })
        .collect();
    let runs: Vec<String> = urls
        .iter()
        .map(|u| crate::common::node::run_of(u))
        .collect();
    let mut exporter = rdzv(&["exporter", "--etcd", &etcd.endpoint(), "--port", "0"]);
    let said = exporter.wait_line(10, |l| l.contains("serving every run on "));
    let port: u16 = said
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {said:?}"));
    let page = |want: &dyn Fn(&str) -> bool| -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let (head, text) = http_get(port, "/metrics");
            assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{text}");
            if want(&text) {
                return text;
            }
            assert!(std::time::Instant::now() < deadline, "not yet:\n{text}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let series = |text: &str, name: &str, run: &str| -> Option<f64> {
        let head = format!("{name}{{run_id=\"{run}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&head))?;
        line.rsplit(' ').next()?.parse().ok()
    };
    let text = page(&|t| {
        runs.iter()
            .all(|r| series(t, "rdzv_job_members_alive", r) == Some(1.0))
    });
    for run in &runs {
        assert_eq!(series(&text, "rdzv_job_members", run), Some(1.0), "{text}");
        assert_eq!(series(&text, "rdzv_job_closed", run), Some(0.0), "{text}");
        assert_eq!(
            series(&text, "rdzv_job_nodes_waiting", run),
            Some(0.0),
            "{text}"
        );
    }
    assert!(text.contains("rdzv_exporter_runs 2"), "{text}");
    // A real scraper reads the page, every job's series labelled by its run.
    let prometheus = Prometheus::start(&s.dir, port);
    let up = prometheus.sample("up");
    assert_eq!(up["value"][1], "1", "the target is up: {up}");
    let alive = prometheus.sample(&format!("rdzv_job_members_alive{{run_id=\"{}\"}}", runs[1]));
    assert_eq!(alive["value"][1], "1", "{alive}");
    // A job closed by an operator shows as closed at the next scrape.
    crate::support::op_ok(&["close", &urls[0]]);
    jobs[0].exits_with(0, 30);
    page(&|t| {
        series(t, "rdzv_job_closed", &runs[0]) == Some(1.0)
            || series(t, "rdzv_job_members", &runs[0]).is_none()
    });
    jobs[1].terminate();
    exporter.crash();
}
