//! A worker that fails: restarts spent from the budget, a run closed when it is spent, and the
//! failure report (the root cause, its error file, a signal by name).

use crate::common::Etcd;
use crate::support::{num, op_ok, rdzv, rdzv_env, status_json, Scratch, WorkerLines, FAST};
use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_worker_that_always_fails_spends_the_budget_and_closes_the_run() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("budget", &format!("min_nodes=2&max_nodes=2&{FAST}"));
    let mut healthy = s.node(&url, &["--max-restarts=2"], "hold");
    let mut failing = s.node(&url, &["--max-restarts=2"], "errfile");
    let mut restarts = Vec::new();
    let mut rank = 0;
    for _ in 0..3 {
        let f = failing.start(60);
        restarts.push(num(&f, "restart"));
        rank = num(&f, "rank");
    }
    assert_eq!(restarts, [0, 1, 2]);
    // Which node joins first, and so runs rank 0, is a race between the two launchers.
    let root_cause = format!("rank {rank} ");
    failing.exits_with(1, 60);
    let out = failing.output();
    assert!(out.contains("restart budget spent (2 of 2"), "{out}");
    let report = failing.line_with("first failure");
    assert!(report.contains("exit code 7"), "{report}");
    let errfile = failing.line_with("error file");
    assert!(
        errfile.contains("error.json") && errfile.contains("ValueError: boom"),
        "{errfile}"
    );
    let path = errfile
        .split("error file ")
        .nth(1)
        .unwrap()
        .split(": ")
        .next()
        .unwrap();
    assert!(
        PathBuf::from(path).is_file(),
        "the reported error file is kept: {path}"
    );
    // The other node restarted with it each time (a membership change for it, no budget
    // spent), then answered that it was alive, heard that the job failed, ended its workers
    // gracefully and failed too: a scheduler sees the job's failure on every node.
    healthy.exits_with(1, 30);
    assert!(healthy.said("GOT TERM"));
    assert!(
        healthy.said(&format!("the job failed on another node: {root_cause}"))
            && healthy.said("exit code 7"),
        "{}",
        healthy.output()
    );
    let status = status_json(&url);
    assert_eq!(status["closed"], true);
    let failure = status["failure"].as_str().unwrap_or_default();
    assert!(failure.contains("exit code 7"), "{status}");
    let shown = op_ok(&["status", &url]);
    assert!(
        shown.contains(&format!("closed: the job failed ({root_cause}")),
        "{shown}"
    );
}

#[test]
fn a_worker_that_fails_once_is_restarted_and_the_job_succeeds() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("once", FAST);
    let mut l = s.node(
        &url,
        &["--nproc-per-node=2", "--max-restarts=1"],
        "fail-once",
    );
    l.exits_with(0, 60);
    assert!(l.said("restarting the worker group (restart 1 of 1)"));
    // The first group may be stopped before its second worker prints anything; the restarted
    // group runs to its end.
    let second = l
        .lines_with("START rank=")
        .filter(|x| x.contains("restart=1"));
    assert_eq!(second.count(), 2, "both workers ran again: {}", l.output());
    assert!(l.said("restart=0"));
    assert_eq!(
        status_json(&url)["closed"],
        false,
        "success does not close the run"
    );
}

#[test]
fn a_worker_killed_by_a_signal_is_reported_by_the_signal_name() {
    let mut l = rdzv(&[
        "run",
        "--standalone",
        "--no-python",
        "sh",
        "-c",
        "kill -SEGV $$",
    ]);
    l.exits_with(1, 30);
    let report = l.line_with("first failure");
    assert!(
        report.contains("rank 0") && report.contains("signal SIGSEGV"),
        "{report}"
    );
}

#[test]
fn the_failure_report_names_the_root_cause_and_copies_its_error_file() {
    let s = Scratch::new();
    let own = s.path("scheduler/error.json");
    let w = s.worker();
    let mut l = rdzv_env(
        &["run", "--standalone", "--nproc-per-node=2", &w, "errfile1"],
        &[("TORCHELASTIC_ERROR_FILE", own.to_str().unwrap())],
    );
    l.exits_with(1, 60);
    for line in [
        "worker.sh FAILED",
        "<NO_OTHER_FAILURES>",
        "Root Cause (first observed failure):",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 7 (pid: ",
        "  traceback : Traceback (most recent call last):",
        "    ValueError: boom",
        "stopped by the launcher after the failure: rank 0",
    ] {
        assert!(l.said(line), "no {line:?} in:\n{}", l.output());
    }
    // torchrun's block is unprefixed, line for line, as tools parse it.
    let out = l.output();
    let block: Vec<&str> = out
        .lines()
        .skip_while(|x| !x.ends_with("/worker.sh FAILED"))
        .skip(1)
        .take(6)
        .collect();
    let thin = "-".repeat(60);
    assert_eq!(
        block,
        [
            &thin,
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            &thin,
            "Root Cause (first observed failure):",
            "[0]:",
        ],
        "{out}"
    );
    // torchrun's host is socket.getfqdn().
    let fqdn = Command::new("python3")
        .args(["-c", "import socket; print(socket.getfqdn())"])
        .output()
        .unwrap();
    let fqdn = String::from_utf8(fqdn.stdout).unwrap();
    let host = l.line_with("  host      : ");
    assert_eq!(host, format!("  host      : {}", fqdn.trim()));
    let time = l.line_with("  time      : ");
    assert!(time.contains('_') && time.contains('-'), "{time}");
    let copied: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
    assert_eq!(copied["message"]["message"], "ValueError: boom", "{copied}");
    assert_eq!(copied["message"]["errorCode"], 7, "{copied}");

    // A worker that wrote no error file: the launcher writes one of its own there.
    let _ = std::fs::remove_file(&own);
    let mut l = rdzv_env(
        &["run", "--standalone", &w, "fail", "3"],
        &[("TORCHELASTIC_ERROR_FILE", own.to_str().unwrap())],
    );
    l.exits_with(1, 60);
    assert!(l.said("  error_file: <N/A>"), "{}", l.output());
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
    assert_eq!(written["message"]["errorCode"], 3, "{written}");
    // torchrun's exitcode line: the signal's name after the pid, a space before it either way.
    assert!(
        l.lines_with("  exitcode  : 3 (pid: ")
            .any(|x| x.ends_with(") ")),
        "{}",
        l.output()
    );
    let mut l = rdzv(&["run", "--standalone", &w, "signal", "SEGV"]);
    l.exits_with(1, 60);
    let line = l.line_with("  exitcode  : -11 (pid: ");
    assert!(line.ends_with(")  (SIGSEGV)"), "{line:?}");
    assert!(
        l.said("  traceback : Signal 11 (SIGSEGV) received by PID"),
        "{}",
        l.output()
    );
}
