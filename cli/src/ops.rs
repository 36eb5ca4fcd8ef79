//! The operator commands: `status` (a table, `--json`, `--watch`), `close`, `purge` and
//! `drain`, all on the library's `admin` module (the calls the C ABI's `rdzv_admin_*` make),
//! so they never read etcd keys themselves. Each names its run by URL or by `rdzv run`'s
//! flags (`args::ops::NamedRun`).

use crate::args::ops::{CloseArgs, DrainArgs, NamedRun, PurgeArgs, StatusArgs};
use crate::exit::{Exit, Usage};
use crate::output::{error, result};
use rdzv::admin::{Admin, EtcdAlarm, Purge, RunStatus};
use rdzv::Params;

/// Connects to the run `run` names; `command` is the subcommand, for a usage error's pointer
/// to its help.
async fn connect(run: &NamedRun, command: &str) -> Result<Admin, Exit> {
    let url = run.url().map_err(|Usage(message)| {
        error(format_args!("{message} (see rdzv {command} --help)"));
        Exit::Usage
    })?;
    let params = Params::from_url(&url).map_err(|e| {
        error(format_args!("URL: {}", e.message()));
        Exit::Usage
    })?;
    Admin::connect(params).await.map_err(|e| {
        error(e.message());
        Exit::Failure
    })
}

pub async fn status(a: StatusArgs) -> Exit {
    let admin = match connect(&a.run, "status").await {
        Ok(admin) => admin,
        Err(code) => return code,
    };
    if !a.watch {
        return match admin.status().await {
            Ok(s) => {
                match a.json {
                    true => result(with_incidents(&s)),
                    false => table(&s).iter().for_each(result),
                }
                Exit::Success
            }
            Err(e) => {
                error(e.message());
                Exit::Failure
            }
        };
    }
    let mut watch = admin.watch();
    let mut before: Option<RunStatus> = None;
    loop {
        let now = match watch.next().await {
            Ok(s) => s,
            Err(e) => {
                error(e.message());
                return Exit::Failure;
            }
        };
        match a.json {
            true => result(with_incidents(&now)),
            false => result(format_args!(
                "{} {}",
                clock(),
                changes(before.as_ref(), &now)
            )),
        }
        before = Some(now);
    }
}

pub async fn close(a: CloseArgs) -> Exit {
    let admin = match connect(&a.run, "close").await {
        Ok(admin) => admin,
        Err(code) => return code,
    };
    match admin.close().await {
        Ok(()) => {
            result(format_args!(
                "run {:?} closed: its launchers stop their workers and exit",
                admin.params().run_id()
            ));
            Exit::Success
        }
        Err(e) => {
            error(e.message());
            Exit::Failure
        }
    }
}

pub async fn purge(a: PurgeArgs) -> Exit {
    let admin = match connect(&a.run, "purge").await {
        Ok(admin) => admin,
        Err(code) => return code,
    };
    let run = admin.params().run_id().to_string();
    match admin.purge(a.force).await {
        Ok(Purge::Deleted(0)) => {
            result(format_args!("run {run:?}: nothing in etcd to purge"));
            Exit::Success
        }
        Ok(Purge::Deleted(n)) => {
            result(format_args!("run {run:?} purged: {n} keys deleted"));
            Exit::Success
        }
        Ok(Purge::Refused { alive, lease_live }) => {
            let why = match (alive, lease_live) {
                (0, _) => "its lease is still refreshed by its nodes".to_string(),
                (n, _) => format!("it has {n} live node(s)"),
            };
            error(format_args!(
                "run {run:?} is running ({why}): not purging a running job (--force deletes anyway)"
            ));
            Exit::Failure
        }
        Err(e) => {
            error(e.message());
            Exit::Failure
        }
    }
}

pub async fn drain(a: DrainArgs) -> Exit {
    let admin = match connect(&a.run, "drain").await {
        Ok(admin) => admin,
        Err(code) => return code,
    };
    match admin.drain(&a.node_id, &a.reason).await {
        Ok(()) => {
            result(format_args!(
                "node {} of run {:?} drained: the others re-form without it, its launcher stops its workers and exits",
                a.node_id,
                admin.params().run_id()
            ));
            Exit::Success
        }
        Err(e) => {
            error(e.message());
            match e.kind() {
                rdzv::ErrorKind::InvalidArgument => Exit::Usage,
                _ => Exit::Failure,
            }
        }
    }
}

/// The status as aligned text, one line per item.
fn table(s: &RunStatus) -> Vec<String> {
    let mut lines = vec![format!("run      {}", s.run_id)];
    // First: while it lasts, nothing below can change.
    for alarm in &s.alarms {
        lines.push(format!("alarm    etcd: {}: {}", alarm, alarm_advice(alarm)));
    }
    if !s.exists {
        lines.push("state    absent (never started, finished and cleaned up, or purged)".into());
        return lines;
    }
    lines.push(match (&s.failure, s.closed) {
        (Some(why), _) => format!("state    closed: the job failed ({why})"),
        (None, true) => "state    closed".into(),
        (None, false) => "state    open".into(),
    });
    // The open round is the next one; while a sealed round runs and nobody waits, nothing is
    // being joined: say what is running.
    lines.push(match (&s.sealed, s.waiting.len()) {
        (Some(sealed), 0) if !s.closed => format!(
            "round    {} running; {} live node(s); round {} opens when a node joins or leaves",
            sealed.round, s.alive, s.open_round
        ),
        (Some(sealed), 0) => format!(
            "round    {} was the last; {} live node(s)",
            sealed.round, s.alive
        ),
        (_, 0) => format!(
            "round    {} open for joining; {} live node(s)",
            s.open_round, s.alive
        ),
        (_, n) => format!(
            "round    {} forming: {n} node(s) joined; {} live node(s)",
            s.open_round, s.alive
        ),
    });
    match &s.sealed {
        None => lines.push("sealed   none yet".into()),
        Some(sealed) => {
            lines.push(format!(
                "sealed   round {}: {} member(s), master {}:{}",
                sealed.round,
                sealed.members.len(),
                sealed.master_addr,
                sealed.master_port
            ));
            let width = sealed
                .members
                .iter()
                .map(|m| m.addr.as_deref().unwrap_or("-").len())
                .max()
                .unwrap_or(0)
                .max("ADDRESS".len());
            lines.push(format!(
                "  RANK  NODE              {:width$}  ALIVE",
                "ADDRESS"
            ));
            for m in &sealed.members {
                lines.push(format!(
                    "  {:<4}  {:<16}  {:width$}  {}",
                    m.rank,
                    m.node,
                    m.addr.as_deref().unwrap_or("-"),
                    match (m.alive, m.draining) {
                        (true, false) => "yes",
                        (true, true) => "yes (draining)",
                        (false, _) => "no (lost)",
                    }
                ));
            }
        }
    }
    let waiting: Vec<String> = s
        .waiting
        .iter()
        .map(|j| match j.member_rank {
            Some(rank) => format!("{} ({}, member rank {rank})", j.node, j.addr),
            None => format!("{} ({})", j.node, j.addr),
        })
        .collect();
    lines.push(format!(
        "waiting  {}{}",
        waiting.len(),
        if waiting.is_empty() {
            String::new()
        } else {
            format!(": {}", waiting.join(", "))
        }
    ));
    let lost: Vec<String> = s
        .lost()
        .iter()
        .map(|m| format!("rank {} ({})", m.rank, m.node))
        .collect();
    lines.push(format!(
        "lost     {}{}",
        lost.len(),
        if lost.is_empty() {
            String::new()
        } else {
            format!(": {}", lost.join(", "))
        }
    ));
    // What the nodes left for an operator in the run's store (`notes/`), one line each, in
    // key order.
    for (key, value) in s.notes.iter().filter(|(k, _)| !k.starts_with("incident/")) {
        lines.push(format!("note     {key}: {}", one_line(value)));
    }
    lines.extend(incidents(s).lines());
    // Nodes much slower than the median (their launchers' `pace/` notes).
    for slow in crate::monitor::pace::stragglers(&s.notes) {
        lines.push(format!(
            "slow     {}: {:.3} s per step, {:.1}x the median node's {:.3} s",
            slow.host,
            slow.step.as_secs_f64(),
            slow.step.as_secs_f64() / slow.median.as_secs_f64(),
            slow.median.as_secs_f64()
        ));
    }
    lines
}

/// The run's incidents and effective training time, from its notes (`crate::incidents`).
fn incidents(s: &RunStatus) -> crate::incidents::Summary {
    let round = s.sealed.as_ref().map(|r| r.round);
    crate::incidents::Summary::read(&s.notes, round, crate::incidents::wall_ms())
}

/// `--json`: the library's status, with the incidents read from its notes.
fn with_incidents(s: &RunStatus) -> serde_json::Value {
    let mut json = s.to_json();
    json["incidents"] = incidents(s).to_json();
    json
}

/// A note's value on one line: line breaks and other control characters escaped.
fn one_line(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// What an etcd alarm means for the run, and where the operator's way out is written.
fn alarm_advice(alarm: &EtcdAlarm) -> &'static str {
    match alarm.alarm.as_str() {
        "NOSPACE" => {
            "etcd's database reached its quota and it refuses every write (no round forms, \
             no store write) until an operator compacts, defragments and disarms the alarm \
             (OPERATIONS.md in rdzv's docs)"
        }
        "CORRUPT" => "a member's data differs from the others': etcd refuses requests",
        _ => "see etcdctl alarm list",
    }
}

/// One line saying what changed from `before` to `now` (or the state, the first time).
fn changes(before: Option<&RunStatus>, now: &RunStatus) -> String {
    let summary = |s: &RunStatus| {
        let sealed = match &s.sealed {
            Some(r) => format!(
                "round {} sealed with {} member(s) ({} alive)",
                r.round,
                r.members.len(),
                r.members.iter().filter(|m| m.alive).count()
            ),
            None => "no round sealed".into(),
        };
        let alarms: String = s
            .alarms
            .iter()
            .map(|a| format!(", etcd alarm {a}"))
            .collect();
        format!(
            "{}: {}, {sealed}, {} waiting, {} lost{alarms}",
            s.run_id,
            match (s.exists, s.closed) {
                (false, _) => "absent",
                (true, true) => "closed",
                (true, false) => "open",
            },
            s.waiting.len(),
            s.lost().len()
        )
    };
    let Some(b) = before else {
        return summary(now);
    };
    let mut said = Vec::new();
    for a in now.alarms.iter().filter(|a| !b.alarms.contains(a)) {
        said.push(format!("etcd alarm {a}: {}", alarm_advice(a)));
    }
    for a in b.alarms.iter().filter(|a| !now.alarms.contains(a)) {
        said.push(format!("etcd alarm {a} cleared"));
    }
    if b.exists != now.exists {
        said.push(match now.exists {
            true => "run appeared in etcd".to_string(),
            false => "run deleted from etcd".to_string(),
        });
    }
    if b.closed != now.closed || b.failure != now.failure {
        said.push(match (now.closed, &now.failure) {
            (true, Some(why)) => format!("run closed: the job failed ({why})"),
            (true, None) => "run closed".to_string(),
            (false, _) => "closed marker gone".to_string(),
        });
    }
    let sealed_round = |s: &RunStatus| s.sealed.as_ref().map(|r| r.round);
    if sealed_round(b) != sealed_round(now) {
        if let Some(r) = &now.sealed {
            let members: Vec<String> = r
                .members
                .iter()
                .map(|m| format!("{}={}", m.rank, m.addr.as_deref().unwrap_or(&m.node)))
                .collect();
            said.push(format!(
                "round {} sealed: {} member(s) [{}], master {}:{}",
                r.round,
                r.members.len(),
                members.join(" "),
                r.master_addr,
                r.master_port
            ));
        } else {
            said.push("round records deleted (the last node left, or a purge)".to_string());
        }
    } else if let (Some(old), Some(new)) = (&b.sealed, &now.sealed) {
        for (o, n) in old.members.iter().zip(&new.members) {
            if o.alive && !n.alive {
                said.push(format!("rank {} ({}) lost", n.rank, n.node));
            } else if !o.draining && n.draining {
                said.push(format!("rank {} ({}) draining", n.rank, n.node));
            }
        }
    }
    for j in &now.waiting {
        if !b.waiting.iter().any(|o| o.node == j.node) {
            said.push(match j.member_rank {
                Some(rank) => format!(
                    "member rank {rank} ({}) joined round {}",
                    j.node, now.open_round
                ),
                None => format!(
                    "node {} ({}) waiting for round {}",
                    j.node, j.addr, now.open_round
                ),
            });
        }
    }
    if b.open_round == now.open_round {
        for j in &b.waiting {
            if !now.waiting.iter().any(|n| n.node == j.node) {
                said.push(format!("node {} stopped waiting", j.node));
            }
        }
    }
    for (key, value) in &now.notes {
        if b.notes.get(key) != Some(value) {
            said.push(format!("note {key}: {}", one_line(value)));
        }
    }
    // A run deleted from etcd takes its notes with it: said once, above.
    let gone = |k: &&String| now.exists && !now.notes.contains_key(*k);
    for key in b.notes.keys().filter(gone) {
        said.push(format!("note {key} removed"));
    }
    if said.is_empty() && b.alive != now.alive {
        said.push(format!("{} live node(s)", now.alive));
    }
    if said.is_empty() {
        return summary(now);
    }
    said.join("; ")
}

/// Wall-clock time of day (UTC) for watch lines.
fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let day = secs % 86_400;
    format!("{:02}:{:02}:{:02}", day / 3600, day % 3600 / 60, day % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_notes(notes: &[(&str, &str)]) -> RunStatus {
        RunStatus {
            run_id: "job".into(),
            exists: true,
            closed: false,
            failure: None,
            open_round: 1,
            sealed: None,
            waiting: vec![],
            alive: 2,
            notes: notes
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            alarms: vec![],
            revision: 7,
        }
    }

    #[test]
    fn notes_are_shown_one_line_each_in_key_order() {
        let s = with_notes(&[("why/n2", "drained: preempted"), ("hang", "rank 3\nstuck")]);
        let lines = table(&s);
        let notes: Vec<&str> = lines
            .iter()
            .filter(|l| l.starts_with("note "))
            .map(String::as_str)
            .collect();
        assert_eq!(
            notes,
            [
                "note     hang: rank 3\\nstuck",
                "note     why/n2: drained: preempted"
            ]
        );
    }

    #[test]
    fn the_watch_says_which_note_changed() {
        let before = with_notes(&[("a", "1"), ("b", "2")]);
        let now = with_notes(&[("a", "1"), ("b", "3"), ("c", "4")]);
        assert_eq!(changes(Some(&before), &now), "note b: 3; note c: 4");
        let fewer = with_notes(&[("a", "1")]);
        assert_eq!(changes(Some(&before), &fewer), "note b removed");
    }
}
