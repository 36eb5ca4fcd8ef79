//! The exit barrier (torchelastic's): a node whose workers all exited 0 adds itself to a
//! counter in the round's store; the last one sets `done`, which everyone waits on, bounded by
//! `--exit-barrier-timeout`, so a job does not look finished while some of it still runs. The
//! node's lease stays alive meanwhile, so the others do not see it as lost. A job that fails
//! on another node meanwhile ends the wait with a failure here too.

use super::signals::Signals;
use super::source::Stop;
use crate::exit::{signal_name, Exit};
use crate::output::say;
use rdzv::Store;
use std::time::Duration;
use tokio::time::Instant;

/// The store keys of the barrier (torchelastic's terminal-state prefix).
const BARRIER_COUNT: &str = "torchelastic/agent/terminal_state/count";
const BARRIER_DONE: &str = "torchelastic/agent/terminal_state/done";

/// Waits at the barrier of a round of `world_size` nodes; `peer_failed` resolves when another
/// node declares the job failed.
pub async fn wait(
    store: &Store,
    world_size: u32,
    timeout: Duration,
    peer_failed: impl std::future::Future<Output = Stop>,
    signals: &mut Signals,
) -> Exit {
    say(format_args!(
        "waiting up to {:.0} s for the other nodes' workers to finish (exit barrier)",
        timeout.as_secs_f64()
    ));
    let started = Instant::now();
    let barrier = async {
        let arrived = store.add(BARRIER_COUNT, 1).await?;
        if arrived == i64::from(world_size) {
            store.set(BARRIER_DONE, b"1").await?;
        }
        store.wait(&[BARRIER_DONE], Some(timeout)).await
    };
    tokio::select! {
        stop = peer_failed => {
            if let Stop::JobFailed(why) | Stop::Closed(Some(why)) = stop {
                crate::output::error(format_args!("the job failed on another node: {why}"));
            }
            return Exit::Failure;
        }
        r = barrier => match r {
            Ok(()) => say(format_args!("every node finished ({:.1} s in the exit barrier)", started.elapsed().as_secs_f64())),
            Err(e) => say(format_args!("leaving the exit barrier without every node: {}", e.message())),
        },
        sig = signals.recv() => {
            say(format_args!("received {} in the exit barrier: leaving", signal_name(sig)));
            return Exit::Signal(sig);
        }
    }
    Exit::Success
}
