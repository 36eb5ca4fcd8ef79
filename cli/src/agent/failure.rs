//! What a worker failure costs, and how a job that fails fails on every node at once.
//!
//! Only failures spend the restart budget; membership changes do not, and neither does a
//! failure that a member's loss explains: a peer's death breaks this node's workers'
//! connections, often before the loss is seen. Which comes first, the broken connection or the
//! loss, is a race (the loss comes within a round trip when the peer's watchdog releases it,
//! within `lease_ttl` when its machine vanished), so (`cost`):
//! - a loss seen already: no restart spent;
//! - otherwise, with restarts left: one is spent at once (a real failure is not slowed) and
//!   refunded when the next round shows that a member of this one was lost (`refund_if_lost`);
//! - with none left: the job fails unless a member is lost. Rather than wait `lease_ttl` for
//!   a loss that will not come, the node asks the others' launchers through the round's store;
//!   each live one answers at once. When every member has answered, none is lost and the job
//!   failed: within a round trip on a healthy job. A member that cannot answer (its machine
//!   gone, its launcher killed without a watchdog) is waited for until its lease expires, which
//!   is then the loss.
//!
//! The protocol between launchers, in the round's store: the first node whose budget is spent
//! writes why under `FAILING` (`ask_others`); every live launcher answers under
//! `HERE/{node rank}` and waits for the verdict (`answer_and_await`); the verdict, the job
//! failed, goes under `FAILED` (`declare`) before the run is closed as failed, so that a node
//! in another state (in a rendezvous, its workers done) learns it too.

use super::signals::Signals;
use super::source::{Round, Source, Stop};
use crate::output::say;
use rdzv::Store;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

const FAILING: &str = "rdzv/agent/failing";
const HERE: &str = "rdzv/agent/here";
const FAILED: &str = "rdzv/agent/failed";

/// The restart budget: restarts spent on failures so far (TORCHELASTIC_RESTART_COUNT), of
/// `--max-restarts`.
pub struct Budget {
    pub used: u32,
    pub max: u32,
}

/// A restart charged for a failed round: the round, and its members.
pub struct Charged {
    pub round: u64,
    pub members: Arc<[String]>,
}

/// What the agent does with a worker failure.
pub enum Cost {
    /// A member of the round was lost: a membership change, no restart spent.
    Loss(String),
    /// A restart was spent; refunded if the next round shows that a member of the round that
    /// failed was lost.
    Charged(Option<Charged>),
    /// No restart left and no loss to explain the failure: the job failed.
    Spent,
    Stop(Stop),
}

/// Decides what a worker failure (`why`) costs; the group is stopped already.
pub async fn cost<S: Source>(
    source: &S,
    budget: &mut Budget,
    round: &Round,
    why: &str,
    signals: &mut Signals,
) -> Cost {
    if let Some(loss) = source.loss_seen().await {
        return Cost::Loss(loss);
    }
    if budget.used < budget.max {
        let members = source.members().await;
        budget.used += 1;
        // The job's count in etcd: a node that fails fast and rejoins as a new launcher does
        // not start from zero (pytorch#147064), and every node sees what the job spent.
        let spent = source.charge_job(round).await;
        if let Some(spent) = spent {
            source
                .note("restarts", &format!("{spent} of {} spent", budget.max))
                .await;
            // The job's count is the budget: refunds are made there too (`refund_if_lost`).
            budget.used = spent.min(budget.max);
        }
        // With the job's budget spent (by other nodes' failures), this failure is decided as
        // any with no restart left.
        if spent.is_none_or(|spent| spent <= budget.max) {
            return Cost::Charged(members.map(|members| Charged {
                round: round.number,
                members,
            }));
        }
    }
    match source.wait_for_loss(round, why, signals).await {
        None => Cost::Spent,
        Some(Stop::Changed(why)) => Cost::Loss(why),
        Some(stop) => Cost::Stop(stop),
    }
}

/// Gives back the restart the last failure spent if the round just formed lacks a member of
/// the round that failed (`before`): that member's loss broke the workers. The job's count
/// gives it back too, once for the round however many nodes do, so that a later charge does
/// not take it again.
pub async fn refund_if_lost<S: Source>(source: &S, budget: &mut Budget, before: &Charged) -> bool {
    let Some(now) = source.members().await else {
        return false;
    };
    let now: HashSet<&str> = now.iter().map(String::as_str).collect();
    let gone = before
        .members
        .iter()
        .filter(|m| !now.contains(m.as_str()))
        .count();
    if gone > 0 && budget.used > 0 {
        budget.used = match source.refund_job(before.round).await {
            Some(spent) => spent.min(budget.max),
            None => budget.used - 1,
        };
        say(format_args!(
            "{gone} member(s) of the last round were lost: the failure is put down to that, restart refunded ({} of {} used)",
            budget.used, budget.max
        ));
        return true;
    }
    false
}

/// The round-store key where the launcher of node rank `group_rank` answers a failing node.
fn here_key(group_rank: u32) -> String {
    format!("{HERE}/{group_rank}")
}

/// Asks the round's other launchers whether one was lost: writes why (the first asker's
/// stands) and this node's own answer, then waits up to `grace` for every other node's.
pub async fn ask_others(
    store: &Store,
    round: &Round,
    why: &str,
    grace: Duration,
) -> Result<(), rdzv::Error> {
    let here: Vec<String> = (0..round.group_world_size)
        .filter(|&r| r != round.group_rank)
        .map(here_key)
        .collect();
    let here: Vec<&str> = here.iter().map(String::as_str).collect();
    store.compare_set(FAILING, b"", why.as_bytes()).await?;
    store.set(&here_key(round.group_rank), b"1").await?;
    store.wait(&here, Some(grace)).await
}

/// Declares the job failed to the other launchers, which wait on it (`answer_and_await`).
/// The first verdict stands, so every node reports the same failure: returns it.
pub async fn declare(store: &Store, why: &str) -> String {
    match store.compare_set(FAILED, b"", why.as_bytes()).await {
        Ok(first) => String::from_utf8_lossy(&first).into_owned(),
        Err(e) => {
            say(format_args!(
                "could not tell the other nodes: {}",
                e.message()
            ));
            why.to_string()
        }
    }
}

/// Answers a question that is coming (another node's hang, whose restart it is about to
/// decide): this launcher (node rank `group_rank`) is alive.
pub async fn answer(store: &Store, group_rank: u32) {
    let _ = store.set(&here_key(group_rank), b"1").await;
}

/// Waits for another node to ask (`ask_others`), answers that this launcher (node rank
/// `group_rank`) is alive, then waits for the verdict. Never resolves when the store fails
/// (the run closed: the membership check sees that).
pub async fn answer_and_await(store: &Store, group_rank: u32) -> Stop {
    let until = |key: &'static str| async move {
        String::from_utf8_lossy(&crate::store_wait::until_set(store, key).await).into_owned()
    };
    let why = until(FAILING).await;
    say(format_args!(
        "another node's restart budget is spent ({why}): answering that this node is alive"
    ));
    if let Err(e) = store.set(&here_key(group_rank), b"1").await {
        say(format_args!("could not answer: {}", e.message()));
    }
    Stop::JobFailed(until(FAILED).await)
}
