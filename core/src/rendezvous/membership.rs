//! What a member asks about its last round while it runs: who is in it (`members`), who waits
//! to join the next one (`num_waiting`) and who is gone (`num_lost`). Supervisors poll the
//! counts several times a second, so they are answered from the lost-member tracker's watch
//! (`lost.rs`) while it is in sync and etcd answers this node's lease refreshes, and read from
//! etcd otherwise.

use super::{lost, records, FinalRecord, JoinRecord, NodeState, Rendezvous, LOG_TARGET};
use crate::error::{Error, Result};
use etcd_client::GetOptions;
use std::sync::Arc;

impl Rendezvous {
    /// The members of this node's last round in rank order (the same list for every member).
    /// Read once, on first use, from the round's lanes: O(round size), which `next` never
    /// pays, since a member receives only its own lane. A round of one lane (`max_nodes` at
    /// most 64) has its list in `final` already, so this reads nothing.
    pub async fn members(&self) -> Result<Arc<[String]>> {
        self.check_not_shut_down()?;
        let sealed = {
            let state = self.state();
            let Some((sealed, _)) = state.last.as_ref() else {
                return Err(Error::invalid(
                    "members: this node has not completed a round yet",
                ));
            };
            if let Some((round, members)) =
                state.members.as_ref().filter(|(r, _)| *r == sealed.round)
            {
                debug_assert_eq!(*round, sealed.round);
                return Ok(members.clone());
            }
            if let Some(members) = &sealed.members {
                return Ok(members.clone());
            }
            sealed.clone()
        };
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "read members",
                self.keys.lanes_prefix(sealed.round),
                GetOptions::new().with_prefix(),
            )
            .await?;
        let chunks = resp.kvs().iter().map(|kv| (kv.key(), kv.value()));
        let members = records::members_from_chunks(&sealed, chunks)?;
        self.state().members = Some((sealed.round, members.clone()));
        Ok(members)
    }

    /// Nodes waiting to join the round after this node's last round that a new round could
    /// admit. Non-zero means the members should call `next`. While a re-rendezvous is under
    /// way (a member of the last round already joined the next one) every joiner counts.
    /// Otherwise only as many newcomers as there is room for: `max_nodes` minus the surviving
    /// members. Spare nodes beyond `max_nodes` wait without being counted, so a full round is
    /// not torn down again and again for nodes it cannot take. Zero before the first round.
    /// Answered from the membership watch while it is in sync (no etcd request: a joiner is
    /// counted within the watch's delivery); read from etcd while the watch is broken or
    /// after a member was lost.
    pub async fn num_waiting(&self) -> Result<u32> {
        let n = self.count_waiting().await?;
        self.report_change(
            n,
            |s| &mut s.seen_waiting,
            "nodes waiting for the next round",
        );
        Ok(n)
    }

    /// Members of this node's last round whose lease has expired (dead or cut off) or that are
    /// leaving (drained), counting this node itself if its own lease is gone or it is drained.
    /// Non-zero means the round is broken and the survivors should call `next` to form a new
    /// one (a drained node's own `next` then ends with a graceful exit).
    pub async fn num_lost(&self) -> Result<u32> {
        let n = self.count_lost().await?;
        self.report_change(n, |s| &mut s.seen_lost, "members of the round lost");
        Ok(n)
    }

    /// Logs a count that supervisors poll, once each time it changes.
    fn report_change(&self, now: u32, seen: fn(&mut NodeState) -> &mut u32, what: &str) {
        let mut state = self.state();
        let round = state.last.as_ref().map(|(f, _)| f.round);
        let before = std::mem::replace(seen(&mut state), now);
        drop(state);
        if before != now {
            tracing::info!(target: LOG_TARGET, run = %self.params.run_id(), node = %self.node, round, count = now, "{what}");
        }
    }

    async fn count_waiting(&self) -> Result<u32> {
        self.check_not_shut_down()?;
        let Some(sealed) = self.tracked_round() else {
            return Ok(0);
        };
        let (round, world) = (sealed.round, sealed.world_size);
        let clamp = |n: usize| n.min(u32::MAX as usize) as u32;
        // From the tracker's watch while it is in sync (no member lost: all survive).
        if let Some(w) = self.watched(lost::LostTracker::waiting) {
            if w.rejoining {
                return Ok(clamp(w.joined));
            }
            let room = (self.params.max_nodes() as usize).saturating_sub(world as usize);
            return Ok(clamp(w.joined.min(room)));
        }
        let prefix = self.keys.join_prefix(round + 1);
        let resp = self
            .etcd
            .get(
                self.quick_deadline(),
                "num_waiting",
                prefix,
                GetOptions::new().with_prefix(),
            )
            .await?;
        if resp.kvs().is_empty() {
            return Ok(0);
        }
        // A joiner's record names the round it last completed: a member of ours means a
        // re-rendezvous is under way.
        let joined = resp.kvs().len();
        for kv in resp.kvs() {
            let record = JoinRecord::parse(kv.key(), kv.value())?;
            if record.last.is_some_and(|(r, _)| r == round) {
                return Ok(clamp(joined));
            }
        }
        let survivors = (world as usize).saturating_sub(self.count_lost().await? as usize);
        let room = (self.params.max_nodes() as usize).saturating_sub(survivors);
        Ok(clamp(joined.min(room)))
    }

    /// Whether the membership watch's answers can be trusted: etcd answered a refresh of this
    /// node's lease within two refresh periods (two thirds of `lease_ttl`). A watch alone cannot
    /// tell a quiet etcd from one this node is cut off from; without recent refreshes the
    /// counts are read, and a node cut off gets its error, as before.
    fn watch_trusted(&self) -> bool {
        let window = self.params.lease_ttl() * 2 / 3;
        self.refreshed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|r| r.within(window))
    }

    /// What the membership watch answers (`what`), when it is in sync and trusted.
    pub(super) fn watched<T>(&self, what: impl Fn(&lost::LostTracker) -> Option<T>) -> Option<T> {
        if !self.watch_trusted() {
            return None;
        }
        self.state().lost.as_ref().and_then(what)
    }

    /// The round whose membership the tracker follows (this node's last), starting the
    /// tracker on first use; None before this node's first round.
    pub(super) fn tracked_round(&self) -> Option<FinalRecord> {
        let mut state = self.state();
        let (sealed, _) = state.last.as_ref()?;
        let sealed = sealed.clone();
        if state.lost.is_none() {
            let etcd = self.etcd.in_round(sealed.round);
            let tracker = lost::LostTracker::start(etcd, self.keys.clone(), sealed.clone());
            state.lost = Some(tracker);
        }
        // The peer watch starts with the tracker: a supervisor polling num_lost is running
        // the round.
        if state.peers.is_none() && self.listener.is_some() {
            let rank = state.last.as_ref().map_or(0, |(_, rank)| *rank);
            if let Ok(run_lease) = self.run_lease_id() {
                state.peers = Some(super::peers::PeerWatch::start(super::peers::Ring {
                    run: self.params.run_id().to_string(),
                    etcd: self.etcd.in_round(sealed.round),
                    keys: self.keys.clone(),
                    sealed: sealed.clone(),
                    node: self.node.clone(),
                    rank,
                    run_lease,
                    timeout: self.params.peer_timeout(),
                }));
            }
        }
        Some(sealed)
    }

    async fn count_lost(&self) -> Result<u32> {
        self.check_not_shut_down()?;
        let Some(sealed) = self.tracked_round() else {
            return Ok(0);
        };
        if let Some(count) = self.watched(lost::LostTracker::count) {
            return Ok(count);
        }
        // The tracker is not in sync (just started, or its watch broke), or a member is lost
        // and its watch ended: read etcd.
        let n = lost::read_lost(&self.etcd, &self.keys, &sealed, self.quick_deadline()).await?;
        if let Some(tracker) = self.state().lost.as_ref() {
            tracker.read(n);
        }
        Ok(n)
    }
}
