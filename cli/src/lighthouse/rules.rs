//! The quorum rules of torchft's Lighthouse, as pure functions of one state and the time, so
//! they can be tested without a clock or a network (the leader calls them under its lock):
//!
//! - only replica groups that heartbeated within `heartbeat_timeout` count (a quorum request
//!   is a heartbeat too);
//! - fast quorum: when every member of the last quorum is asking again and healthy, the
//!   quorum forms at once with whoever is asking;
//! - otherwise at least `min_replicas` healthy replicas must ask, more than half of the
//!   heartbeating ones (two halves cannot both form a quorum), and while some heartbeating
//!   replica has not asked, the quorum waits for it up to `join_timeout` after the first ask;
//! - a replica asking with `shrink_only` keeps newcomers out: only the last quorum's members;
//! - `quorum_id` grows when the members change (by replica id) or a member reports commit
//!   failures, and only then.

use super::proto::{Quorum, QuorumMember};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub min_replicas: u64,
    pub join_timeout: Duration,
    pub heartbeat_timeout: Duration,
}

/// A replica group waiting for a quorum.
#[derive(Clone, Debug)]
pub struct Asking {
    pub since: Instant,
    pub member: QuorumMember,
}

#[derive(Default, Debug)]
pub struct State {
    /// Replica groups asking for the next quorum, by replica id.
    pub asking: HashMap<String, Asking>,
    /// Last heartbeat of each replica group.
    pub heartbeats: HashMap<String, Instant>,
    /// The last quorum handed out.
    pub last: Option<Quorum>,
    pub quorum_id: i64,
}

/// What the rules decide now: the members of a quorum to form (sorted by replica id), or
/// why not yet.
#[derive(Debug, PartialEq)]
pub enum Decision {
    Form {
        members: Vec<QuorumMember>,
        why: String,
    },
    Wait(String),
}

impl State {
    /// A state resumed by a new leader: the last quorum and its id from etcd, and every member
    /// of that quorum counted as having heartbeated now (they heartbeat to whichever
    /// lighthouse leads, so the live ones confirm within one heartbeat period, and a dead one
    /// ages out after `heartbeat_timeout`, as it would have with the old leader).
    pub fn resumed(quorum_id: i64, last: Option<Quorum>, now: Instant) -> State {
        let heartbeats = last
            .iter()
            .flat_map(|q| &q.participants)
            .map(|m| (m.replica_id.clone(), now))
            .collect();
        State {
            asking: HashMap::new(),
            heartbeats,
            last,
            quorum_id,
        }
    }

    pub fn heartbeat(&mut self, replica_id: &str, now: Instant) {
        match self.heartbeats.get_mut(replica_id) {
            Some(at) => *at = now,
            None => {
                self.heartbeats.insert(replica_id.to_string(), now);
            }
        }
    }

    /// A replica group asks for a quorum (which is also a heartbeat).
    pub fn ask(&mut self, member: QuorumMember, now: Instant) {
        self.heartbeat(&member.replica_id, now);
        self.asking
            .insert(member.replica_id.clone(), Asking { since: now, member });
    }

    /// Replica ids that heartbeated within the timeout.
    pub fn healthy(&self, now: Instant, rules: &Rules) -> Vec<&str> {
        self.heartbeats
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) < rules.heartbeat_timeout)
            .map(|(id, _)| id.as_str())
            .collect()
    }

    pub fn decide(&self, now: Instant, rules: &Rules) -> Decision {
        let healthy = self.healthy(now, rules);
        let is_healthy = |id: &str| {
            self.heartbeats
                .get(id)
                .is_some_and(|at| now.saturating_duration_since(*at) < rules.heartbeat_timeout)
        };
        // Sorted by replica id: every member sees the same order.
        let asking: BTreeMap<&str, &Asking> = self
            .asking
            .iter()
            .filter(|(id, _)| is_healthy(id))
            .map(|(id, a)| (id.as_str(), a))
            .collect();
        let shrink_only = asking.values().any(|a| a.member.shrink_only);
        let about = format!(
            "[{}/{} asking healthy][{} heartbeating][shrink_only={}]",
            asking.len(),
            self.asking.len(),
            healthy.len(),
            shrink_only
        );
        let mut members: Vec<QuorumMember> = asking.values().map(|a| a.member.clone()).collect();
        if let Some(last) = &self.last {
            if shrink_only {
                members.retain(|m| {
                    last.participants
                        .iter()
                        .any(|p| p.replica_id == m.replica_id)
                });
            }
            if last
                .participants
                .iter()
                .all(|p| asking.contains_key(p.replica_id.as_str()))
            {
                return Decision::Form {
                    members,
                    why: format!("fast quorum: every member of the last one is back {about}"),
                };
            }
        }
        if (asking.len() as u64) < rules.min_replicas {
            return Decision::Wait(format!(
                "{} asking, min_replicas is {} {about}",
                asking.len(),
                rules.min_replicas
            ));
        }
        if asking.len() <= healthy.len() / 2 {
            return Decision::Wait(format!(
                "{} asking, not more than half of {} heartbeating {about}",
                asking.len(),
                healthy.len()
            ));
        }
        if asking.len() < healthy.len() {
            let first = asking.values().map(|a| a.since).min().unwrap_or(now);
            let waited = now.saturating_duration_since(first);
            if waited < rules.join_timeout {
                return Decision::Wait(format!(
                    "waiting up to join_timeout for {} heartbeating stragglers {about}",
                    healthy.len() - asking.len()
                ));
            }
        }
        Decision::Form {
            members,
            why: format!("quorum {about}"),
        }
    }
}

/// The id of a quorum of `members` following `last` (whose id is `id`): one more when the
/// members changed (by replica id, in order) or any reports commit failures.
pub fn next_quorum_id(last: Option<&Quorum>, members: &[QuorumMember], id: i64) -> i64 {
    let changed = last.is_none_or(|q| {
        q.participants
            .iter()
            .map(|p| &p.replica_id)
            .ne(members.iter().map(|m| &m.replica_id))
    });
    if changed || members.iter().any(|m| m.commit_failures > 0) {
        id + 1
    } else {
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules {
        min_replicas: 1,
        join_timeout: Duration::from_secs(60),
        heartbeat_timeout: Duration::from_secs(5),
    };

    fn member(id: &str) -> QuorumMember {
        QuorumMember {
            replica_id: id.into(),
            ..Default::default()
        }
    }

    fn ids(d: &Decision) -> Vec<String> {
        match d {
            Decision::Form { members, .. } => {
                members.iter().map(|m| m.replica_id.clone()).collect()
            }
            Decision::Wait(why) => panic!("expected a quorum, got: {why}"),
        }
    }

    fn quorum(id: i64, members: &[&str]) -> Quorum {
        Quorum {
            quorum_id: id,
            participants: members.iter().map(|m| member(m)).collect(),
            created: None,
        }
    }

    #[test]
    fn a_lone_replica_forms_at_once_when_nobody_else_heartbeats() {
        let now = Instant::now();
        let mut s = State::default();
        s.ask(member("a"), now);
        assert_eq!(ids(&s.decide(now, &RULES)), ["a"]);
    }

    #[test]
    fn min_replicas_holds_back_a_quorum() {
        let now = Instant::now();
        let rules = Rules {
            min_replicas: 2,
            ..RULES
        };
        let mut s = State::default();
        s.ask(member("a"), now);
        assert!(matches!(s.decide(now, &rules), Decision::Wait(_)));
        s.ask(member("b"), now);
        assert_eq!(ids(&s.decide(now, &rules)), ["a", "b"]);
    }

    #[test]
    fn stragglers_are_waited_for_up_to_join_timeout_then_left_out() {
        let t0 = Instant::now();
        let mut s = State::default();
        for id in ["a", "b", "c"] {
            s.heartbeat(id, t0);
        }
        s.ask(member("a"), t0);
        s.ask(member("b"), t0);
        // 2 of 3 heartbeating: a majority, but c is waited for.
        assert!(matches!(s.decide(t0, &RULES), Decision::Wait(_)));
        let later = t0 + RULES.join_timeout;
        for id in ["a", "b", "c"] {
            s.heartbeat(id, later);
        }
        assert_eq!(ids(&s.decide(later, &RULES)), ["a", "b"]);
    }

    #[test]
    fn half_of_the_heartbeating_replicas_is_not_enough() {
        let t0 = Instant::now();
        let mut s = State::default();
        for id in ["a", "b", "c", "d"] {
            s.heartbeat(id, t0);
        }
        s.ask(member("a"), t0);
        s.ask(member("b"), t0);
        let late = t0 + RULES.join_timeout;
        for id in ["a", "b", "c", "d"] {
            s.heartbeat(id, late);
        }
        assert!(matches!(s.decide(late, &RULES), Decision::Wait(w) if w.contains("half")));
    }

    #[test]
    fn only_heartbeating_replicas_count() {
        let t0 = Instant::now();
        let mut s = State::default();
        s.ask(member("a"), t0);
        s.ask(member("b"), t0);
        let late = t0 + RULES.heartbeat_timeout;
        s.heartbeat("a", late);
        // b's ask is stale: it neither counts as asking nor as heartbeating.
        assert_eq!(ids(&s.decide(late, &RULES)), ["a"]);
    }

    #[test]
    fn fast_quorum_when_every_last_member_asks_and_includes_newcomers() {
        let t0 = Instant::now();
        let mut s = State {
            last: Some(quorum(3, &["a", "b"])),
            quorum_id: 3,
            ..Default::default()
        };
        // c heartbeats but does not ask; e asks: the fast path does not wait for c.
        s.heartbeat("c", t0);
        s.heartbeat("d", t0);
        s.ask(member("a"), t0);
        s.ask(member("b"), t0);
        s.ask(member("e"), t0);
        assert_eq!(ids(&s.decide(t0, &RULES)), ["a", "b", "e"]);
    }

    #[test]
    fn shrink_only_keeps_newcomers_out() {
        let t0 = Instant::now();
        let mut s = State {
            last: Some(quorum(3, &["a", "b"])),
            ..Default::default()
        };
        s.ask(member("a"), t0);
        s.ask(
            QuorumMember {
                shrink_only: true,
                ..member("b")
            },
            t0,
        );
        s.ask(member("z"), t0);
        assert_eq!(ids(&s.decide(t0, &RULES)), ["a", "b"]);
    }

    #[test]
    fn a_resumed_leader_counts_the_last_members_as_heartbeating() {
        let t0 = Instant::now();
        let mut s = State::resumed(7, Some(quorum(7, &["a", "b", "c"])), t0);
        s.ask(member("a"), t0);
        // Without the resumed heartbeats, a alone would be everyone heartbeating.
        assert!(matches!(s.decide(t0, &RULES), Decision::Wait(_)));
        s.ask(member("b"), t0);
        s.ask(member("c"), t0);
        assert_eq!(ids(&s.decide(t0, &RULES)), ["a", "b", "c"]);
        // A member that died during the failover ages out as with the old leader.
        let mut s = State::resumed(7, Some(quorum(7, &["a", "b", "c"])), t0);
        let late = t0 + RULES.heartbeat_timeout;
        s.ask(member("a"), late);
        s.ask(member("b"), late);
        assert_eq!(ids(&s.decide(late, &RULES)), ["a", "b"]);
    }

    #[test]
    fn quorum_id_grows_on_membership_change_and_commit_failures_only() {
        let last = quorum(4, &["a", "b"]);
        assert_eq!(next_quorum_id(None, &[member("a")], 0), 1);
        assert_eq!(
            next_quorum_id(Some(&last), &[member("a"), member("b")], 4),
            4
        );
        assert_eq!(next_quorum_id(Some(&last), &[member("a")], 4), 5);
        assert_eq!(
            next_quorum_id(Some(&last), &[member("a"), member("c")], 4),
            5
        );
        let failed = QuorumMember {
            commit_failures: 1,
            ..member("b")
        };
        assert_eq!(next_quorum_id(Some(&last), &[member("a"), failed], 4), 5);
    }
}
