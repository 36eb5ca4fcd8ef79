//! `rdzv_inprocess_*`: a worker's side of in-process restart (`rdzv run --in-process-restart`),
//! for training loops in C, C++ and Go: a cheap check each step, and a blocking call for the
//! next round.

use super::boundary::{arg_out, boundary, rdzv_error_t, rdzv_status_t, to_timeout};
use super::rendezvous::RDZV_ADDR_CAPACITY;
use once_cell::sync::Lazy;
use rdzv::inprocess::Worker;
use rdzv::Error;
use std::ffi::c_char;
use std::panic::catch_unwind;
use std::time::Duration;

/// This process's control file, named by `RDZV_INPROCESS_FILE` when it started.
static WORKER: Lazy<Option<Worker>> = Lazy::new(Worker::from_env);

/// A worker's place in a round of in-process restart, filled by `rdzv_inprocess_next`: what
/// torchrun gives a new worker process in its environment.
#[repr(C)]
pub struct rdzv_inprocess_round_t {
    /// RANK: the worker's global rank.
    pub rank: u32,
    /// WORLD_SIZE: workers in the round, on every node.
    pub world_size: u32,
    /// LOCAL_RANK: the worker's rank on its node.
    pub local_rank: u32,
    /// LOCAL_WORLD_SIZE: workers on its node.
    pub local_world_size: u32,
    /// GROUP_RANK: its node's rank in the round.
    pub group_rank: u32,
    /// GROUP_WORLD_SIZE: nodes in the round.
    pub group_world_size: u32,
    /// TORCHELASTIC_RESTART_COUNT: restarts after failures so far (a membership change spends
    /// none).
    pub restart_count: u32,
    /// MASTER_PORT: rank 0's bootstrap port in this round.
    pub master_port: u16,
    /// MASTER_ADDR: rank 0's bootstrap address in this round; NUL-terminated.
    pub master_addr: [c_char; RDZV_ADDR_CAPACITY],
}

/// Whether this process runs under `rdzv run --in-process-restart` (`RDZV_INPROCESS_FILE` was
/// in its environment when it started). Never fails, never blocks.
#[no_mangle]
pub extern "C" fn rdzv_inprocess_enabled() -> bool {
    catch_unwind(|| WORKER.is_some()).unwrap_or(false)
}

/// Whether the launcher asks this worker to leave its training function: a new round is
/// forming (a node lost or admitted). Then tear down the communicators (NCCL: abort them,
/// which also ends a collective blocked in them on another thread) and call
/// `rdzv_inprocess_next`. One `stat` of the control file when nothing changed: call it every
/// step. False outside `--in-process-restart`. Never fails, never blocks; safe from any thread.
#[no_mangle]
pub extern "C" fn rdzv_inprocess_check() -> bool {
    catch_unwind(|| WORKER.as_ref().is_some_and(Worker::leave_asked)).unwrap_or(false)
}

/// Tells the launcher this worker has left its round, if it was asked to (`rdzv_inprocess_check`),
/// then waits up to `timeout_ms` (negative: no bound) for the next round, fills `*round` with
/// it and sets its variables in the process environment (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT and the rest of torchrun's), as a new
/// worker process would have them: `setenv`, so call it while no other thread reads the
/// environment. The first call returns the first round at once. `RDZV_ERR_TIMEOUT` when no
/// round came in time (the launcher then stops this worker within its `--in-process-timeout`
/// unless it answered); `RDZV_ERR_INVALID_ARGUMENT` outside `--in-process-restart` or for a
/// NULL `round`. A loop:
///
/// ```c
/// rdzv_inprocess_round_t round;
/// while (rdzv_inprocess_next(-1, &round, NULL) == RDZV_OK) {
///     setup(&round);                    // communicators of this round
///     while (!done && !rdzv_inprocess_check()) step();
///     teardown();                       // abort the communicators
///     if (done) break;
/// }
/// ```
#[no_mangle]
pub extern "C" fn rdzv_inprocess_next(
    timeout_ms: i64,
    round: *mut rdzv_inprocess_round_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(round, "round")?;
        let worker = WORKER.as_ref().ok_or_else(|| {
            Error::invalid(
                "rdzv_inprocess_next: not under rdzv run --in-process-restart (no RDZV_INPROCESS_FILE)",
            )
        })?;
        let timeout = to_timeout(timeout_ms).unwrap_or(Duration::from_secs(365 * 24 * 3600));
        let env = worker.next(timeout)?;
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let number = |name: &str| -> rdzv::Result<u32> {
            get(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::state(format!("in-process restart: the round has no {name}")))
        };
        let master_addr = get("MASTER_ADDR").unwrap_or_default();
        let mut addr = [0 as c_char; RDZV_ADDR_CAPACITY];
        for (dst, src) in addr
            .iter_mut()
            .zip(master_addr.bytes().take(RDZV_ADDR_CAPACITY - 1))
        {
            *dst = src as c_char;
        }
        let filled = rdzv_inprocess_round_t {
            rank: number("RANK")?,
            world_size: number("WORLD_SIZE")?,
            local_rank: number("LOCAL_RANK")?,
            local_world_size: number("LOCAL_WORLD_SIZE")?,
            group_rank: number("GROUP_RANK")?,
            group_world_size: number("GROUP_WORLD_SIZE")?,
            restart_count: number("TORCHELASTIC_RESTART_COUNT")?,
            master_port: number("MASTER_PORT")?
                .try_into()
                .map_err(|_| Error::state("in-process restart: MASTER_PORT is not a port"))?,
            master_addr: addr,
        };
        for (k, v) in &env {
            // SAFETY of the environment: the caller's, as documented (no thread reads it now).
            std::env::set_var(k, v);
        }
        *out = filled;
        Ok(())
    })
}
