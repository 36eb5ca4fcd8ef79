//! The keys a run's status is made of, as of one etcd revision: read once, then kept current
//! from a watch's events. A scheduler that watches many runs then costs etcd nothing per
//! change but the events it is sent anyway; before, every settled change was read back with
//! two transactions through etcd's leader (168 reads a second for 100 jobs with churn).
//!
//! Why the events are enough: a status needs the run-wide keys (`closed`, `current`, `alive/`,
//! `drain/`, the notes), the open round's joins and the last sealed round's seal. The first
//! read takes the run-wide keys, round `n`'s (the open one) joins and lanes, and round
//! `n - 1`'s seal. Nothing of a later round exists at that revision (a join is written only
//! while `current` names its round, a seal while its round is open), so every key of a later
//! round, and round `n`'s own seal, comes as an event; a purge or a finished run's clean-up
//! deletes by events too. Only `current` going back below `n` while that round's keys stay
//! would need keys the view never had; the protocol never does that, and `complete` has the
//! watcher read afresh if it ever happens.

use super::{EtcdAlarm, Joiner, Member, RunStatus, SealedRound};
use crate::backend::keys::Keys;
use crate::backend::{ranges, Etcd};
use crate::error::{Error, Result};
use crate::rendezvous::records::{members_from_chunks, FinalRecord, JoinRecord};
use etcd_client::{Event, EventType, GetOptions, KeyValue, Txn, TxnOp};
use std::collections::{BTreeMap, HashMap, HashSet};
use tokio::time::Instant;

/// A key's value and the revision that created it (joiners are listed in arrival order).
struct Held {
    value: Vec<u8>,
    created: i64,
}

pub(super) struct View {
    keys: Keys,
    /// The keys of the status's, by key.
    held: BTreeMap<Vec<u8>, Held>,
    /// How many keys the run has in all, its stores' included: whether it exists.
    total: i64,
    /// The revision the view is at.
    revision: i64,
    /// The revision it was read at: events up to it are in the read already.
    read_at: i64,
    /// The open round when the view was read: rounds from here on are complete.
    first_open: u64,
    /// The open round the held keys were last pruned for.
    pruned_for: u64,
}

/// The round of a key under `r/`, and what follows the round's `/`.
fn round_of<'k>(keys: &Keys, key: &'k [u8]) -> Option<(u64, &'k [u8])> {
    let rest = key.strip_prefix(keys.rounds_prefix().as_bytes())?;
    let digits = std::str::from_utf8(rest.get(..20)?).ok()?;
    Some((digits.parse().ok()?, rest.get(21..)?))
}

fn parse_round(kv: &KeyValue) -> Result<u64> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            Error::state(format!(
                "corrupt or foreign data at etcd key {:?}: not a round number",
                String::from_utf8_lossy(kv.key())
            ))
        })
}

impl View {
    /// Reads the view at one revision: the run-wide keys first (they say which round is
    /// open), then that round's keys and the seal before it, at the same revision.
    pub async fn read(etcd: &Etcd, keys: &Keys, deadline: Instant) -> Result<View> {
        let prefix = GetOptions::new().with_prefix();
        let first = Txn::new().and_then([
            TxnOp::get(keys.namespace(), Some(prefix.clone().with_count_only())),
            TxnOp::get(keys.closed(), None),
            TxnOp::get(keys.current(), None),
            TxnOp::get(keys.alive_prefix(), Some(prefix.clone())),
            TxnOp::get(keys.drain_prefix(), Some(prefix.clone())),
            TxnOp::get(keys.run_notes_prefix(), Some(prefix.clone())),
        ]);
        let resp = etcd.txn(deadline, "status", first).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let got = ranges(&resp);
        let open = match got[2].kvs().first() {
            Some(kv) => parse_round(kv)?,
            None => 0,
        };
        let at = GetOptions::new().with_revision(revision);
        let mut reads = vec![
            TxnOp::get(keys.join_prefix(open), Some(at.clone().with_prefix())),
            TxnOp::get(keys.lanes_prefix(open), Some(at.clone().with_prefix())),
        ];
        if let Some(sealed) = open.checked_sub(1) {
            reads.push(TxnOp::get(keys.final_(sealed), Some(at.clone())));
            reads.push(TxnOp::get(
                keys.lanes_prefix(sealed),
                Some(at.with_prefix()),
            ));
        }
        let second = etcd
            .txn(deadline, "status", Txn::new().and_then(reads))
            .await?;
        let mut view = View {
            keys: keys.clone(),
            held: BTreeMap::new(),
            total: got[0].count(),
            revision,
            read_at: revision,
            first_open: open,
            pruned_for: open,
        };
        let second = ranges(&second);
        let kvs = got[1..].iter().chain(second.iter()).flat_map(|r| r.kvs());
        for kv in kvs {
            view.held.insert(
                kv.key().to_vec(),
                Held {
                    value: kv.value().to_vec(),
                    created: kv.create_revision(),
                },
            );
        }
        Ok(view)
    }

    /// Whether `key` is one the status is made of.
    fn is_held(&self, key: &[u8]) -> bool {
        let k = &self.keys;
        if let Some((_, rest)) = round_of(k, key) {
            return rest.starts_with(b"join/")
                || rest.starts_with(b"lane/")
                || rest == b"seal/final";
        }
        key == k.closed().as_bytes()
            || key == k.current().as_bytes()
            || key.starts_with(k.alive_prefix().as_bytes())
            || key.starts_with(k.drain_prefix().as_bytes())
            || key.starts_with(k.run_notes_prefix().as_bytes())
    }

    /// Applies a watch's events (those the first read already saw are skipped).
    pub fn apply(&mut self, events: &[Event]) {
        for event in events {
            let Some(kv) = event.kv() else { continue };
            // One transaction's events share a revision: compare with the read's, not the last.
            if kv.mod_revision() <= self.read_at {
                continue;
            }
            self.revision = self.revision.max(kv.mod_revision());
            match event.event_type() {
                EventType::Put => {
                    if kv.version() == 1 {
                        self.total += 1;
                    }
                    if self.is_held(kv.key()) {
                        let held = Held {
                            value: kv.value().to_vec(),
                            created: kv.create_revision(),
                        };
                        self.held.insert(kv.key().to_vec(), held);
                    }
                }
                EventType::Delete => {
                    self.total -= 1;
                    self.held.remove(kv.key());
                }
            }
        }
        // Rounds before the sealed one are never shown again: let their keys go, once per
        // new open round (not on every batch: a run of 4096 nodes holds some 8000 keys).
        if let Some(open) = self.open_round().ok().filter(|&o| o != self.pruned_for) {
            self.pruned_for = open;
            let keep = self.keys.round_prefix(open.saturating_sub(1));
            let rounds = self.keys.rounds_prefix();
            self.held.retain(|key, _| {
                !key.starts_with(rounds.as_bytes()) || key.as_slice() >= keep.as_bytes()
            });
        }
    }

    /// False once the open round went back below the one first read (the run was purged and
    /// begun again): its keys from before that read are missing, so read the view afresh.
    pub fn complete(&self) -> bool {
        self.open_round()
            .map_or(true, |open| open >= self.first_open)
    }

    fn get(&self, key: &str) -> Option<&Held> {
        self.held.get(key.as_bytes())
    }

    /// The held keys under `prefix`, in key order, with the key's tail after `prefix`.
    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a [u8], &'a Held)> + 'a {
        self.held
            .range(prefix.as_bytes().to_vec()..)
            .take_while(move |(key, _)| key.starts_with(prefix.as_bytes()))
            .map(|(key, held)| (key.as_slice(), held))
    }

    fn open_round(&self) -> Result<u64> {
        let Some(held) = self.get(&self.keys.current()) else {
            return Ok(0);
        };
        std::str::from_utf8(&held.value)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                Error::state(format!(
                    "corrupt or foreign data at etcd key {:?}: not a round number",
                    self.keys.current()
                ))
            })
    }

    /// The run's status as the view holds it.
    pub fn status(&self, run_id: &str, alarms: Vec<EtcdAlarm>) -> Result<RunStatus> {
        let k = &self.keys;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let open_round = self.open_round()?;
        let alive_prefix = k.alive_prefix();
        let alive: HashMap<&str, String> = self
            .under(&alive_prefix)
            .filter_map(|(key, held)| Some((Keys::node_of(key)?, text(&held.value))))
            .collect();
        let drain_prefix = k.drain_prefix();
        let draining: HashSet<&str> = self
            .under(&drain_prefix)
            .filter_map(|(key, _)| Keys::node_of(key))
            .collect();
        let notes_prefix = k.run_notes_prefix();
        let notes = self
            .under(&notes_prefix)
            .map(|(key, held)| (text(&key[notes_prefix.len()..]), text(&held.value)))
            .collect();
        let sealed = match open_round.checked_sub(1) {
            Some(round) => match self.get(&k.final_(round)) {
                Some(held) => {
                    let sealed = FinalRecord::parse(k.final_(round).as_bytes(), &held.value)?;
                    let lanes = k.lanes_prefix(round);
                    let chunks = self.under(&lanes).map(|(key, held)| (key, &held.value[..]));
                    let members = members_from_chunks(&sealed, chunks)?;
                    Some((sealed, members))
                }
                None => None,
            },
            None => None,
        };
        let join_prefix = k.join_prefix(open_round);
        let mut joins: Vec<(&[u8], &Held)> = self.under(&join_prefix).collect();
        joins.sort_by_key(|(_, held)| held.created);
        let waiting = joins
            .into_iter()
            .map(|(key, held)| {
                let record = JoinRecord::parse(key, &held.value)?;
                let node = Keys::node_of(key).unwrap_or_default().to_string();
                let member_rank = sealed.as_ref().and_then(|(_, members)| {
                    members.iter().position(|m| *m == node).map(|i| i as u32)
                });
                Ok(Joiner {
                    draining: draining.contains(node.as_str()),
                    node,
                    addr: record.addr,
                    member_rank,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let sealed = sealed.map(|(f, members)| SealedRound {
            round: f.round,
            master_addr: f.master_addr,
            master_port: f.master_port,
            members: members
                .iter()
                .enumerate()
                .map(|(rank, node)| Member {
                    rank: rank as u32,
                    addr: alive.get(node.as_str()).cloned(),
                    alive: alive.contains_key(node.as_str()),
                    draining: draining.contains(node.as_str()),
                    node: node.clone(),
                })
                .collect(),
        });
        let closed = self.get(&k.closed());
        Ok(RunStatus {
            run_id: run_id.to_string(),
            exists: self.total > 0,
            closed: closed.is_some(),
            failure: closed.and_then(|held| crate::rendezvous::wake::closed_failure(&held.value)),
            open_round,
            sealed,
            waiting,
            alive: alive.len(),
            notes,
            alarms,
            revision: self.revision,
        })
    }
}
