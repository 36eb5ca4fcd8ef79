//! The dead-leader probe. etcd answers a request whose proposal was lost with a dead leader
//! only at its own request timeout (7 s by default); a connection therefore follows the raft
//! term its responses carry, and a request outstanding across a higher term is sent again
//! (`Etcd::call_until`), so a round goes on about a second after an election.

use super::Etcd;
use std::time::Duration;
use tokio::time::Instant;

/// A request outstanding this long may have been lost with a dead etcd leader: from then on
/// its connection asks etcd for its raft term (once per `TERM_PROBE_EVERY`, whoever asks).
const STUCK_AFTER: Duration = Duration::from_secs(1);
const TERM_PROBE_EVERY: Duration = Duration::from_millis(500);
/// After a new term is seen, entries the old leader had replicated are committed by the new
/// one at once; a request still unanswered this long after is taken as lost.
const NEW_TERM_GRACE: Duration = Duration::from_millis(300);

impl Etcd {
    /// Records a raft term a response carried.
    pub(crate) fn saw_term(&self, term: u64) {
        self.shared.term.send_if_modified(|seen| {
            let higher = term > *seen;
            if higher {
                *seen = term;
            }
            higher
        });
    }

    /// Completes once etcd has a leader of a higher term than `term` (the one known when a
    /// request was sent), and the request could have been answered since. Waits forever
    /// while the term stays the same: a slow etcd is not a reason to send a request twice.
    pub(super) async fn new_leader_since(&self, term: u64) {
        tokio::time::sleep(STUCK_AFTER).await;
        let mut seen = self.shared.term.subscribe();
        // Nothing was known when the request was sent: the first term seen is the baseline.
        let mut base = term;
        loop {
            let now = *seen.borrow_and_update();
            if base == 0 {
                base = now;
            } else if now > base {
                break;
            }
            self.probe_term().await;
            tokio::select! {
                _ = seen.changed() => {}
                _ = tokio::time::sleep(TERM_PROBE_EVERY) => {}
            }
        }
        tokio::time::sleep(NEW_TERM_GRACE).await;
    }

    /// Asks one member for its raft term, unless another request of this connection asked
    /// within `TERM_PROBE_EVERY`. A serializable read is answered by the member itself,
    /// without consensus, so it answers while the cluster elects; it reads a key these
    /// credentials may read (some etcd versions refuse the status call to a role without
    /// more rights).
    async fn probe_term(&self) {
        {
            let mut next = self
                .shared
                .next_term_probe
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if now < *next {
                return;
            }
            *next = now + TERM_PROBE_EVERY;
        }
        let local = etcd_client::GetOptions::new()
            .with_count_only()
            .with_serializable();
        let key = self.shared.term_probe_key.clone();
        let mut client = self.client();
        let read = tokio::time::timeout(TERM_PROBE_EVERY, client.get(key, Some(local)));
        if let Ok(Ok(Some(term))) = read.await.map(|r| r.map(|got| got.raft_term())) {
            self.saw_term(term);
        }
    }
}

/// The raft term etcd's response carries in its header, if it has one.
pub trait RaftTerm {
    fn raft_term(&self) -> Option<u64>;
}

macro_rules! raft_term_from_header {
    ($($response:ty),*) => {$(
        impl RaftTerm for $response {
            fn raft_term(&self) -> Option<u64> {
                self.header().map(|h| h.raft_term())
            }
        }
    )*};
}

raft_term_from_header!(
    etcd_client::GetResponse,
    etcd_client::PutResponse,
    etcd_client::TxnResponse,
    etcd_client::LeaseGrantResponse,
    etcd_client::LeaseRevokeResponse,
    etcd_client::LeaseTimeToLiveResponse,
    etcd_client::AlarmResponse
);
