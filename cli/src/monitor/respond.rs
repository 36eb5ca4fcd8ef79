//! What a node does once a hang is found: both sides of the launchers' hang protocol (`hang`).
//! The node that found it announces it, shares its workers' progress, collects the evidence,
//! writes the hung worker's error file (so the failure report and TORCHELASTIC_ERROR_FILE say
//! what happened), has its group killed, then gathers every node's progress and evidence and
//! names the suspect and its victims (`verdict`). A node told of a hang answers with its own
//! workers' progress and evidence and has its group killed. The agent decides only when this
//! happens (its state machine) and what the failure then costs.

use super::evidence;
use super::hang::{self, HangNotice, Hung};
use super::pages::Watched;
use super::verdict::{self, Verdict, WorkerProgress};
use crate::exit::Exit;
use crate::output::{self, say};
use rdzv::Store;
use serde_json::{json, Map, Value};

/// Where this node stands in the job when a hang is found.
pub struct Place<'a> {
    /// The round's store the launchers share (none without a rendezvous: one node alone).
    pub store: Option<&'a Store>,
    pub round: u64,
    pub group_rank: u32,
    pub nodes: u32,
    pub host: &'a str,
}

/// How a hang this node found ended here.
pub enum Found {
    /// This node announced it first: what `rdzv status` shows of it.
    First(Box<HangNote>),
    /// Another node had announced a hang first (a victim timed out here too): answer it as a
    /// peer does (`answer`).
    Second(HangNotice),
}

/// The run's note `hang`, for `rdzv status`: which rank hung, where, for how long, the
/// verdict across nodes, and where every node's evidence is.
pub struct HangNote {
    pub round: u64,
    pub found_by: String,
    pub hung: String,
    /// Global rank to where its evidence is (`evidence::by_rank`), every node's.
    pub evidence: Map<String, Value>,
    pub verdict: Option<Verdict>,
}

impl HangNote {
    pub fn to_json(&self) -> String {
        let mut note = json!({
            "round": self.round,
            "found_by": self.found_by,
            "hung": self.hung,
            "evidence": self.evidence,
        });
        if let Some(verdict) = &self.verdict {
            note["verdict"] = verdict.to_json();
        }
        note.to_string()
    }
}

fn progress_of(workers: &[Watched], host: &str) -> Vec<WorkerProgress> {
    workers.iter().map(|w| w.progress(host)).collect()
}

/// This node found `hung`: the finding side of the protocol, `kill` ending the group between
/// the evidence (taken from live workers) and the gathering (which waits for the other nodes).
pub async fn found(
    place: &Place<'_>,
    workers: &[Watched],
    hung: &Hung,
    kill: impl std::future::Future<Output = Result<(), Exit>>,
) -> Result<Found, Exit> {
    output::error(format_args!("hang: {}", hung.describe()));
    let progress = progress_of(workers, place.host);
    if let Some(store) = place.store {
        if let Some(first) = hang::announce(store, place.group_rank, place.host, hung).await {
            return Ok(Found::Second(first));
        }
        hang::share_progress(store, place.group_rank, &progress).await;
    }
    let evidence_started = tokio::time::Instant::now();
    let evidence = evidence::collect_all(workers, place.round).await;
    let hung_worker = workers
        .iter()
        .position(|w| w.global_rank == hung.global_rank);
    if let Some(i) = hung_worker {
        let stacks = evidence[i]
            .stacks
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok());
        hang::write_error_file(&workers[i].error_file, hung, stacks.as_deref());
    }
    kill.await?;
    let mut evidence_by_rank = evidence::by_rank(workers, &evidence, place.host);
    let all = match place.store {
        Some(store) => {
            let all = hang::gather(store, place.nodes, hang::GATHER_BOUND).await;
            // The other nodes collect theirs meanwhile, as bounded as this node's (a stopped
            // worker's stacks take the whole bound).
            let until = evidence_started + evidence::EVIDENCE_BOUND + hang::GATHER_BOUND;
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            evidence_by_rank
                .extend(hang::gather_evidence(store, place.nodes, place.group_rank, left).await);
            all
        }
        None => progress,
    };
    let verdict = verdict::verdict(&all);
    for line in verdict.iter().flat_map(Verdict::lines) {
        say(format_args!("hang: {line}"));
    }
    for (w, e) in workers.iter().zip(&evidence) {
        evidence::say(w, e);
    }
    Ok(Found::First(Box::new(HangNote {
        round: place.round,
        found_by: place.host.to_string(),
        hung: hung.describe(),
        evidence: evidence_by_rank,
        verdict,
    })))
}

/// Another node found a hung worker (`what`): answers with this node's workers' progress,
/// collects their evidence (victims show where they wait) and shares where it is, then
/// `kill` ends the group.
pub async fn answer(
    place: &Place<'_>,
    workers: &[Watched],
    what: &HangNotice,
    kill: impl std::future::Future<Output = Result<(), Exit>>,
) -> Result<(), Exit> {
    say(format_args!(
        "hang on node {} ({}): {}; stopping the workers to form a new round",
        what.node, what.host, what.what
    ));
    if let Some(store) = place.store {
        let progress = progress_of(workers, place.host);
        hang::share_progress(store, place.group_rank, &progress).await;
    }
    let evidence = evidence::collect_all(workers, place.round).await;
    for (w, e) in workers.iter().zip(&evidence) {
        evidence::say(w, e);
    }
    if let Some(store) = place.store {
        let mine: Vec<_> = evidence::by_rank(workers, &evidence, place.host)
            .into_iter()
            .filter_map(|(rank, e)| Some((rank.parse().ok()?, e)))
            .collect();
        hang::share_evidence(store, place.group_rank, &mine).await;
    }
    kill.await
}
