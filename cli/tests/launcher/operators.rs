//! The operator commands on a running job: `rdzv status` (its table, `--json` and `--watch`),
//! `close`, `purge` and `drain`, by URL or by `rdzv run`'s own flags.

use crate::common::{self, Etcd};
use crate::support::{
    node_id, op_fails, op_ok, rdzv, status_json, unique_run_id, Scratch, WorkerLines, FAST,
};

#[test]
fn rdzv_close_ends_a_running_job() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("close", &format!("min_nodes=2&{FAST}"));
    let mut a = s.node(&url, &[], "hold");
    let mut b = s.node(&url, &[], "hold");
    a.start(30);
    b.start(30);
    let out = op_ok(&["close", &url]);
    assert!(out.contains("closed"), "{out}");
    for n in [&mut a, &mut b] {
        n.exits_with(0, 30);
        assert!(n.said("GOT TERM") && n.said("the run was closed"));
    }
    // A job started later under the closed id fails clearly instead of ending quietly.
    let err = op_fails(&["run", "--rdzv", &url, &s.worker(), "ok"], 1);
    assert!(err.contains("is closed"), "{err}");
}

#[test]
fn status_shows_members_and_a_crashed_run_goes_with_its_leases() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("status", &format!("min_nodes=2&{FAST}"));
    let mut watch = rdzv(&["status", "--watch", &url]);
    watch.wait_line(10, |l| l.contains("absent"));
    let mut a = s.node(&url, &[], "hold");
    let mut b = s.node(&url, &[], "hold");
    a.start(30);
    b.start(30);
    watch.wait_line(10, |l| l.contains("round 0 sealed: 2 member(s)"));
    let table = op_ok(&["status", &url]);
    assert!(table.contains("state    open"), "{table}");
    assert!(table.contains("RANK  NODE"), "{table}");
    assert_eq!(
        table
            .lines()
            .filter(|l| l.trim_end().ends_with("yes"))
            .count(),
        2,
        "{table}"
    );
    let json = status_json(&url);
    assert_eq!(json["sealed"]["members"].as_array().unwrap().len(), 2);
    assert_eq!(json["sealed"]["round"], 0);
    // purge refuses while members are alive.
    let err = op_fails(&["purge", &url], 1);
    assert!(err.contains("2 live node(s)"), "{err}");
    // Crash both nodes: nobody shuts down, yet the run's keys go with the nodes' leases and
    // the run's lease, which no node refreshes any more.
    a.signal(libc::SIGKILL);
    b.signal(libc::SIGKILL);
    a.died(10);
    b.died(10);
    watch.wait_line(15, |l| l.contains("run deleted from etcd"));
    let run = common::node::run_of(&url);
    common::wait_for_key_count(&etcd.endpoint(), &format!("/rdzv/{run}/"), |n| n == 0);
    assert_eq!(status_json(&url)["exists"], false);
    // What is left of a closed run is its marker, until `retention`: purge takes it now.
    op_ok(&["close", &url]);
    assert_eq!(status_json(&url)["closed"], true);
    let out = op_ok(&["purge", &url]);
    assert!(out.contains("purged"), "{out}");
    assert_eq!(status_json(&url)["exists"], false);
}

#[test]
fn status_takes_runs_flags_and_says_what_runs() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let id = unique_run_id("status-flags");
    let url = format!("etcd://{}/{id}?{FAST}", etcd.endpoint());
    let mut l = s.node(&url, &[], "hold");
    l.start(60);
    let by_url = op_ok(&["status", &url]);
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id_arg = format!("--rdzv_id={id}");
    let by_flags = op_ok(&[
        "status",
        &endpoint,
        &id_arg,
        "--rdzv-conf=last_call_timeout=1",
    ]);
    // The effective training time's line goes on with the wall clock between the two reads.
    let timeless = |out: &str| -> String {
        out.lines()
            .filter(|l| !l.starts_with("training "))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    assert_eq!(timeless(&by_url), timeless(&by_flags));
    assert!(by_url.contains(" running; "), "{by_url}");
    assert!(!by_url.contains("open for joining"), "{by_url}");
    op_fails(&["status"], 2);
    l.terminate();
}

/// `drain`, `close` and `purge` name the run as `rdzv run` does too, by --rdzv-endpoint,
/// --rdzv-id and --rdzv-conf instead of a URL (as `status` does); not by both at once.
#[test]
fn close_purge_and_drain_take_runs_flags_too() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let id = unique_run_id("ops-flags");
    let url = format!("etcd://{}/{id}?{FAST}", etcd.endpoint());
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id_arg = format!("--rdzv_id={id}");
    let run = [
        endpoint.as_str(),
        id_arg.as_str(),
        "--rdzv-conf=lease_ttl=2",
    ];
    let op_on_run = |command: &[&str], last: &[&str]| op_ok(&[command, &run, last].concat());

    let mut drained = s.node(&url, &[], "hold");
    drained.start(60);
    let node_id = node_id(&mut drained);
    let out = op_on_run(&["drain", "--reason", "maintenance"], &[&node_id]);
    assert!(out.contains("drained"), "{out}");
    drained.exits_with(0, 30);
    assert!(
        drained.said("this node was drained"),
        "{}",
        drained.output()
    );

    let mut closed = s.node(&url, &[], "hold");
    closed.start(60);
    let out = op_on_run(&["close"], &[]);
    assert!(out.contains("closed"), "{out}");
    closed.exits_with(0, 30);
    assert!(closed.said("the run was closed"), "{}", closed.output());

    let out = op_on_run(&["purge"], &[]);
    assert!(out.contains(&format!("run {id:?} purged")), "{out}");
    assert_eq!(status_json(&url)["exists"], false);
    op_fails(&["close", &endpoint, &url], 2);
}

#[test]
fn status_watch_shows_a_sigkilled_node_as_lost() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("watch-kill", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let mut watch = rdzv(&["status", "--watch", &url]);
    watch.wait_line(10, |l| l.contains("absent"));
    let mut a = s.node(&url, &[], "hold");
    let mut b = s.node(&url, &[], "hold");
    a.start(30);
    b.start(30);
    watch.wait_line(10, |l| l.contains("round 0 sealed: 2 member(s)"));
    // SIGKILL: nothing is released; the node's lease expires (lease_ttl 2 s).
    b.crash();
    let lost = watch.wait_line(20, |l| l.contains(") lost"));
    assert!(lost.contains("rank "), "{lost}");
    a.terminate();
}
