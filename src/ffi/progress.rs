//! `rdzv_heartbeat` and sections: a worker's progress, for `rdzv run`'s hang monitor.

use super::boundary::{arg_str, boundary, rdzv_error_t, rdzv_status_t};
use rdzv::progress;
use std::ffi::c_char;
use std::panic::catch_unwind;

/// One heartbeat: the worker made progress (call it once per training step, or around each
/// collective). Under `rdzv run` it is a few stores to memory the launcher reads (tens of
/// nanoseconds, no system call); outside `rdzv run` it does nothing. Never fails, never
/// blocks. Safe from any thread.
#[no_mangle]
pub extern "C" fn rdzv_heartbeat() {
    let _ = catch_unwind(progress::heartbeat);
}

/// A heartbeat that also says which step the worker reached: a global iteration that goes on
/// from a checkpoint across restarts, so `rdzv run --max-no-progress-restarts` compares steps
/// across attempts instead of counting heartbeats. `step` must be non-negative
/// (RDZV_ERR_INVALID_ARGUMENT otherwise, and nothing is recorded). Safe from any thread.
#[no_mangle]
pub extern "C" fn rdzv_heartbeat_step(step: i64, error: *mut *mut rdzv_error_t) -> rdzv_status_t {
    boundary(error, || progress::heartbeat_step(step))
}

/// Pauses `rdzv run`'s hang monitoring of this process until its next heartbeat or section
/// begin or end: its silence is no longer taken for a hang. Call it before work without steps
/// that may outlast the hang timeout: a final checkpoint, an evaluation, the program's end.
/// The program's `exit` pauses by itself (an `atexit` handler registered on the first progress
/// call), and rdzv's Python module pauses as the interpreter starts to exit; a crash is still
/// seen while paused. A no-op outside `rdzv run`. Never fails, never blocks, any thread.
#[no_mangle]
pub extern "C" fn rdzv_progress_pause() {
    let _ = catch_unwind(progress::pause);
}

/// Opens the section `name` (1 to 39 bytes of UTF-8, no NUL): `rdzv run`'s per-section
/// timeout (`--section-timeout name=SECONDS`, or learned with `auto`) runs until
/// `rdzv_section_end(name)`. Sections nest. The name is checked everywhere
/// (RDZV_ERR_INVALID_ARGUMENT for NULL, invalid UTF-8, empty or too long); outside `rdzv run`
/// nothing else happens. Safe from any thread: sections are the process's, not the thread's.
#[no_mangle]
pub extern "C" fn rdzv_section_begin(
    name: *const c_char,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || progress::section_begin(arg_str(name, "name")?))
}

/// Closes the innermost open section called `name` and records how long it took. Under
/// `rdzv run`, closing a section that is not open is RDZV_ERR_INVALID_ARGUMENT (the message
/// lists the open ones); outside it only the name is checked. Safe from any thread.
#[no_mangle]
pub extern "C" fn rdzv_section_end(
    name: *const c_char,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || progress::section_end(arg_str(name, "name")?))
}

/// Tells `rdzv run` which signal makes this process write its threads' stacks to the file
/// named by `RDZV_STACKS_FILE` (a handler the process installed; the Python module registers
/// `faulthandler` this way): the launcher sends it to a hung worker before stopping it, as
/// evidence. 0 takes it back. Only a process that installed such a handler may call this: the
/// signal's default action would otherwise end it. `signal` must be 0 to 64.
#[no_mangle]
pub extern "C" fn rdzv_set_stack_signal(
    signal: i32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || progress::set_stack_signal(signal))
}

/// Whether this process runs under `rdzv run` with progress monitoring (`RDZV_PROGRESS_FILE`
/// names a page it could map): heartbeats and sections are seen. Never fails.
#[no_mangle]
pub extern "C" fn rdzv_is_monitored() -> bool {
    catch_unwind(progress::is_monitored).unwrap_or(false)
}
