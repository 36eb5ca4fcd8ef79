//! What a round's leader knows about its round, and the seal rule over it. The view starts
//! from one read of the round (`read_round`) and is kept current by the events of the
//! leader's watch (`RoundView::apply`); `decide` says whether to seal now, by which part of
//! the rule, or how long to wait; `seal_record` orders the members. Nothing here writes: a
//! stale view costs a refused seal, never a wrong one (`lead.rs` guards the seal).

use super::LOG_TARGET;
use crate::backend::keys::Keys;
use crate::backend::ranges;
use crate::error::{Error, Result};
use crate::rendezvous::records::{inline_members, members_from_chunks};
use crate::rendezvous::{FinalRecord, JoinRecord, Outcome, Rendezvous};
use etcd_client::{
    EventType, GetOptions, GetResponse, SortOrder, SortTarget, Txn, TxnOp, TxnResponse,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use tokio::time::Instant;

/// What the leader knows about its round, kept current by one watch.
pub(super) struct RoundView {
    pub(super) round: u64,
    /// Joiners by create revision (arrival order), and the reverse index.
    joiners: BTreeMap<i64, (String, JoinRecord)>,
    revision_of: HashMap<String, i64>,
    /// Nodes that withdrew from this round, with the revision of their withdrawal.
    gone: HashMap<String, i64>,
    /// The newest withdrawal this view knows of; the seal is guarded by "none newer".
    pub(super) newest_gone: i64,
    /// Members of the previous round, if it exists.
    previous: Option<std::sync::Arc<[String]>>,
    /// Nodes whose `alive` key exists.
    alive: HashSet<String>,
    /// Nodes that are leaving (drained): alive, but never sealed in and never waited for.
    draining: HashSet<String>,
    /// The newest drain this view knows of; the seal is guarded by "none newer".
    pub(super) newest_drain: i64,
    /// Whether this node still holds the round's `leader` key.
    pub(super) leading: bool,
    /// Since when this node leads (the seal's log record says how long the round took).
    pub(super) since: Since,
}

/// When a leader started leading: at its join, when it was the round's first joiner, or when
/// it took over from a leader that died.
#[derive(Clone, Copy)]
pub(super) struct Since {
    pub(super) at: Instant,
    pub(super) first_join: bool,
}

impl RoundView {
    fn add_joiner(&mut self, create_rev: i64, key: &[u8], value: &[u8]) -> Result<()> {
        let node = Keys::node_of(key).unwrap_or_default().to_string();
        let record = JoinRecord::parse(key, value)?;
        if let Some(old) = self.revision_of.insert(node.clone(), create_rev) {
            self.joiners.remove(&old);
        }
        self.joiners.insert(create_rev, (node, record));
        Ok(())
    }

    fn remove_joiner(&mut self, node: &str) {
        if let Some(rev) = self.revision_of.remove(node) {
            self.joiners.remove(&rev);
        }
    }

    fn add_gone(&mut self, key: &[u8], mod_rev: i64) {
        let node = Keys::node_of(key).unwrap_or_default().to_string();
        self.gone.insert(node, mod_rev);
        self.newest_gone = self.newest_gone.max(mod_rev);
    }

    /// Joiners that still stand: a withdrawal after a node's join key was written removes it
    /// even if the deletion of the join key has not reached this view yet (events of several
    /// watchers are not ordered with each other); a drained node never stands.
    fn standing(&self) -> impl Iterator<Item = (&i64, &(String, JoinRecord))> {
        self.joiners
            .iter()
            .filter(|(rev, (node, _))| self.stands(node, **rev))
    }

    fn stands(&self, node: &str, joined_at: i64) -> bool {
        self.gone.get(node).is_none_or(|gone| *gone < joined_at) && !self.draining.contains(node)
    }

    /// Alive and not leaving: a node the round may wait for.
    fn live(&self, node: &str) -> bool {
        self.alive.contains(node) && !self.draining.contains(node)
    }

    pub(super) fn count(&self) -> usize {
        self.standing().count()
    }

    fn has_joined(&self, node: &str) -> bool {
        self.revision_of
            .get(node)
            .is_some_and(|rev| self.stands(node, *rev))
    }

    /// A round may seal only once the previous round is being abandoned: one of its members
    /// has joined this round, or one has died or is leaving (drained), or there is no previous
    /// round. Otherwise the
    /// joiners are *waiting* nodes and must not form a second world beside a running one.
    fn activated(&self) -> bool {
        match &self.previous {
            None => true,
            Some(prev) => prev.iter().any(|m| self.has_joined(m) || !self.live(m)),
        }
    }

    /// Live members of the previous round that have not joined yet. While any remain, reaching
    /// max_nodes does not seal at once, so new arrivals cannot push out a returning member.
    fn pending_previous(&self) -> usize {
        self.previous.as_ref().map_or(0, |prev| {
            prev.iter()
                .filter(|m| self.live(m) && !self.has_joined(m))
                .count()
        })
    }

    /// The seal rule (DESIGN.md, "Leading"): seal now, and by which part of it, or wait.
    /// `last_call` is when the last call ends: it starts here when the round is activated with
    /// `min` joiners, and is cleared when the round stops qualifying.
    pub(super) fn decide(
        &self,
        rule: &SealRule,
        last_call: &mut Option<Instant>,
        now: Instant,
    ) -> Decision {
        let n = self.count();
        if !self.activated() || n < rule.min {
            *last_call = None;
            return Decision::Wait {
                until: None,
                held: false,
            };
        }
        if n >= rule.max && self.pending_previous() == 0 {
            return Decision::Seal("max_nodes");
        }
        if self.everyone_joined() {
            return Decision::Seal("everyone_joined");
        }
        let end = *last_call.get_or_insert(now + rule.last_call);
        if now < end {
            return Decision::Wait {
                until: Some(end),
                held: false,
            };
        }
        // A live member of the previous round that is not back yet keeps its place past the
        // last call, for at most `member_wait` more: no spare or newcomer takes it meanwhile.
        if !self.would_displace_a_member(rule.max) {
            return Decision::Seal("last_call");
        }
        let member_wait_end = end + rule.member_wait;
        if now >= member_wait_end {
            return Decision::Seal("member_wait_over");
        }
        Decision::Wait {
            until: Some(member_wait_end),
            held: true,
        }
    }

    /// Whether a seal now would give away the place of a live member of the previous round
    /// that has not joined yet: the rank it would get if it joined now (after the members of
    /// the previous round ranked before it that have joined) would go to another node, or the
    /// round would be full without it. Checking the first such member is enough: a later one's
    /// place is no lower.
    fn would_displace_a_member(&self, max: usize) -> bool {
        let Some(prev) = &self.previous else {
            return false;
        };
        let mut place = 0;
        for m in prev.iter() {
            if self.has_joined(m) {
                place += 1;
            } else if self.live(m) {
                return self.count().min(max) > place;
            }
        }
        false
    }

    /// Nobody is left to wait for: the round re-forms a running world (there is a previous
    /// round), every live member of it has joined, and so has every other live node of the run.
    /// The last call exists for nodes that may still arrive; here only a process that has not
    /// started yet could, and it would be counted in `num_waiting` and admitted by the next
    /// round, as any late arrival is. So a re-rendezvous after a loss, a departure or an
    /// arrival seals as soon as the survivors are in, not a last call later.
    fn everyone_joined(&self) -> bool {
        self.previous.is_some()
            && self.pending_previous() == 0
            && self
                .alive
                .iter()
                .all(|node| self.has_joined(node) || self.draining.contains(node))
    }

    /// Logs why the round is still open: how many joined, whether it is activated, and which
    /// live members of the previous round have not joined yet (the ones the round waits for
    /// before sealing at max_nodes, and the first thing to look at in a hung round).
    pub(super) fn report_progress(
        &self,
        rdzv: &Rendezvous,
        min: usize,
        max: usize,
        last_call: Option<Instant>,
    ) {
        const SHOWN: usize = 8;
        let missing: Vec<&str> = self.previous.as_ref().map_or(Vec::new(), |prev| {
            prev.iter()
                .filter(|m| self.live(m) && !self.has_joined(m))
                .map(String::as_str)
                .collect()
        });
        let mut named = missing
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(",");
        if missing.len() > SHOWN {
            named.push_str(",...");
        }
        let last_call_in_ms =
            last_call.map(|t| t.saturating_duration_since(Instant::now()).as_millis() as u64);
        let activated = self.activated();
        macro_rules! report {
            ($level:expr) => {
                tracing::event!(target: LOG_TARGET, $level, run = %rdzv.params().run_id(), node = %rdzv.node(),
                    round = self.round, joined = self.count(), min, max, activated, last_call_in_ms,
                    missing_members = missing.len(),
                    missing = (!named.is_empty()).then_some(named.as_str()), "round still open")
            };
        }
        // Nodes waiting while a round runs (late arrivals, spares) are normal: debug only.
        match activated {
            true => report!(tracing::Level::INFO),
            false => report!(tracing::Level::DEBUG),
        }
    }

    /// The sealed record and its members in rank order: survivors of the previous round first,
    /// in their old order (so rank 0 stays rank 0), then newcomers by arrival; at most `max`.
    pub(super) fn seal_record(&self, max: usize, lanes: u32) -> (FinalRecord, Vec<String>) {
        let mut ordered: Vec<(&i64, &(String, JoinRecord))> = self.standing().collect();
        let prev_round = self.round.checked_sub(1);
        ordered.sort_by_key(|(rev, (_, rec))| match rec.last {
            Some((r, rank)) if Some(r) == prev_round => (0, rank as i64, **rev),
            _ => (1, 0, **rev),
        });
        ordered.truncate(max);
        let rank0 = &ordered[0].1 .1;
        let members: Vec<String> = ordered.iter().map(|(_, (node, _))| node.clone()).collect();
        let sealed = FinalRecord {
            round: self.round,
            world_size: members.len() as u32,
            master_addr: rank0.addr.clone(),
            master_port: rank0.port,
            chunks: lanes,
            members: inline_members(&members, lanes),
            lane: None,
        };
        (sealed, members)
    }

    /// Applies one watch event; returns what ends the wait, if it does.
    pub(super) fn apply(
        &mut self,
        keys: &Keys,
        me: &str,
        ev: &etcd_client::Event,
    ) -> Result<Option<Step>> {
        let Some(kv) = ev.kv() else { return Ok(None) };
        let key = kv.key();
        let deleted = ev.event_type() == EventType::Delete;
        let round = self.round;
        if key.starts_with(keys.join_prefix(round).as_bytes()) {
            let node = Keys::node_of(key).unwrap_or_default();
            match (deleted, node == me) {
                (true, true) => return Ok(Some(Step::Done(Outcome::Rejoin))),
                (true, false) => self.remove_joiner(node),
                (false, _) => self.add_joiner(kv.create_revision(), key, kv.value())?,
            }
        } else if key.starts_with(keys.gone_prefix(round).as_bytes()) && !deleted {
            self.add_gone(key, kv.mod_revision());
        } else if key == keys.leader(round).as_bytes() {
            self.leading = !deleted && kv.value() == me.as_bytes();
        } else if key.starts_with(keys.drain_prefix().as_bytes()) {
            let node = Keys::node_of(key).unwrap_or_default();
            if deleted {
                self.draining.remove(node);
            } else if node == me {
                return Ok(Some(Step::Drained(
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )));
            } else {
                self.draining.insert(node.to_string());
                self.newest_drain = self.newest_drain.max(kv.mod_revision());
            }
        } else if key.starts_with(keys.alive_prefix().as_bytes()) {
            let node = Keys::node_of(key).unwrap_or_default().to_string();
            if deleted {
                self.alive.remove(&node);
            } else {
                self.alive.insert(node);
            }
        } else if key == keys.final_(round).as_bytes() && !deleted {
            let sealed = FinalRecord::parse(key, kv.value())?;
            return Ok(Some(Step::Done(Outcome::Sealed(sealed))));
        } else if key == keys.closed().as_bytes() && !deleted {
            return Ok(Some(Step::Reread));
        }
        Ok(None)
    }
}

/// The leader's limits: the round's size, its last call, and how long past the last call a
/// live member of the previous round keeps its place (`lease_ttl`).
pub(super) struct SealRule {
    pub(super) min: usize,
    pub(super) max: usize,
    pub(super) last_call: std::time::Duration,
    pub(super) member_wait: std::time::Duration,
}

/// What the leader does next (`RoundView::decide`).
#[derive(Debug, PartialEq)]
pub(super) enum Decision {
    /// Seal now; the part of the rule that allows it (named in the seal's log record).
    Seal(&'static str),
    /// Wait for events, and wake at `until` at the latest. `held`: the last call is over, and
    /// the round waits for a live member of the previous round.
    Wait { until: Option<Instant>, held: bool },
}

/// What makes the leader stop applying events.
pub(super) enum Step {
    Done(Outcome),
    /// Something that needs a fresh read of the whole round (the run was closed: it may have
    /// been sealed just before).
    Reread,
    /// This node was drained (the reason): it leaves instead of sealing.
    Drained(String),
}

/// How the leader's read of its round ended (`read_round`).
pub(super) enum RoundRead {
    /// The round was sealed already.
    Sealed(FinalRecord),
    /// The run was closed.
    Closed,
    /// This node was drained (the reason): it leaves instead of leading.
    Drained(String),
    /// This node's join key is gone (its lease expired): it joins again.
    Rejoin,
    /// The round is open: the leader's view of it, and the revision it was read at (events up
    /// to it are already in the view).
    Open(Box<RoundView>, i64),
}

/// The reads a leader starts from, in this order (`parse_round_read` takes them back by the
/// same names): the round's join keys in arrival order, its `final`, `closed`, the run's live
/// nodes, the round's `leader`, its withdrawals, the run's drains; after round 0, the previous
/// round's `final` and lanes (its members: the leader is the one node that reads the whole
/// list).
fn round_reads(rdzv: &Rendezvous, round: u64) -> Vec<TxnOp> {
    let keys = rdzv.keys();
    let by_arrival = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let names = || Some(GetOptions::new().with_prefix().with_keys_only());
    let mut reads = vec![
        TxnOp::get(keys.join_prefix(round), Some(by_arrival)),
        TxnOp::get(keys.final_(round), None),
        TxnOp::get(keys.closed(), Some(GetOptions::new().with_count_only())),
        TxnOp::get(keys.alive_prefix(), names()),
        TxnOp::get(keys.leader(round), None),
        TxnOp::get(keys.gone_prefix(round), names()),
        TxnOp::get(keys.drain_prefix(), Some(GetOptions::new().with_prefix())),
    ];
    if round > 0 {
        reads.push(TxnOp::get(keys.final_(round - 1), None));
        reads.push(TxnOp::get(
            keys.lanes_prefix(round - 1),
            Some(GetOptions::new().with_prefix()),
        ));
    }
    reads
}

/// Reads round `round` for its leader, in one transaction. The leader's watch must exist
/// already: the view starts from this read and the events after it.
pub(super) async fn read_round(
    rdzv: &Rendezvous,
    round: u64,
    deadline: Instant,
    since: Since,
) -> Result<RoundRead> {
    let txn = Txn::new().and_then(round_reads(rdzv, round));
    let resp = rdzv.etcd().txn(deadline, "read round", txn).await?;
    parse_round_read(rdzv, round, since, &resp)
}

/// The answers of `round_reads`, each parsed where it is named. Sealed comes before closed (a
/// round sealed with this node stands even if the run was closed afterwards), and a drained
/// node leaves before it leads.
fn parse_round_read(
    rdzv: &Rendezvous,
    round: u64,
    since: Since,
    resp: &TxnResponse,
) -> Result<RoundRead> {
    let got = ranges(resp);
    let [joins, sealed, closed, alive, leader, gone, drains, previous @ ..] = got.as_slice() else {
        return Err(Error::internal(format!(
            "read round: expected at least 7 reads, got {:?}",
            resp.op_responses()
        )));
    };
    if let Some(kv) = sealed.kvs().first() {
        return Ok(RoundRead::Sealed(FinalRecord::parse(kv.key(), kv.value())?));
    }
    if closed.count() > 0 {
        return Ok(RoundRead::Closed);
    }
    let previous = match previous {
        [previous_final, previous_lanes] => match previous_final.kvs().first() {
            Some(kv) => {
                let sealed = FinalRecord::parse(kv.key(), kv.value())?;
                let chunks = previous_lanes.kvs().iter().map(|kv| (kv.key(), kv.value()));
                Some(members_from_chunks(&sealed, chunks)?)
            }
            None => None,
        },
        _ => None,
    };
    let me = rdzv.node();
    if let Some(kv) = drains
        .kvs()
        .iter()
        .find(|kv| Keys::node_of(kv.key()) == Some(me))
    {
        return Ok(RoundRead::Drained(
            String::from_utf8_lossy(kv.value()).into_owned(),
        ));
    }
    let nodes = |got: &GetResponse| -> HashSet<String> {
        got.kvs()
            .iter()
            .filter_map(|kv| Keys::node_of(kv.key()))
            .map(str::to_string)
            .collect()
    };
    let mut view = RoundView {
        round,
        joiners: BTreeMap::new(),
        revision_of: HashMap::new(),
        gone: HashMap::new(),
        newest_gone: 0,
        previous,
        alive: nodes(alive),
        draining: nodes(drains),
        newest_drain: drains
            .kvs()
            .iter()
            .map(|kv| kv.mod_revision())
            .max()
            .unwrap_or(0),
        leading: leader
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == me.as_bytes()),
        since,
    };
    for kv in joins.kvs() {
        view.add_joiner(kv.create_revision(), kv.key(), kv.value())?;
    }
    for kv in gone.kvs() {
        view.add_gone(kv.key(), kv.mod_revision());
    }
    if !view.revision_of.contains_key(me) {
        return Ok(RoundRead::Rejoin);
    }
    Ok(RoundRead::Open(
        Box::new(view),
        resp.header().map_or(0, |h| h.revision()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LAST_CALL: Duration = Duration::from_millis(500);
    const MEMBER_WAIT: Duration = Duration::from_secs(10);

    fn rule(min: usize, max: usize) -> SealRule {
        SealRule {
            min,
            max,
            last_call: LAST_CALL,
            member_wait: MEMBER_WAIT,
        }
    }

    /// A leader's view of round 1: `previous` is round 0 in rank order, `joined` joined round
    /// 1 in this order, and every node named is alive except the `dead`.
    fn view(previous: &[&str], joined: &[&str], dead: &[&str]) -> RoundView {
        let named = previous.iter().chain(joined);
        let mut view = RoundView {
            round: 1,
            joiners: BTreeMap::new(),
            revision_of: HashMap::new(),
            gone: HashMap::new(),
            newest_gone: 0,
            previous: Some(previous.iter().map(|m| m.to_string()).collect()),
            alive: named
                .filter(|n| !dead.contains(n))
                .map(|n| n.to_string())
                .collect(),
            draining: HashSet::new(),
            newest_drain: 0,
            leading: true,
            since: Since {
                at: Instant::now(),
                first_join: true,
            },
        };
        for (i, node) in joined.iter().enumerate() {
            let last = previous.iter().position(|m| m == node);
            let record = JoinRecord {
                addr: node.to_string(),
                port: 1,
                last: last.map(|rank| (0, rank as u32)),
                probe: None,
            };
            let rev = i as i64 + 1;
            view.revision_of.insert(node.to_string(), rev);
            view.joiners.insert(rev, (node.to_string(), record));
        }
        view
    }

    fn members(view: &RoundView, max: usize) -> Vec<String> {
        view.seal_record(max, 1).1
    }

    fn wait(until: Instant, held: bool) -> Decision {
        Decision::Wait {
            until: Some(until),
            held,
        }
    }

    /// Rank 0 (a) is alive but back after the last call; two spares and b have joined,
    /// max_nodes=2. The round waits for a, up to `lease_ttl` past the last call.
    #[test]
    fn a_live_member_back_after_the_last_call_keeps_rank_0_over_spares() {
        let (rule, t0) = (rule(2, 2), Instant::now());
        let mut last_call = None;
        let without_a = view(&["a", "b"], &["s1", "s2", "b"], &[]);
        let end = t0 + LAST_CALL;
        assert_eq!(
            without_a.decide(&rule, &mut last_call, t0),
            wait(end, false)
        );
        assert_eq!(last_call, Some(end));
        let held = wait(end + MEMBER_WAIT, true);
        assert_eq!(without_a.decide(&rule, &mut last_call, end), held);
        let later = end + MEMBER_WAIT - Duration::from_millis(1);
        assert_eq!(without_a.decide(&rule, &mut last_call, later), held);
        // a is back: the round is full with every live member, survivors first.
        let with_a = view(&["a", "b"], &["s1", "s2", "b", "a"], &[]);
        assert_eq!(
            with_a.decide(&rule, &mut last_call, later),
            Decision::Seal("max_nodes")
        );
        assert_eq!(members(&with_a, 2), ["a", "b"]);
        // a never comes back: the wait ends one member_wait after the last call.
        assert_eq!(
            without_a.decide(&rule, &mut last_call, end + MEMBER_WAIT),
            Decision::Seal("member_wait_over")
        );
        assert_eq!(members(&without_a, 2), ["b", "s1"]);
    }

    /// A member that is dead or leaving is not waited for: the spares fill the round at once.
    #[test]
    fn a_dead_or_drained_member_is_not_waited_for() {
        let rule = rule(2, 2);
        let dead = view(&["a", "b"], &["s1", "s2", "b"], &["a"]);
        let mut drained = view(&["a", "b"], &["s1", "s2", "b"], &[]);
        drained.draining.insert("a".to_string());
        for view in [dead, drained] {
            let mut last_call = None;
            let now = Instant::now();
            assert_eq!(
                view.decide(&rule, &mut last_call, now),
                Decision::Seal("max_nodes")
            );
            assert_eq!(members(&view, 2), ["b", "s1"]);
        }
    }

    /// Without spares too: b alone would take a's rank 0, so the round waits for a.
    #[test]
    fn rank_0_is_waited_for_even_when_nobody_else_would_fill_the_round() {
        let (rule, t0) = (rule(1, 2), Instant::now());
        let mut last_call = Some(t0);
        let view = view(&["a", "b"], &["b"], &[]);
        assert_eq!(
            view.decide(&rule, &mut last_call, t0),
            wait(t0 + MEMBER_WAIT, true)
        );
    }

    /// A member whose place nobody would take (the last rank, no newcomer) is not waited for
    /// past the last call; a newcomer that would take its place makes the round wait.
    #[test]
    fn a_member_is_waited_for_only_when_its_place_would_be_taken() {
        let (rule, t0) = (rule(1, 3), Instant::now());
        let alone = view(&["b", "a"], &["b"], &[]);
        let mut last_call = Some(t0);
        assert_eq!(
            alone.decide(&rule, &mut last_call, t0),
            Decision::Seal("last_call")
        );
        let with_newcomer = view(&["b", "a"], &["b", "n"], &[]);
        assert_eq!(
            with_newcomer.decide(&rule, &mut last_call, t0),
            wait(t0 + MEMBER_WAIT, true)
        );
        let back = view(&["b", "a"], &["b", "n", "a"], &[]);
        assert_eq!(
            back.decide(&rule, &mut last_call, t0),
            Decision::Seal("max_nodes")
        );
        assert_eq!(members(&back, 3), ["b", "a", "n"]);
    }

    /// A live node that was not a member keeps the last call, never more.
    #[test]
    fn a_live_node_that_was_not_a_member_is_not_waited_for_past_the_last_call() {
        let (rule, t0) = (rule(1, 3), Instant::now());
        let mut view = view(&["a", "b"], &["a", "b"], &[]);
        view.alive.insert("bystander".to_string());
        let mut last_call = None;
        assert_eq!(
            view.decide(&rule, &mut last_call, t0),
            wait(t0 + LAST_CALL, false)
        );
        assert_eq!(
            view.decide(&rule, &mut last_call, t0 + LAST_CALL),
            Decision::Seal("last_call")
        );
    }
}
