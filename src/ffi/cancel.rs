//! `rdzv_cancel_token_t`: a cancel that cannot be lost, handed to any call that talks to etcd.

use super::boundary::{arg_out, arg_ref, boundary, rdzv_error_t, rdzv_status_t};
use rdzv::cancel::CancelToken;

/// A cancel token: the caller makes one, passes it to the `_with_cancel` form of any call that
/// talks to etcd (`rdzv_next_with_cancel`, `rdzv_num_lost_with_cancel`,
/// `rdzv_store_get_with_cancel`, `rdzv_store_set_with_cancel`, `rdzv_admin_watch_with_cancel`,
/// `rdzv_admin_status_with_cancel`, ...), and cancels it from any thread to end them with
/// `RDZV_ERR_CANCELLED`, promptly whatever etcd is doing. Once cancelled it stays cancelled: a
/// call made with it afterwards returns `RDZV_ERR_CANCELLED` at once, without touching etcd,
/// so a cancel that races with the start of a call is never lost and no caller needs to
/// repeat it. One token may be passed to any number of calls, on any handles, at once; make
/// a new token for calls that must not be cancelled by the old one (a Go context maps to one
/// token per call). A `rdzv_next` ended by its token withdraws its join request; a write
/// ended by it may or may not have been applied, as one that times out.
///
/// Thread-safety: every function may be called from any thread, at any time, concurrently
/// with calls that use the token. `rdzv_cancel_token_cancel` never blocks and takes a lock
/// only briefly, but it is not async-signal-safe: from a signal handler, wake a thread that
/// cancels (as Go's `signal.Notify` or Python's handlers do). Ownership: the caller owns the
/// token and frees it with `rdzv_cancel_token_free` once no call uses it any longer.
pub struct rdzv_cancel_token_t(CancelToken);

/// The token behind an optional `const rdzv_cancel_token_t *` argument: NULL is a token
/// nobody cancels.
pub(crate) fn arg_cancel(token: *const rdzv_cancel_token_t) -> CancelToken {
    // SAFETY: NULL or, by the API contract, a live token from `rdzv_cancel_token_new`.
    unsafe { token.as_ref() }.map_or_else(CancelToken::new, |t| t.0.clone())
}

/// Creates a token that is not cancelled. On success `*out` owns it (free with
/// `rdzv_cancel_token_free`).
#[no_mangle]
pub extern "C" fn rdzv_cancel_token_new(
    out: *mut *mut rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(out, "out")?;
        *out = Box::into_raw(Box::new(rdzv_cancel_token_t(CancelToken::new())));
        Ok(())
    })
}

/// Cancels the token, for good: every call waiting with it returns `RDZV_ERR_CANCELLED`
/// promptly (a `rdzv_next` withdraws its join request first, as with `rdzv_cancel`), and
/// every later call made with it returns `RDZV_ERR_CANCELLED` at once. Idempotent. Never
/// blocks; safe from any thread.
#[no_mangle]
pub extern "C" fn rdzv_cancel_token_cancel(
    token: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        arg_ref(token, "token")?.0.cancel();
        Ok(())
    })
}

/// Sets `*cancelled` to whether `rdzv_cancel_token_cancel` was called on the token.
#[no_mangle]
pub extern "C" fn rdzv_cancel_token_is_cancelled(
    token: *const rdzv_cancel_token_t,
    cancelled: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let token = arg_ref(token, "token")?;
        *arg_out(cancelled, "cancelled")? = token.0.is_cancelled();
        Ok(())
    })
}

/// Frees a token. NULL is a no-op. No call may be using it: free it after the calls it was
/// passed to have returned.
#[no_mangle]
pub extern "C" fn rdzv_cancel_token_free(token: *mut rdzv_cancel_token_t) {
    if !token.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: created by Box::into_raw in rdzv_cancel_token_new, freed once by contract.
            drop(unsafe { Box::from_raw(token) });
        }));
    }
}
