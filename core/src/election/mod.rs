//! Leader election for services that keep a job's state in memory and need etcd only for what
//! must outlive one process (the `rdzv lighthouse` command is one): candidates campaign for one
//! leader key bound to a lease, the winner publishes its address there, and one record (a
//! counter, the last decision) is written only by the current leader, checked in etcd.
//!
//! ```no_run
//! # async fn lead() -> rdzv::Result<()> {
//! use rdzv::{election::Election, Params};
//!
//! let params = Params::from_url("etcd://127.0.0.1:2379/job-42?lease_ttl=3")?;
//! let election = Election::connect(&params, "lighthouse").await?;
//! let leadership = election.campaign("http://host-a:29510").await?; // blocks until leading
//! let (record, revision) = leadership.record().await?;
//! let next: u64 = record.map_or(0, |r| String::from_utf8_lossy(&r).parse().unwrap_or(0)) + 1;
//! leadership.store(next.to_string().as_bytes(), revision, "leader: host-a").await?;
//! # Ok(())
//! # }
//! ```
//!
//! Safety: a leader key is created only where none exists, and a record write is a
//! transaction that checks both that the leader key is still bound to the writer's lease and
//! that the record has not changed since the writer read or wrote it. A process that lost its
//! lease (paused, cut off) cannot write, so whatever a leader derives from the record (a
//! counter that only grows) stays consistent across any number of failovers. The lease's TTL
//! is the run's `lease_ttl`: a killed leader is replaced within it; one that resigns at once.

use crate::backend::{self, keys::Keys, Etcd};
use crate::{Params, Result};

/// The candidates of one named election in one run (`params` name the etcd and the run).
#[derive(Clone)]
pub struct Election {
    inner: backend::election::Election,
}

/// This process leads until its lease is lost or it resigns.
pub struct Leadership {
    inner: backend::election::Leadership,
}

impl Election {
    /// Connects to the etcd `params` name (reusing this process's connection); the election
    /// is the run's, named `name` (several elections can share a run).
    pub async fn connect(params: &Params, name: &str) -> Result<Election> {
        params.validate()?;
        if name.is_empty() || name.contains('/') {
            return Err(crate::Error::invalid(format!(
                "election name: expected a name without '/', got {name:?}"
            )));
        }
        let etcd = Etcd::connect(params).await?;
        let keys = Keys::new(params.key_prefix(), params.run_id());
        Ok(Election {
            inner: backend::election::Election::new(
                etcd,
                &keys,
                name,
                params.lease_ttl(),
                // Each request's deadline (retries included): a write that takes longer than
                // the lease cannot be trusted to come from the leader anyway.
                params.lease_ttl(),
            ),
        })
    }

    /// The current leader's value (its address), if any.
    pub async fn leader(&self) -> Result<Option<String>> {
        self.inner.leader().await
    }

    /// The leader's value as it changes (by etcd watch), kept current by a task that ends
    /// once every receiver is dropped.
    pub fn observe(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.observe(tx).await });
        rx
    }

    /// Ends the leadership of the leader that publishes `value` (revokes its lease), if it still
    /// does. Only for a leader known to be gone, such as one whose address refuses connections
    /// (its process died): the next candidate then wins at once instead of a TTL later. Safe
    /// even if it was alive after all: it can no longer write the record, and stops leading
    /// when its next refresh finds the lease gone. Whether a lease was revoked.
    pub async fn evict(&self, value: &str) -> Result<bool> {
        self.inner.evict(value).await
    }

    /// Waits until this candidate leads, with `value` published as the leader's.
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        Ok(Leadership {
            inner: self.inner.campaign(value).await?,
        })
    }
}

impl Leadership {
    /// Turns true once etcd has said this leader's lease is gone.
    pub fn lost(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.lost()
    }

    /// Whether this process may still act as leader (its lease is alive and was refreshed
    /// recently enough that no other leader can exist yet).
    pub fn is_current(&self) -> bool {
        self.inner.is_current()
    }

    /// The record and its revision (0 when there is none yet).
    pub async fn record(&self) -> Result<(Option<Vec<u8>>, i64)> {
        self.inner.record().await
    }

    /// Writes the record if this process still leads and the record is still at `revision`;
    /// returns the new revision. `note` is what `rdzv status` shows for the election (the
    /// run's note named after it). Refused: an error of kind `LeaseLost`, and this process
    /// must stop acting as leader.
    pub async fn store(&self, value: &[u8], revision: i64, note: &str) -> Result<i64> {
        self.inner.store(value, revision, note).await
    }

    /// Gives up leadership at once (another candidate wins without waiting for a TTL).
    pub async fn resign(&self) -> Result<()> {
        self.inner.resign().await
    }
}
