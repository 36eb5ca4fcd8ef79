//! A leader elected through a lease, and one record only the current leader may write.
//!
//! Keys, under the run's namespace (`{prefix}/{run}/`):
//!
//! ```text
//! elect/{name}/leader   the leader's value (its address), bound to the leader's lease
//! elect/{name}/record   what must outlive a leader (bytes); no lease: a new leader reads it
//! store/notes/{name}    a line for operators (`rdzv status`), bound to the leader's lease
//! ```
//!
//! Invariants: at most one `leader` key exists, created only where none is (`create_revision
//! == 0`); `record` is written only by a transaction that checks, in etcd, that `leader` is
//! still bound to the writer's lease and that `record` is what the writer last read or wrote.
//! So a leader that lost its lease (cut off, paused) can never overwrite a newer leader's
//! record, and a record's successor is always computed from it.

use super::keys::Keys;
use super::lease::Lease;
use super::{backoff, Etcd, Target};
use crate::error::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone)]
pub struct Election {
    etcd: Etcd,
    leader: String,
    record: String,
    note: String,
    ttl: Duration,
    timeout: Duration,
}

pub struct Leadership {
    election: Election,
    lease: Lease,
}

impl Election {
    pub fn new(etcd: Etcd, keys: &Keys, name: &str, ttl: Duration, timeout: Duration) -> Election {
        let base = format!("{}elect/{name}/", keys.namespace());
        Election {
            etcd,
            leader: format!("{base}leader"),
            record: format!("{base}record"),
            note: format!("{}{name}", keys.run_notes_prefix()),
            ttl,
            timeout,
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// The current leader's value, if any.
    pub async fn leader(&self) -> Result<Option<String>> {
        let leader = self.read_leader().await?;
        Ok(leader.map(|(value, _)| String::from_utf8_lossy(&value).into_owned()))
    }

    /// The leader key's value and the lease it is bound to, if a leader holds it.
    async fn read_leader(&self) -> Result<Option<(Vec<u8>, i64)>> {
        let got = self
            .etcd
            .get(
                self.deadline(),
                "leader read",
                self.leader.clone(),
                GetOptions::new(),
            )
            .await?;
        Ok(got
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.lease())))
    }

    /// Revokes the lease of the leader that publishes `value`, if it still does: for a
    /// candidate that knows that leader's process is gone (its address refuses connections), so
    /// the next leader need not wait out the TTL. Whether a lease was revoked.
    pub async fn evict(&self, value: &str) -> Result<bool> {
        let Some((held, lease)) = self.read_leader().await? else {
            return Ok(false);
        };
        if held != value.as_bytes() || lease == 0 {
            return Ok(false);
        }
        super::lease::revoke(&self.etcd, lease, self.deadline()).await?;
        Ok(true)
    }

    /// Sends the leader's value on `tx` whenever it changes, until every receiver is gone. A
    /// broken watch is opened again and followed by a fresh read, so no change is missed for
    /// longer than a reconnect.
    pub async fn observe(&self, tx: tokio::sync::watch::Sender<Option<String>>) {
        let mut attempt = 0u32;
        while !tx.is_closed() {
            let target = [Target::Key(self.leader.clone())];
            let opened = match self.etcd.watch(&target, self.deadline()).await {
                Ok(w) => w,
                Err(_) => {
                    backoff(&mut attempt, Instant::now() + self.ttl).await;
                    continue;
                }
            };
            let mut watch = opened;
            match self.leader().await {
                Ok(now) => {
                    attempt = 0;
                    tx.send_if_modified(|v| replace(v, now));
                }
                Err(_) => {
                    backoff(&mut attempt, Instant::now() + self.ttl).await;
                    continue;
                }
            }
            while let Some(events) = watch.events().await {
                for e in events {
                    let now = match e.event_type() {
                        EventType::Put => e
                            .kv()
                            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                        EventType::Delete => None,
                    };
                    tx.send_if_modified(|v| replace(v, now));
                }
                if tx.is_closed() {
                    return;
                }
            }
        }
    }

    /// Waits until this candidate leads, publishing `value` under the leader key bound to a
    /// lease of its own. A candidate that loses watches the leader key and tries again once it
    /// is deleted (the leader resigned, or its lease expired).
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        let lease = Lease::grant(&self.etcd, self.ttl, self.deadline()).await?;
        let mut attempt = 0u32;
        loop {
            if lease.is_lost() {
                return Err(Error::new(
                    ErrorKind::LeaseLost,
                    "the candidate's lease expired while campaigning",
                ));
            }
            // Watch first, then try: a deletion after the try is seen by the watch.
            let target = [Target::Key(self.leader.clone())];
            let mut watch = match self.etcd.watch(&target, self.deadline()).await {
                Ok(w) => w,
                Err(e) if e.kind() == ErrorKind::Connection || e.kind() == ErrorKind::Timeout => {
                    backoff(&mut attempt, Instant::now() + self.ttl).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    self.leader.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(
                    self.leader.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(lease.id)),
                )])
                .or_else([TxnOp::get(self.leader.as_str(), None)]);
            let resp = match self.etcd.txn(self.deadline(), "campaign", txn).await {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::LeaseLost => return Err(e),
                Err(_) => {
                    backoff(&mut attempt, Instant::now() + self.ttl).await;
                    continue;
                }
            };
            attempt = 0;
            if resp.succeeded() {
                return Ok(Leadership {
                    election: self.clone(),
                    lease,
                });
            }
            // Someone leads (possibly this process's earlier lease, which then expires).
            let mut lost = lease.lost();
            loop {
                tokio::select! {
                    events = watch.events() => match events {
                        Some(events) if events.iter().any(|e| e.event_type() == EventType::Delete) => break,
                        Some(_) => continue,
                        None => break,
                    },
                    _ = lost.changed() => break,
                }
            }
        }
    }
}

fn replace(slot: &mut Option<String>, now: Option<String>) -> bool {
    if *slot == now {
        return false;
    }
    *slot = now;
    true
}

impl Leadership {
    /// Turns true once etcd has said the leader's lease is gone.
    pub fn lost(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lease.lost()
    }

    /// Whether this process may still act as the leader: its lease is known to etcd and was
    /// refreshed within two thirds of the TTL, so it cannot have expired in etcd (a new leader
    /// is elected only after it has) unless a refresh took more than a third of the TTL.
    pub fn is_current(&self) -> bool {
        !self.lease.is_lost() && self.lease.refreshed().within(self.election.ttl * 2 / 3)
    }

    /// The record and its revision (0: none yet; the revision is what `store` compares).
    pub async fn record(&self) -> Result<(Option<Vec<u8>>, i64)> {
        let e = &self.election;
        let got = e
            .etcd
            .get(
                e.deadline(),
                "record read",
                e.record.clone(),
                GetOptions::new(),
            )
            .await?;
        Ok(match got.kvs().first() {
            Some(kv) => (Some(kv.value().to_vec()), kv.mod_revision()),
            None => (None, 0),
        })
    }

    /// Writes the record (and the operators' note), only if this process still leads and the
    /// record is still at `revision`. Returns the new revision. A refused write means another
    /// leader exists or wrote since: the caller must stop leading (error kind `LeaseLost`).
    pub async fn store(&self, value: &[u8], revision: i64, note: &str) -> Result<i64> {
        let e = &self.election;
        let txn = Txn::new()
            .when([
                Compare::lease(e.leader.as_str(), CompareOp::Equal, self.lease.id),
                Compare::mod_revision(e.record.as_str(), CompareOp::Equal, revision),
            ])
            .and_then([
                TxnOp::put(e.record.as_str(), value, None),
                TxnOp::put(
                    e.note.as_str(),
                    note,
                    Some(PutOptions::new().with_lease(self.lease.id)),
                ),
            ]);
        let resp = e.etcd.txn(e.deadline(), "record write", txn).await?;
        if !resp.succeeded() {
            self.lease.mark_lost();
            return Err(Error::new(
                ErrorKind::LeaseLost,
                "no longer the leader (the leader key or the record changed)",
            ));
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok(revision)
    }

    /// Gives up leadership at once: the lease is revoked, with the leader key and the note.
    pub async fn resign(&self) -> Result<()> {
        self.lease.mark_lost();
        let e = &self.election;
        super::lease::revoke(&e.etcd, self.lease.id, e.deadline()).await
    }
}
