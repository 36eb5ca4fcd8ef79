//! Operator access to a run, without joining it: what state it is in (`status`), every change
//! as it happens (`watch`), closing it (`close`), deleting what it left in etcd (`purge`), and
//! announcing that a node will leave (`drain`); and every run on one etcd (`runs`, `for_run`),
//! for a scheduler's view of all its jobs. A scheduler reaches the same calls but `runs`
//! through the C ABI (`rdzv_admin_*`) and every binding.
//!
//! The key layout stays private to the library (`backend::keys`); this module is the one
//! public way to read it, so tools such as `rdzv status` never parse etcd keys themselves.
//! An `Admin` holds no lease and writes no `alive` key: looking at a run never makes a node
//! appear in it, and closing or purging one never counts as a member leaving.
//!
//! A status is read at one etcd revision (the first read fixes it, the others read at it), so
//! it is a consistent snapshot even while rounds form.

mod runs;

mod view;

use view::View;

use crate::backend::keys::Keys;
use crate::backend::{ranges, Etcd, Target};
use crate::error::Result;
use crate::params::Params;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use once_cell::sync::Lazy;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The alarms last read from each cluster (by its endpoints), and when: see `Admin::alarms`.
static ALARMS: Lazy<Mutex<HashMap<String, AlarmsRead>>> = Lazy::new(Default::default);

/// When alarms were read, and what they were.
type AlarmsRead = (Instant, Vec<EtcdAlarm>);

/// How long a read of "no alarm" is reused.
const ALARMS_KEPT: Duration = Duration::from_secs(1);

/// A run as an operator sees it at one etcd revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStatus {
    pub run_id: String,
    /// False when etcd holds nothing for this run (never started, finished and cleaned up,
    /// or purged).
    pub exists: bool,
    /// `set_closed` was called (the marker lasts `retention`).
    pub closed: bool,
    /// The run was closed as failed (`Rendezvous::set_failed`): why.
    pub failure: Option<String>,
    /// The round open for joining.
    pub open_round: u64,
    /// The last sealed round (the one the members are running), if any is still recorded.
    pub sealed: Option<SealedRound>,
    /// Nodes that joined the open round, in arrival order: newcomers waiting to be admitted,
    /// and members already re-joining during a re-rendezvous.
    pub waiting: Vec<Joiner>,
    /// Live nodes of the run (members, waiting nodes and spares alike).
    pub alive: usize,
    /// The run's notes: the keys of the run's store (`Rendezvous::run_store`) under `notes/`,
    /// without that prefix, and their values as text (UTF-8, invalid bytes replaced), in key
    /// order. What the nodes want an operator to see (why a node left, the last hang report).
    pub notes: BTreeMap<String, String>,
    /// Alarms the etcd cluster has raised (for every run on it, not this one alone): while
    /// `NOSPACE` is raised etcd refuses every write, so no round forms and no store takes a
    /// value until an operator frees space and disarms it.
    pub alarms: Vec<EtcdAlarm>,
    /// The etcd revision this status was read at (not part of equality).
    pub revision: i64,
}

/// An alarm raised by one etcd member, as `etcdctl alarm list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAlarm {
    /// The member that raised it.
    pub member: u64,
    /// `NOSPACE` (the database reached its quota), `CORRUPT` (a member's data differs from
    /// the others'), or etcd's number for a kind this version does not know.
    pub alarm: String,
}

impl std::fmt::Display for EtcdAlarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on member {:x}", self.alarm, self.member)
    }
}

/// A sealed round: its members in rank order and rank 0's bootstrap address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRound {
    pub round: u64,
    pub master_addr: String,
    pub master_port: u16,
    pub members: Vec<Member>,
}

/// One member of a sealed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub rank: u32,
    pub node: String,
    /// The address the node registered (known while it is alive).
    pub addr: Option<String>,
    /// Its lease is live. A member that is not alive is *lost*: the survivors re-form without
    /// it.
    pub alive: bool,
    /// It was drained (a planned departure): the survivors re-form without it, at once.
    pub draining: bool,
}

/// A node that joined the open round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joiner {
    pub node: String,
    pub addr: String,
    /// Its rank in the sealed round, if it was a member (a re-rendezvous is under way).
    pub member_rank: Option<u32>,
    /// It was drained: it will not be sealed into a round.
    pub draining: bool,
}

/// What `purge` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    /// The run's keys were deleted (this many).
    Deleted(i64),
    /// Nothing was deleted: the run is running. `alive`: its nodes' `alive` keys;
    /// `lease_live`: its lease is still refreshed (a running job keeps it, whatever else has
    /// deleted its `alive` keys).
    Refused { alive: usize, lease_live: bool },
}

impl RunStatus {
    /// Members of the sealed round that are alive but drained (leaving).
    pub fn draining(&self) -> Vec<&Member> {
        self.sealed
            .iter()
            .flat_map(|s| s.members.iter())
            .filter(|m| m.alive && m.draining)
            .collect()
    }

    /// Members of the sealed round whose lease has expired.
    pub fn lost(&self) -> Vec<&Member> {
        self.sealed
            .iter()
            .flat_map(|s| s.members.iter())
            .filter(|m| !m.alive)
            .collect()
    }

    /// The status as one JSON object (the shape `rdzv status --json` prints).
    pub fn to_json(&self) -> Value {
        let sealed = self.sealed.as_ref().map(|s| {
            json!({
                "round": s.round,
                "master_addr": s.master_addr,
                "master_port": s.master_port,
                "members": s.members.iter().map(|m| json!({
                    "rank": m.rank, "node": m.node, "addr": m.addr, "alive": m.alive,
                    "draining": m.draining,
                })).collect::<Vec<_>>(),
            })
        });
        json!({
            "run_id": self.run_id,
            "exists": self.exists,
            "closed": self.closed,
            "failure": self.failure,
            "open_round": self.open_round,
            "sealed": sealed,
            "waiting": self.waiting.iter().map(|j| json!({
                "node": j.node, "addr": j.addr, "member_rank": j.member_rank,
                "draining": j.draining,
            })).collect::<Vec<_>>(),
            "lost": self.lost().iter().map(|m| json!({"rank": m.rank, "node": m.node})).collect::<Vec<_>>(),
            "draining": self.draining().iter().map(|m| json!({"rank": m.rank, "node": m.node})).collect::<Vec<_>>(),
            "alive": self.alive,
            "notes": self.notes,
            "alarms": self.alarms.iter().map(|a| json!({
                "alarm": a.alarm, "member": format!("{:x}", a.member),
            })).collect::<Vec<_>>(),
            "revision": self.revision,
        })
    }

    /// Equality of everything an operator sees (the revision aside).
    fn same_as(&self, other: &RunStatus) -> bool {
        RunStatus {
            revision: 0,
            ..self.clone()
        } == RunStatus {
            revision: 0,
            ..other.clone()
        }
    }
}

/// An operator's connection to one run (named by the run id and key prefix of `params`).
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Admin {
    params: Params,
    etcd: Etcd,
    keys: Keys,
}

impl Admin {
    /// Connects to etcd within `connect_timeout`. Registers nothing.
    pub async fn connect(params: Params) -> Result<Admin> {
        params.validate()?;
        let etcd = Etcd::connect(&params).await?;
        let keys = Keys::new(params.key_prefix(), params.run_id());
        Ok(Admin { params, etcd, keys })
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.params.connect_timeout()
    }

    /// Reads the run's state at one revision.
    pub async fn status(&self) -> Result<RunStatus> {
        let deadline = self.deadline();
        let view = View::read(&self.etcd, &self.keys, deadline).await?;
        self.status_of(&view, deadline).await
    }

    async fn status_of(&self, view: &View, deadline: Instant) -> Result<RunStatus> {
        let alarms = self.alarms(deadline).await?;
        view.status(self.params.run_id(), alarms)
    }

    /// The cluster's alarms, allowed to every user (the read-only observer of
    /// `tests/security.rs` reads them too). Reading them is a request through etcd's raft
    /// log, as a write is (it costs no revision), and they are the cluster's, not a run's: a
    /// process that reads the status of many runs (a scheduler watching every job) asks at
    /// most once per `ALARMS_KEPT` per cluster while there is none. A list with an alarm in
    /// it is read afresh every time, so a cleared alarm shows at once.
    async fn alarms(&self, deadline: Instant) -> Result<Vec<EtcdAlarm>> {
        use etcd_client::{AlarmAction, AlarmType};
        let cluster = self.etcd.endpoints().to_string();
        let none_lately = ALARMS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&cluster)
            .is_some_and(|(read, alarms)| alarms.is_empty() && read.elapsed() < ALARMS_KEPT);
        if none_lately {
            return Ok(Vec::new());
        }
        let resp = self
            .etcd
            .call(deadline, "status (etcd's alarms)", |mut c| async move {
                c.alarm(AlarmAction::Get, AlarmType::None, None).await
            })
            .await?;
        let alarms = resp
            .alarms()
            .iter()
            .map(|a| EtcdAlarm {
                member: a.member_id(),
                alarm: match a.alarm() {
                    AlarmType::Nospace => "NOSPACE".into(),
                    AlarmType::Corrupt => "CORRUPT".into(),
                    other => format!("alarm {}", other as i32),
                },
            })
            .collect::<Vec<_>>();
        ALARMS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cluster, (Instant::now(), alarms.clone()));
        Ok(alarms)
    }

    /// Watches the run: `StatusWatch::next` returns the current status first, then each
    /// status that differs from the one before, as etcd reports the change (by watch, not by
    /// polling), once the burst of changes has passed (see `SETTLE_MAX`). The status is read
    /// when the watch opens (and again after it breaks) and kept from the events after that,
    /// so a watcher costs etcd no read per change. Writes to a round's store, and to the
    /// run's store outside its notes, do not count as changes.
    pub fn watch(&self) -> StatusWatch {
        StatusWatch {
            admin: self.clone(),
            watch: None,
            view: None,
            dirty: true,
            broken_since: None,
            changed_at: None,
            last: None,
        }
    }

    /// Marks `node` as leaving the run (a planned departure: preemption notice, maintenance,
    /// scale-down). The other members count it in `num_lost` at once and re-form without it;
    /// its own `next` ends with a graceful exit. The mark lasts as long as the node's lease.
    /// `reason` is shown to the node and in logs. Fails with an invalid argument if `node` is
    /// not a live node of the run.
    pub async fn drain(&self, node: &str, reason: &str) -> Result<()> {
        let deadline = self.deadline();
        crate::rendezvous::drain::mark(&self.etcd, &self.keys, node, reason, None, deadline)
            .await?;
        tracing::info!(run = %self.params.run_id(), node, reason, "drained a node (operator)");
        Ok(())
    }

    /// Ends a node's membership at once, from another process: revokes the lease of `ticket`
    /// (`Rendezvous::release_ticket`), which deletes the node's `alive` key, its join keys and
    /// any leadership, so the others see it lost within a round trip instead of one
    /// `lease_ttl` later. For a helper that outlives a launcher killed without a chance to
    /// shut down (`rdzv run`'s watchdog). Only the lease that the node's `alive` key is bound
    /// to is revoked: returns false, revoking nothing, when the node is gone already or has
    /// taken another lease since the ticket was written.
    pub async fn release(&self, ticket: &crate::ReleaseTicket) -> Result<bool> {
        let deadline = self.deadline();
        let alive = self
            .etcd
            .get(
                deadline,
                "release: the node's alive key",
                self.keys.alive(&ticket.node),
                GetOptions::new(),
            )
            .await?;
        // Lease ids are never reused by etcd, so the id read here is still this node's when
        // the revoke lands (or gone, which revoke takes as done).
        let bound = alive.kvs().first().map(|kv| kv.lease());
        if bound != Some(ticket.lease) {
            tracing::info!(run = %self.params.run_id(), node = %ticket.node, lease = ticket.lease,
                bound, "release: the node no longer holds this lease; nothing revoked");
            return Ok(false);
        }
        crate::backend::lease::revoke(&self.etcd, ticket.lease, deadline).await?;
        tracing::info!(run = %self.params.run_id(), node = %ticket.node, lease = ticket.lease,
            "released a node: revoked its lease");
        Ok(true)
    }

    /// Closes the run for every node, as `Rendezvous::set_closed` does: blocked `next` calls
    /// return closed and later ones fail at once. The marker expires after `retention`.
    pub async fn close(&self) -> Result<()> {
        let deadline = Instant::now() + self.params.close_timeout();
        crate::rendezvous::wake::close(
            &self.etcd,
            &self.keys,
            self.params.retention(),
            "close",
            deadline,
            crate::rendezvous::wake::closed_value(None),
        )
        .await?;
        tracing::info!(run = %self.params.run_id(), "closed the run (operator)");
        Ok(())
    }

    /// Deletes every key of the run (rounds, stores, round counter, `closed` marker), so its id
    /// can be used again at once. Refuses, deleting nothing, while the run looks alive by
    /// either of two kinds of key (a node's `alive` key, or the run's lease, which every live
    /// node refreshes and whose key expires with it), unless `force` (which leaves running
    /// nodes without their keys: they fail). The check and the delete are one transaction.
    pub async fn purge(&self, force: bool) -> Result<Purge> {
        let everything = TxnOp::delete(
            self.keys.namespace(),
            Some(DeleteOptions::new().with_prefix()),
        );
        let guards = match force {
            true => vec![],
            false => vec![
                Compare::create_revision(self.keys.alive_prefix(), CompareOp::Equal, 0)
                    .with_prefix(),
                Compare::create_revision(self.keys.run_lease(), CompareOp::Equal, 0),
            ],
        };
        let txn = Txn::new().when(guards).and_then([everything]).or_else([
            TxnOp::get(
                self.keys.alive_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
            TxnOp::get(
                self.keys.run_lease(),
                Some(GetOptions::new().with_count_only()),
            ),
        ]);
        let resp = self.etcd.txn(self.deadline(), "purge", txn).await?;
        if !resp.succeeded() {
            let got = ranges(&resp);
            let alive = got.first().map_or(0, |g| g.count()) as usize;
            let lease_live = got.get(1).is_some_and(|g| g.count() > 0);
            return Ok(Purge::Refused { alive, lease_live });
        }
        let deleted = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                etcd_client::TxnOpResponse::Delete(d) => Some(d.deleted()),
                _ => None,
            })
            .unwrap_or(0);
        tracing::info!(run = %self.params.run_id(), keys = deleted, force, "purged the run");
        Ok(Purge::Deleted(deleted))
    }
}

/// A live view of one run; see `Admin::watch`.
pub struct StatusWatch {
    admin: Admin,
    watch: Option<crate::backend::Watch>,
    /// The run's keys as the watch has told them, read when the watch (re)opens.
    view: Option<View>,
    /// A change was seen (or the watch was reopened) and not yet read: kept across a `next`
    /// that is dropped midway (a timeout or a cancel), so no change is lost.
    dirty: bool,
    /// Since when the watch has been down: reopening it is bounded by `connect_timeout` from
    /// then, across calls, so a caller that waits in short slices still gets the error.
    broken_since: Option<Instant>,
    /// When the first change not yet read was seen: the read waits for the burst it belongs
    /// to (a round is one event per join, then the seal) to pass, up to `SETTLE_MAX`.
    changed_at: Option<Instant>,
    last: Option<RunStatus>,
}

/// A watch reads the status once the run's keys have been quiet this long after a change...
const SETTLE_QUIET: Duration = Duration::from_millis(20);
/// ...or this long after the change, whichever comes first. Reading on every event made a
/// watcher read a round of 8 about ten times, while it formed, and slowed it by a third
/// (`scripts/soak.sh`, docs/OPERATIONS.md).
const SETTLE_MAX: Duration = Duration::from_millis(200);

impl StatusWatch {
    /// The current status on the first call; after that, waits for the next change an
    /// operator would see and returns the new status. Waits as long as nothing changes; a
    /// broken watch (etcd restarted, history compacted) is reopened and the state read afresh
    /// (an etcd that stays down ends the call with a connection error after
    /// `connect_timeout`; the next call tries again). Cancel-safe: dropping the future (a
    /// timeout) loses no change.
    pub async fn next(&mut self) -> Result<RunStatus> {
        loop {
            match self.watch.as_mut() {
                None => {
                    // Watch first, then read: a change between the two is not missed (the
                    // view skips the events its read already saw).
                    let target = Target::Prefix(self.admin.keys.namespace().to_string());
                    let since = *self.broken_since.get_or_insert_with(Instant::now);
                    let deadline = since + self.admin.params.connect_timeout();
                    let opened = self.admin.etcd.watch(&[target], deadline).await;
                    if opened.is_err() {
                        // The next call starts a new deadline: this one has been reported.
                        self.broken_since = None;
                    }
                    self.watch = Some(opened?);
                    self.view = None;
                    self.dirty = true;
                }
                Some(_) if self.dirty => {}
                Some(watch) => match watch.events().await {
                    None => self.watch = None,
                    Some(events) => {
                        self.dirty = events
                            .iter()
                            .any(|e| e.kv().is_some_and(|kv| !self.is_store_key(kv.key())));
                        if self.dirty {
                            self.changed_at = Some(Instant::now());
                        }
                        if let Some(view) = self.view.as_mut() {
                            view.apply(&events);
                        }
                    }
                },
            }
            if !self.dirty || self.watch.is_none() {
                continue;
            }
            if let Some(first) = self.changed_at {
                let until = first + SETTLE_MAX;
                while let Some(watch) = self.watch.as_mut() {
                    let quiet = (Instant::now() + SETTLE_QUIET).min(until);
                    match tokio::time::timeout_at(quiet, watch.events()).await {
                        Ok(Some(events)) => {
                            if let Some(view) = self.view.as_mut() {
                                view.apply(&events);
                            }
                        }
                        // Broken: reopened and read afresh.
                        Ok(None) => self.watch = None,
                        Err(_) => break,
                    }
                }
                if self.watch.is_none() {
                    continue;
                }
            }
            let deadline = self.admin.deadline();
            if !self.view.as_ref().is_some_and(View::complete) {
                self.view = Some(View::read(&self.admin.etcd, &self.admin.keys, deadline).await?);
            }
            let view = self.view.as_ref().expect("read above");
            let status = self.admin.status_of(view, deadline).await?;
            self.dirty = false;
            self.changed_at = None;
            self.broken_since = None;
            if self.last.as_ref().is_some_and(|last| last.same_as(&status)) {
                continue;
            }
            self.last = Some(status.clone());
            return Ok(status);
        }
    }

    /// Store keys (`r/{round}/store/...`) change with the workers' traffic, never with the
    /// run's membership; so do the run store's (`store/...`), but for its notes, which the
    /// status shows, and the adds' receipts (`adds/...`).
    fn is_store_key(&self, key: &[u8]) -> bool {
        let keys = &self.admin.keys;
        let rounds = keys.rounds_prefix();
        let in_round_store = key
            .strip_prefix(rounds.as_bytes())
            .and_then(|rest| rest.get(20..))
            .is_some_and(|rest| rest.starts_with(b"/store/"));
        in_round_store
            || key.starts_with(keys.add_receipts_prefix().as_bytes())
            || (key.starts_with(keys.run_store_prefix().as_bytes())
                && !key.starts_with(keys.run_notes_prefix().as_bytes()))
    }
}
