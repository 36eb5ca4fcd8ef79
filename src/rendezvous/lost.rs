//! Which members of this node's last round are gone, kept current by a watch on the run's
//! `alive/` keys. Supervisors poll `num_lost` several times a second on every node; answered
//! from memory, that costs etcd nothing instead of a read of every live node's key per poll.

use crate::backend::keys::Keys;
use crate::backend::{backoff, Etcd, Target};
use etcd_client::{EventType, GetOptions};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// `None` while the tracker is not in sync with etcd (starting, or its watch broke).
type Gone = Arc<Mutex<Option<HashSet<String>>>>;

pub(crate) struct LostTracker {
    gone: Gone,
    task: JoinHandle<()>,
}

impl LostTracker {
    /// Starts tracking `members` (must be called inside the runtime).
    pub fn start(etcd: Etcd, alive_prefix: String, members: Vec<String>) -> LostTracker {
        let gone: Gone = Arc::new(Mutex::new(None));
        let task = tokio::spawn(track(etcd, alive_prefix, members, gone.clone()));
        LostTracker { gone, task }
    }

    /// How many members are gone, or `None` when the answer must be read from etcd.
    pub fn count(&self) -> Option<u32> {
        let gone = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        gone.as_ref().map(|g| g.len() as u32)
    }
}

impl Drop for LostTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn track(etcd: Etcd, prefix: String, members: Vec<String>, gone: Gone) {
    let members: HashSet<String> = members.into_iter().collect();
    let set = |value: Option<HashSet<String>>| {
        *gone.lock().unwrap_or_else(|e| e.into_inner()) = value;
    };
    let mut attempt = 0u32;
    loop {
        let deadline = Instant::now() + Duration::from_secs(10);
        // Watch, then read: a change between the two is not missed.
        if let Ok(mut watch) = etcd
            .watch(&[Target::Prefix(prefix.clone())], deadline)
            .await
        {
            let read = GetOptions::new().with_prefix().with_keys_only();
            if let Ok(resp) = etcd
                .get(deadline, "track alive", prefix.clone(), read)
                .await
            {
                let alive: HashSet<&str> = resp
                    .kvs()
                    .iter()
                    .filter_map(|kv| Keys::node_of(kv.key()))
                    .collect();
                set(Some(
                    members
                        .iter()
                        .filter(|m| !alive.contains(m.as_str()))
                        .cloned()
                        .collect(),
                ));
                attempt = 0;
                while let Some(events) = watch.events().await {
                    let mut guard = gone.lock().unwrap_or_else(|e| e.into_inner());
                    let Some(gone) = guard.as_mut() else { break };
                    for ev in &events {
                        let Some(node) = ev.kv().and_then(|kv| Keys::node_of(kv.key())) else {
                            continue;
                        };
                        if !members.contains(node) {
                            continue;
                        }
                        let who = etcd.who();
                        let (run, me, round) = (who.run.as_deref(), who.node.as_deref(), who.round);
                        match ev.event_type() {
                            EventType::Delete => {
                                if gone.insert(node.to_string()) {
                                    tracing::info!(
                                        run,
                                        node = me,
                                        round,
                                        lost = node,
                                        "member of the round lost (its lease expired or it left)"
                                    );
                                }
                            }
                            EventType::Put => {
                                if gone.remove(node) {
                                    tracing::info!(
                                        run,
                                        node = me,
                                        round,
                                        member = node,
                                        "member of the round alive again"
                                    );
                                }
                            }
                        }
                    }
                }
                set(None);
            }
        }
        backoff(&mut attempt, Instant::now() + Duration::from_secs(1)).await;
    }
}
