//! The leading lighthouse: the quorum state in memory, as torchft's Lighthouse keeps it, and
//! in etcd only what must outlive this process. A quorum whose id grows (new members, or
//! commit failures) is handed out only after its id and members are written to etcd by a
//! transaction that checks this process still leads (`rdzv::election`); a quorum with the
//! same id (the fast path, step after step) costs etcd nothing. Heartbeats stay in memory:
//! a new leader counts the last quorum's members as just heartbeated and hears from the live
//! ones within one heartbeat period.

use super::proto::{Quorum, QuorumMember};
use super::rules::{next_quorum_id, Decision, Rules, State};
use rdzv::election::Leadership;
use rdzv::ErrorKind;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};
use tokio::sync::{broadcast, watch, Mutex};

pub struct Leader {
    rules: Rules,
    inner: Mutex<Inner>,
    quorums: broadcast::Sender<Quorum>,
    leadership: Leadership,
    /// Turns true when this process stops leading; every waiter then asks the new leader.
    deposed: watch::Sender<bool>,
    address: String,
    /// Whether quorums are held back for an unconfirmed lease (said once per change).
    unconfirmed: std::sync::atomic::AtomicBool,
}

struct Inner {
    state: State,
    /// The record's revision in etcd, compared by each write.
    revision: i64,
}

/// This process stopped leading while a request waited.
#[derive(Debug)]
pub struct Deposed;

/// What the /status page shows.
pub struct Snapshot {
    pub quorum_id: i64,
    pub last: Option<Quorum>,
    pub heartbeats: Vec<(String, std::time::Duration)>,
    pub asking: usize,
    pub why: String,
}

impl Leader {
    /// Takes over from whatever etcd holds (the record of the last quorum that grew the id).
    pub async fn take_over(
        leadership: Leadership,
        rules: Rules,
        address: String,
    ) -> rdzv::Result<Leader> {
        let (record, revision) = leadership.record().await?;
        // A record this version cannot read is refused rather than taken as absent: the id
        // would start again from 0.
        let last = match record.as_deref() {
            None => None,
            Some(bytes) => Some(parse_record(bytes).ok_or_else(|| {
                rdzv::Error::state(
                    "the lighthouse's record in etcd is not readable by this version",
                )
            })?),
        };
        let quorum_id = last.as_ref().map_or(0, |q| q.quorum_id);
        // An empty last quorum (none formed yet) must not make every ask a fast quorum.
        let last = last.filter(|q| !q.participants.is_empty());
        let note = note(&address, last.as_ref());
        // Rewritten as it is: proves in etcd that this process leads, and names it for
        // `rdzv status`.
        let value = record.unwrap_or_else(|| record_of(&empty(quorum_id)));
        let revision = leadership.store(&value, revision, &note).await?;
        let (quorums, _) = broadcast::channel(1024);
        Ok(Leader {
            rules,
            inner: Mutex::new(Inner {
                state: State::resumed(quorum_id, last, Instant::now()),
                revision,
            }),
            quorums,
            leadership,
            deposed: watch::Sender::new(false),
            address,
            unconfirmed: Default::default(),
        })
    }

    /// Waits until this process stops leading (its lease lost, or a write refused), and says
    /// which.
    pub async fn until_deposed(&self) -> &'static str {
        let mut lost = self.leadership.lost();
        let mut deposed = self.deposed.subscribe();
        let why = tokio::select! {
            () = until_true(&mut lost) => "its lease expired in etcd",
            () = until_true(&mut deposed) => "etcd refused its write",
        };
        self.deposed.send_replace(true);
        why
    }

    pub fn is_deposed(&self) -> bool {
        *self.deposed.borrow()
    }

    pub fn depose(&self) {
        self.deposed.send_replace(true);
    }

    /// Stops leading at once: the lease is revoked, so another lighthouse wins now rather
    /// than a TTL later.
    pub async fn resign(&self) {
        self.depose();
        let _ = self.leadership.resign().await;
    }

    pub async fn heartbeat(&self, replica_id: &str) {
        self.inner
            .lock()
            .await
            .state
            .heartbeat(replica_id, Instant::now());
    }

    /// Waits for a quorum that includes `member`.
    pub async fn quorum(&self, member: QuorumMember) -> Result<Quorum, Deposed> {
        let mut deposed = self.deposed.subscribe();
        if *deposed.borrow() {
            return Err(Deposed);
        }
        let mut quorums = {
            let mut inner = self.inner.lock().await;
            inner.state.ask(member.clone(), Instant::now());
            let quorums = self.quorums.subscribe();
            self.tick_locked(&mut inner).await;
            quorums
        };
        loop {
            tokio::select! {
                got = quorums.recv() => match got {
                    Ok(q) if q.participants.iter().any(|p| p.replica_id == member.replica_id) => {
                        return Ok(q)
                    }
                    // Left out (or a quorum missed): ask for the next one, as torchft does.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        let mut inner = self.inner.lock().await;
                        inner.state.ask(member.clone(), Instant::now());
                    }
                    Err(broadcast::error::RecvError::Closed) => return Err(Deposed),
                },
                () = until_true(&mut deposed) => return Err(Deposed),
            }
        }
    }

    /// One look at the rules (every `quorum_tick`, and on every request).
    pub async fn tick(&self) {
        let mut inner = self.inner.lock().await;
        self.tick_locked(&mut inner).await;
    }

    async fn tick_locked(&self, inner: &mut Inner) {
        if *self.deposed.borrow() {
            return;
        }
        let now = Instant::now();
        let (members, why) = match inner.state.decide(now, &self.rules) {
            Decision::Wait(_) => return,
            Decision::Form { members, why } => (members, why),
        };
        // Not sure to lead any more (a refresh of the lease is late): hand out nothing.
        if !self.leadership.is_current() {
            if !self
                .unconfirmed
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                crate::output::say("lighthouse: holding quorums back: etcd has not confirmed this leader's lease lately");
            }
            return;
        }
        if self
            .unconfirmed
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            crate::output::say("lighthouse: lease confirmed again; quorums go on");
        }
        let id = next_quorum_id(inner.state.last.as_ref(), &members, inner.state.quorum_id);
        let quorum = Quorum {
            quorum_id: id,
            participants: members,
            created: Some(SystemTime::now().into()),
        };
        if id != inner.state.quorum_id {
            let note = note(&self.address, Some(&quorum));
            match self
                .leadership
                .store(&record_of(&quorum), inner.revision, &note)
                .await
            {
                Ok(revision) => inner.revision = revision,
                Err(e) if e.kind() == ErrorKind::LeaseLost => {
                    crate::output::say(format_args!(
                        "lighthouse: no longer the leader ({}); forwarding to the new one",
                        e.message()
                    ));
                    self.depose();
                    return;
                }
                Err(e) => {
                    // etcd unreachable for now: the next tick tries again.
                    say_write_failed(id, e.message());
                    return;
                }
            }
            crate::output::say(format_args!(
                "lighthouse: quorum {id}: {} replica group(s) ({why})",
                quorum.participants.len()
            ));
        }
        inner.state.quorum_id = id;
        inner.state.last = Some(quorum.clone());
        inner.state.asking.clear();
        let _ = self.quorums.send(quorum);
    }

    pub async fn snapshot(&self) -> Snapshot {
        let inner = self.inner.lock().await;
        let now = Instant::now();
        let mut heartbeats: Vec<(String, std::time::Duration)> = inner
            .state
            .heartbeats
            .iter()
            .map(|(id, at)| (id.clone(), now.saturating_duration_since(*at)))
            .collect();
        heartbeats.sort();
        let why = match inner.state.decide(now, &self.rules) {
            Decision::Wait(why) => why,
            Decision::Form { why, .. } => why,
        };
        Snapshot {
            quorum_id: inner.state.quorum_id,
            last: inner.state.last.clone(),
            heartbeats,
            asking: inner.state.asking.len(),
            why,
        }
    }
}

/// Returns once the flag is true (or its sender is gone); holds no borrow of it after.
async fn until_true(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|f| *f).await.map(|_| ());
}

/// Said once per failed write (a write is tried at most once per tick).
fn say_write_failed(id: i64, message: &str) {
    crate::output::say(format_args!(
        "lighthouse: cannot record quorum {id} in etcd yet (trying again): {message}"
    ));
}

fn empty(quorum_id: i64) -> Quorum {
    Quorum {
        quorum_id,
        participants: vec![],
        created: None,
    }
}

/// The line `rdzv status` shows for the lighthouse (the run's note `lighthouse`).
fn note(address: &str, quorum: Option<&Quorum>) -> String {
    match quorum.filter(|q| !q.participants.is_empty()) {
        None => format!("leader {address}, no quorum yet"),
        Some(q) => {
            let ids: Vec<&str> = q
                .participants
                .iter()
                .take(8)
                .map(|p| p.replica_id.as_str())
                .collect();
            let more = if q.participants.len() > 8 {
                ", ..."
            } else {
                ""
            };
            format!(
                "leader {address}, quorum {}: {} replica groups ({}{more})",
                q.quorum_id,
                q.participants.len(),
                ids.join(", ")
            )
        }
    }
}

/// The record in etcd: the quorum whose id is the highest handed out, as JSON.
pub fn record_of(q: &Quorum) -> Vec<u8> {
    let members: Vec<Value> = q
        .participants
        .iter()
        .map(|m| {
            json!({
                "replica_id": m.replica_id,
                "address": m.address,
                "store_address": m.store_address,
                "step": m.step,
                "world_size": m.world_size,
                "shrink_only": m.shrink_only,
                "commit_failures": m.commit_failures,
                "data": m.data,
            })
        })
        .collect();
    json!({"quorum_id": q.quorum_id, "participants": members})
        .to_string()
        .into_bytes()
}

/// A record read back; `None` for one this version cannot read.
pub fn parse_record(bytes: &[u8]) -> Option<Quorum> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let text = |m: &Value, k: &str| m[k].as_str().unwrap_or_default().to_string();
    let participants = v["participants"]
        .as_array()?
        .iter()
        .map(|m| QuorumMember {
            replica_id: text(m, "replica_id"),
            address: text(m, "address"),
            store_address: text(m, "store_address"),
            step: m["step"].as_i64().unwrap_or(0),
            world_size: m["world_size"].as_u64().unwrap_or(0),
            shrink_only: m["shrink_only"].as_bool().unwrap_or(false),
            commit_failures: m["commit_failures"].as_i64().unwrap_or(0),
            data: text(m, "data"),
        })
        .collect();
    Some(Quorum {
        quorum_id: v["quorum_id"].as_i64()?,
        participants,
        created: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let q = Quorum {
            quorum_id: 41,
            participants: vec![QuorumMember {
                replica_id: "a".into(),
                address: "http://h:1".into(),
                step: 9,
                world_size: 2,
                commit_failures: 1,
                data: "{\"x\": 1}".into(),
                ..Default::default()
            }],
            created: None,
        };
        assert_eq!(parse_record(&record_of(&q)), Some(q));
        assert_eq!(parse_record(b"not json"), None);
    }
}
