//! Signals to the launcher: forwarded to every worker, the grace period and a second signal
//! that cuts it short, a SIGTERM at each step of re-forming, a SIGKILLed launcher's workers.

use crate::common::Etcd;
use crate::support::{
    child_pid, fields, formed, pid, status_json, wait_gone, Scratch, WorkerLines, FAST,
};
use std::time::{Duration, Instant};

/// A signal that lands as the launcher goes from stopping its workers to rejoining is pending
/// when its `next` starts, and the launcher cancels `next` before first polling it. That cancel
/// was lost, and the launcher then waited out `join_timeout` alone: a CI run hung this way.
#[test]
fn a_sigterm_as_the_launcher_rejoins_ends_it() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    // The signal lands in the gap about one time in four: twelve trials miss it rarely.
    for trial in 0..12 {
        eprintln!("trial {trial}"); // shown with the output of a failed trial
                                    // A join timeout far beyond the exit wait: a lost signal shows as a hang.
        let url = etcd.url(
            &format!("rejoin-signal-{trial}"),
            &format!("min_nodes=2&max_nodes=2&join_timeout=300&{FAST}"),
        );
        let (mut a, mut b) = (s.node(&url, &[], "hold"), s.node(&url, &[], "hold"));
        a.start(30);
        b.start(30);
        a.terminate();
        // b's worker says this as b stops it to re-form without a: b is about to rejoin.
        b.wait_line(30, |l| l.contains("GOT TERM"));
        b.terminate();
    }
}

/// A node SIGTERMed at each step of re-forming after a peer's loss exits by the signal (143),
/// as it does while its workers run: a scheduler must not take a terminated node for one
/// that finished. The steps: just after the loss, as it stops its workers, as it rejoins, and
/// once the new round formed.
#[test]
fn a_sigterm_at_each_step_of_re_forming_after_a_loss_exits_by_the_signal() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let steps = [
        None,
        Some("to form a new round"),
        Some("joining run"),
        Some("round 1 formed"),
    ];
    for (trial, step) in steps.into_iter().enumerate() {
        eprintln!("trial {trial}: SIGTERM at {step:?}"); // shown with a failed trial's output
                                                         // A last call long enough that both launchers join round 0 on a loaded machine (with
                                                         // 1 s the first once sealed it alone); a round of one waits it out once per trial.
        let url = etcd.url(
            &format!("reform-signal-{trial}"),
            "min_nodes=1&max_nodes=2&last_call_timeout=4&lease_ttl=2",
        );
        let mut nodes = s.nodes(2, &url, &[], "hold");
        formed(&mut nodes, 2, 30);
        let [a, b] = &mut nodes[..] else {
            unreachable!()
        };
        a.wait_line(30, |l| l.contains("joining run")); // its first join
        b.crash(); // its watchdog releases it: a sees the loss at once
        if let Some(step) = step {
            a.wait_line(30, |l| l.contains(step));
        }
        a.terminate();
    }
}

#[test]
fn sigterm_is_forwarded_to_every_worker_and_nothing_is_orphaned() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("signal", FAST);
    let mut l = s.node(&url, &["--nproc-per-node=2"], "hold");
    // Two workers, each with a child: their pids, in whatever order the lines arrive.
    let pids: Vec<i32> = (0..4)
        .map(|_| {
            let line = l.wait_line(30, |x| x.contains("START rank=") || x.contains("CHILD "));
            match line.contains("CHILD ") {
                true => child_pid(&line),
                false => pid(&fields(&line)),
            }
        })
        .collect();
    l.terminate();
    assert_eq!(l.lines_with("GOT TERM").count(), 2, "{}", l.output());
    for pid in pids {
        wait_gone(pid, 10);
    }
    let status = status_json(&url);
    assert_eq!(
        status["closed"], false,
        "a launcher leaving does not close the run"
    );
    assert_eq!(status["alive"], 0, "it released its node");
}

#[test]
fn a_worker_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--shutdown-timeout=1"], "stubborn");
    let pid = pid(&l.start(30));
    let child = child_pid(&l.wait_line(10, |x| x.contains("CHILD ")));
    l.terminate();
    assert!(l.said("SIGKILL"), "{}", l.output());
    wait_gone(pid, 10);
    wait_gone(child, 10);
}

#[test]
fn workers_die_with_a_launcher_killed_by_sigkill() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--nproc-per-node=2"], "hold");
    let pids = [pid(&l.start(30)), pid(&l.start(30))];
    l.crash();
    for pid in pids {
        wait_gone(pid, 10);
    }
}

#[test]
fn a_second_signal_cuts_the_grace_period_short() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--shutdown-timeout=600"], "stubborn");
    let pid = pid(&l.start(30));
    l.wait_line(10, |x| x.contains("CHILD "));
    l.signal(libc::SIGTERM);
    l.wait_line(10, |x| x.contains("forwarding it to the workers"));
    let second = Instant::now();
    l.signal(libc::SIGINT);
    l.exits_with(128 + libc::SIGTERM, 30);
    assert!(second.elapsed() < Duration::from_secs(10));
    assert!(
        l.said("still running after SIGINT: SIGKILL"),
        "{}",
        l.output()
    );
    wait_gone(pid, 10);
}

#[test]
fn signals_to_handle_adds_sigusr1_which_is_forwarded() {
    let s = Scratch::new();
    let mut l = s.standalone(&["--signals_to_handle=SIGTERM,SIGUSR1"], "hold");
    let f = l.start(30);
    assert_eq!(f["sigs"], "SIGTERM,SIGUSR1");
    l.wait_line(10, |x| x.starts_with("CHILD "));
    l.signal(libc::SIGUSR1);
    l.exits_with(128 + libc::SIGUSR1, 30);
    assert!(l.said("GOT USR1"), "{}", l.output());
    // An unknown name is a usage error, said at once.
    let mut bad = s.standalone(&["--signals-to-handle=SIGTERM,SIGNOPE"], "ok");
    bad.exits_with(2, 10);
    assert!(bad.said("--signals-to-handle"), "{}", bad.output());
}
