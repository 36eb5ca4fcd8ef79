//! An etcd lease and the task that keeps it alive. All of a node's keys (its `alive` key and
//! its join requests) are bound to the node's own lease, so when the node dies or is cut off
//! for longer than the TTL, etcd deletes them and the other nodes see it by watch. The keys of
//! the run that no node owns (`current`, the rounds' seals and stores) are bound to the run's
//! lease, which every live node refreshes beside its own: they expire once no node is left.

use super::{backoff, Etcd};
use crate::error::Result;
use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub struct Lease {
    pub id: i64,
    /// True once etcd has said the lease no longer exists.
    lost: Arc<tokio::sync::watch::Sender<bool>>,
    /// When etcd last answered a refresh (`Refreshed`).
    refreshed: Refreshed,
    keeper: JoinHandle<()>,
}

/// The process's clock for `Refreshed`.
static EPOCH: Lazy<std::time::Instant> = Lazy::new(std::time::Instant::now);

/// When etcd last answered a refresh of a lease (or granted it): shared with whoever needs to
/// know whether this node still reaches etcd without asking it (a watch alone cannot tell a
/// quiet etcd from one cut off).
#[derive(Clone)]
pub struct Refreshed(Arc<AtomicU64>);

impl Refreshed {
    fn new() -> Refreshed {
        let r = Refreshed(Arc::new(AtomicU64::new(0)));
        r.now();
        r
    }

    fn now(&self) {
        self.0
            .store(EPOCH.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether etcd answered within `within`.
    pub fn within(&self, within: Duration) -> bool {
        let at = Duration::from_millis(self.0.load(Ordering::Relaxed));
        EPOCH.elapsed().saturating_sub(at) <= within
    }
}

impl Lease {
    /// Grants a lease of `ttl` and starts refreshing it every third of the TTL.
    pub async fn grant(etcd: &Etcd, ttl: Duration, deadline: Instant) -> Result<Lease> {
        let id = Self::grant_id(etcd, ttl, deadline).await?;
        Ok(Self::adopt(etcd, id, ttl))
    }

    /// Grants a lease of `ttl` that nobody refreshes yet.
    pub async fn grant_id(etcd: &Etcd, ttl: Duration, deadline: Instant) -> Result<i64> {
        let secs = ttl.as_secs().max(1) as i64;
        let granted = etcd
            .call(deadline, "lease grant", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        Ok(granted.id())
    }

    /// Starts refreshing a lease that exists already (granted by this node or another), every
    /// third of `ttl` or of the lease's own TTL, whichever is shorter: a lease granted by a
    /// node with a shorter `lease_ttl` must not expire between two refreshes.
    pub fn adopt(etcd: &Etcd, id: i64, ttl: Duration) -> Lease {
        let lost = Arc::new(tokio::sync::watch::Sender::new(false));
        let refreshed = Refreshed::new();
        let keeper = tokio::spawn(keep_alive(
            etcd.clone(),
            id,
            ttl,
            lost.clone(),
            refreshed.clone(),
        ));
        Lease {
            id,
            lost,
            refreshed,
            keeper,
        }
    }

    /// When etcd last answered a refresh of this lease.
    pub fn refreshed(&self) -> Refreshed {
        self.refreshed.clone()
    }

    /// True once etcd has said the lease no longer exists.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow() || self.keeper.is_finished()
    }

    /// Turns true once etcd has said the lease no longer exists (its keys are gone with it).
    pub fn lost(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Records that etcd no longer knows this lease (a request using it was refused).
    pub fn mark_lost(&self) {
        self.lost.send_replace(true);
    }

    /// Stops refreshing and deletes the lease (and with it every key bound to it).
    pub async fn revoke(self, etcd: &Etcd, deadline: Instant) -> Result<()> {
        self.keeper.abort();
        revoke(etcd, self.id, deadline).await
    }
}

/// Deletes a lease by id (and every key bound to it); one that is gone already is no error.
pub async fn revoke(etcd: &Etcd, id: i64, deadline: Instant) -> Result<()> {
    let revoked = etcd
        .call(deadline, "lease revoke", |mut c| async move {
            c.lease_revoke(id).await
        })
        .await;
    match revoked {
        Err(e) if e.kind() == crate::error::ErrorKind::LeaseLost => Ok(()),
        other => other.map(|_| ()),
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Refreshes the lease until etcd reports it gone. A broken stream (etcd restart, leader
/// change) is reopened; the lease survives as long as a refresh lands within the TTL.
async fn keep_alive(
    etcd: Etcd,
    id: i64,
    ttl: Duration,
    lost: Arc<tokio::sync::watch::Sender<bool>>,
    refreshed: Refreshed,
) {
    let mut period = ttl / 3;
    let mut attempt = 0u32;
    let who = etcd.who().clone();
    let (run, node) = (who.run.as_deref(), who.node.as_deref());
    loop {
        let opened = etcd.client().lease_keep_alive(id).await;
        let (mut keeper, mut responses) = match opened {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(run, node, lease = id, attempt = attempt + 1, error = %e,
                    "cannot open the lease refresh stream; retrying");
                backoff(&mut attempt, Instant::now() + period).await;
                continue;
            }
        };
        loop {
            if keeper.keep_alive().await.is_err() {
                break;
            }
            match tokio::time::timeout(period, responses.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() <= 0 => {
                    tracing::warn!(
                        run,
                        node,
                        lease = id,
                        "lease lost: etcd expired it (not refreshed within its TTL)"
                    );
                    lost.send_replace(true);
                    return;
                }
                Ok(Ok(Some(resp))) => {
                    attempt = 0;
                    refreshed.now();
                    period = period.min(Duration::from_secs(resp.ttl() as u64) / 3);
                    if let Some(header) = resp.header() {
                        etcd.saw_term(header.raft_term());
                    }
                }
                _ => break,
            }
            tokio::time::sleep(period).await;
        }
        backoff(&mut attempt, Instant::now() + period).await;
    }
}
