//! What a chaos run leaves behind: each node's events (the JSON lines `rdzv-node --history`
//! writes), the node processes the runner started and killed, and the faults it injected, all
//! stamped with CLOCK_MONOTONIC nanoseconds so that they merge into one timeline.

use serde_json::Value;
use std::fmt;
use std::time::Duration;

/// Nanoseconds of CLOCK_MONOTONIC, shared by every process on the machine.
pub type Time = u64;

pub fn now() -> Time {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn nanos(d: Duration) -> Time {
    d.as_nanos() as Time
}

/// One observation of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When it happened (for a store call: when the call was made).
    pub t: Time,
    pub node: String,
    pub what: What,
}

#[derive(Debug, Clone, PartialEq)]
pub enum What {
    Start,
    /// `next` was called.
    Next,
    /// `next` returned this round.
    Sealed {
        round: u64,
        rank: u32,
        world_size: u32,
        members: Vec<String>,
        master: String,
    },
    /// A store call that succeeded: `set` acknowledged, a value read, or `add`'s new total.
    Store {
        op: StoreOp,
        round: u64,
        key: String,
        value: String,
        t_end: Time,
    },
    Counts {
        round: u64,
        waiting: u64,
        lost: u64,
    },
    /// Rank 0 re-rendezvoused without a change (`--churn`).
    Churn,
    Error {
        op: String,
        round: Option<u64>,
        kind: String,
        message: String,
    },
    Exit {
        code: i64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Set,
    Read,
    Add,
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreOp::Set => "set",
            StoreOp::Read => "read",
            StoreOp::Add => "add",
        })
    }
}

impl Event {
    /// Parses one history line.
    pub fn parse(line: &str) -> Result<Event, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e}): {line}"))?;
        let s = |k: &str| -> Result<String, String> {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("no string {k:?}: {line}"))
        };
        let n = |k: &str| -> Result<u64, String> {
            v[k].as_u64()
                .ok_or_else(|| format!("no number {k:?}: {line}"))
        };
        let what = match s("ev")?.as_str() {
            "start" => What::Start,
            "next" => What::Next,
            "sealed" => What::Sealed {
                round: n("round")?,
                rank: n("rank")? as u32,
                world_size: n("world_size")? as u32,
                // A node reads the whole list after `next`, for this history only; when that
                // read failed (a fault right then) the list is unknown: empty.
                members: match &v["members"] {
                    Value::Array(items) => items
                        .iter()
                        .map(|m| m.as_str().unwrap_or_default().to_string())
                        .collect(),
                    Value::Object(o) if o.contains_key("error") => Vec::new(),
                    _ => return Err(format!("no members: {line}")),
                },
                master: s("master")?,
            },
            ev @ ("set" | "read" | "add") => What::Store {
                op: match ev {
                    "set" => StoreOp::Set,
                    "read" => StoreOp::Read,
                    _ => StoreOp::Add,
                },
                round: n("round")?,
                key: s("key")?,
                value: match &v["value"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
                t_end: n("t_end")?,
            },
            "counts" => What::Counts {
                round: n("round")?,
                waiting: n("waiting")?,
                lost: n("lost")?,
            },
            "churn" => What::Churn,
            "error" => What::Error {
                op: s("op")?,
                round: v["round"].as_u64(),
                kind: s("kind")?,
                message: s("message")?,
            },
            "exit" => What::Exit {
                code: v["code"].as_i64().unwrap_or(-1),
            },
            other => return Err(format!("unknown event {other:?}: {line}")),
        };
        Ok(Event {
            t: n("t")?,
            node: s("node")?,
            what,
        })
    }
}

/// Parses a whole history file. A last line cut short (the process was killed while writing
/// it) is dropped; anything else that does not parse is an error.
pub fn parse_history(text: &str) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        match Event::parse(line) {
            Ok(e) => events.push(e),
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(e) => return Err(e),
        }
    }
    Ok(events)
}

/// The kinds of fault the scheduler injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL a node; a fresh node takes its place when the fault heals.
    Kill,
    /// SIGSTOP a node for longer than its lease TTL; SIGCONT when the fault heals.
    Pause,
    /// SIGKILL an etcd member; it restarts on its data directory when the fault heals.
    EtcdKill,
    /// Cut a node's network link; bring it back up when the fault heals.
    Partition,
}

impl FaultKind {
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::EtcdKill,
        FaultKind::Partition,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "node SIGKILLed, replaced",
            FaultKind::Pause => "node SIGSTOPped past its lease",
            FaultKind::EtcdKill => "etcd member SIGKILLed, restarted",
            FaultKind::Partition => "node cut off from the network",
        }
    }

    /// True for faults that take a node's lease away, so that its round must re-form.
    pub fn breaks_the_round(self) -> bool {
        self != FaultKind::EtcdKill
    }
}

/// One injected fault, as it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub episode: usize,
    pub kind: FaultKind,
    /// The node slot or etcd member it hit.
    pub target: usize,
    /// The node it hit (node faults; None if that node had not started yet).
    pub node: Option<String>,
    pub injected: Time,
    pub healed: Time,
}

/// One node process the runner started: which slot it filled, its node id, when it started
/// and when the runner killed it (or it exited).
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    pub slot: usize,
    pub node: Option<String>,
    pub spawned: Time,
    pub ended: Option<Time>,
    pub events: Vec<Event>,
}

/// Everything the checker reads.
#[derive(Debug, Clone)]
pub struct Run {
    pub lease_ttl: Duration,
    pub last_call: Duration,
    /// Allowance for scheduling on a loaded machine, on top of lease TTL + last call.
    pub slack: Duration,
    pub processes: Vec<Process>,
    pub faults: Vec<Fault>,
    /// When the runner stopped injecting (every fault healed).
    pub faults_stopped: Time,
    /// When the runner closed the run; events after it are not judged for progress.
    pub closed: Time,
    /// When the runner saw the run's `lease` key deleted while the job ran: the run's lease
    /// expired because no node reached etcd for longer than its TTL (a machine too loaded to
    /// run etcd or the nodes; the schedule itself never cuts off more than 3 of 8 nodes), so
    /// etcd deleted the run's keys and the nodes began it again from round 0.
    pub run_lost: Vec<Time>,
}

/// Rounds of the run begun again after its k-th loss are numbered from k times this, so that
/// every guarantee is judged within one life of the run.
pub const LIFE: u64 = 1_000_000;

impl Run {
    /// The run with every round renumbered by the life it belongs to (see `run_lost`): an
    /// event belongs to the life that began at the last loss before it. The round inside the
    /// workload's values (`NODE/ROUND/SEQ`) is taken to be of the same life as the call that
    /// wrote or read it: a read returning a value of an earlier life's round of the same
    /// number would pass (etcd deleted those keys with the run's lease).
    pub fn by_life(&self) -> Run {
        let life = |t: Time| self.run_lost.iter().filter(|&&lost| lost <= t).count() as u64;
        let mut run = self.clone();
        for p in &mut run.processes {
            for e in &mut p.events {
                let offset = life(e.t) * LIFE;
                if let What::Store { value, .. } = &mut e.what {
                    let parts: Vec<&str> = value.split('/').collect();
                    if let [node, round, seq] = parts[..] {
                        if let Ok(round) = round.parse::<u64>() {
                            *value = format!("{node}/{}/{seq}", round + offset);
                        }
                    }
                }
                match &mut e.what {
                    What::Sealed { round, .. }
                    | What::Store { round, .. }
                    | What::Counts { round, .. }
                    | What::Error {
                        round: Some(round), ..
                    } => *round += offset,
                    _ => {}
                }
            }
        }
        run
    }

    /// The bound on recovery: lease TTL + last call + slack.
    pub fn recovery_bound(&self) -> Duration {
        self.lease_ttl + self.last_call + self.slack
    }
}
