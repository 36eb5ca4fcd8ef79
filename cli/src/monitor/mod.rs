//! What no exit reports: hung workers, restarts that make no progress, sick nodes.
//!
//! Workers report progress through rdzv's progress API (heartbeats and named sections on a page
//! the launcher reads, `rdzv::progress`); the agent runs these monitors beside its group and
//! turns what they find into a stop, as it does a worker's exit (`agent/mod.rs`), and hands a
//! hang to `respond`.
//!
//! Submodules, each using only those listed before it: `verdict` (what a worker's progress
//! looks like to other nodes, and suspect versus victims across nodes), `pages` (the group's
//! progress pages as the monitors read them), `evidence` (a hung worker's stacks and the kernel's view
//! of every worker), `hang` (timeouts given or learned, job-wide; detecting a hang; the
//! launchers' hang protocol), `respond` (what a node does once a hang is found, on
//! either side of that protocol), `progress` (the no-progress restart count), `pace` (each node's
//! pace, and which nodes straggle), `health` (the node's health command).

pub mod verdict;

pub mod pages;

pub mod evidence;

pub mod hang;

pub mod respond;

pub mod progress;

pub mod pace;

pub mod health;

/// Runs the futures concurrently on this task and returns their outputs in order.
pub async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        match pending {
            true => std::task::Poll::Pending,
            false => std::task::Poll::Ready(()),
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future finished"))
        .collect()
}
