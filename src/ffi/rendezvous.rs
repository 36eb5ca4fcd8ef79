//! `rdzv_t`: one node's handle on a run.

use super::boundary::{arg_out, arg_ref, boundary, optional_str, rdzv_error_t, rdzv_status_t};
use super::cancel::{arg_cancel, rdzv_cancel_token_t};
use super::params::{params_ref, rdzv_params_t};
use super::store::rdzv_store_t;
use rdzv::blocking::BlockingRendezvous;
use std::ffi::{c_char, CString};

/// Capacity of `rdzv_round_t.master_addr`, including the terminating NUL.
pub const RDZV_ADDR_CAPACITY: usize = 256;

/// One node's handle on a rendezvous. Thread-safe: every function may be called on the same
/// handle from several threads at once, except that only one `rdzv_next` runs at a time per
/// handle (a second concurrent one fails with `RDZV_ERR_INVALID_ARGUMENT`). From another
/// thread, `rdzv_shutdown` wakes a blocked `rdzv_next` (`RDZV_ERR_SHUTDOWN`) and `rdzv_cancel`
/// ends it (`RDZV_ERR_CANCELLED`, never lost: with no `rdzv_next` running, the next one to
/// start ends). Every call that talks to etcd has a `_with_cancel` form that a cancel token
/// ends.
/// A handle belongs to the process that created it: after `fork()`, create new handles in the
/// child (calls on inherited ones fail with `RDZV_ERR_INVALID_ARGUMENT`).
pub struct rdzv_t {
    inner: BlockingRendezvous,
    run_id: CString,
    backend: CString,
    node_id: CString,
}

/// This node's place in a completed round, filled by `rdzv_next`.
#[repr(C)]
pub struct rdzv_round_t {
    /// The round number: 0 for the first round of a run, then increasing.
    pub round: u64,
    /// This node's rank, in 0..world_size. Members of the previous round that are still alive
    /// keep their relative order, so rank 0 stays rank 0 while it lives.
    pub rank: u32,
    /// Number of members of the round.
    pub world_size: u32,
    /// MASTER_PORT: a TCP port that was free on rank 0 when it joined (outside the
    /// kernel's ephemeral range, so no outgoing connection takes it first).
    pub master_port: u16,
    /// MASTER_ADDR: rank 0's `local_addr` option, else its host name; NUL-terminated.
    pub master_addr: [c_char; RDZV_ADDR_CAPACITY],
}

/// Creates a handle: connects to etcd (shared with other handles of this process that use the
/// same endpoints and credentials) and registers this node as alive under a lease. Blocks for
/// at most `connect_timeout` (default 10 s), plus up to 5 s to find out why a TLS handshake
/// failed; `RDZV_ERR_CONNECTION` names the endpoints (and the TLS cause) if etcd does not
/// answer. Does not consume `params`. On success `*out` owns the new handle (free
/// with `rdzv_free`).
#[no_mangle]
pub extern "C" fn rdzv_new(
    params: *const rdzv_params_t,
    out: *mut *mut rdzv_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(out, "out")?;
        let params = params_ref(params)?.clone();
        let inner = BlockingRendezvous::new(params)?;
        let text = |s: &str| CString::new(s).unwrap_or_default();
        let handle = rdzv_t {
            run_id: text(inner.params().run_id()),
            backend: text("etcd-v3"),
            node_id: text(inner.node_id()),
            inner,
        };
        *out = Box::into_raw(Box::new(handle));
        Ok(())
    })
}

/// Joins the next round and blocks until this node is a member of a completed round: when
/// `max_nodes` have joined, or `last_call_timeout` after `min_nodes` have (a round that
/// re-forms a running world seals without the last call once every live node of the run,
/// every live member included, has joined: nobody is left to wait for). A node arriving
/// while a round is running waits (others see it in `rdzv_num_waiting`) until a member calls
/// `rdzv_next` again. Blocks for at most `join_timeout` (`RDZV_ERR_TIMEOUT`). Returns
/// `RDZV_ERR_CLOSED` if the run is or becomes closed, `RDZV_ERR_GRACEFUL_EXIT` if it closes
/// while this node waited outside the running round (late or surplus), `RDZV_ERR_SHUTDOWN` if
/// `rdzv_shutdown` is called meanwhile, `RDZV_ERR_CANCELLED` if `rdzv_cancel` is (made during
/// the call, or before it while no `rdzv_next` ran: see `rdzv_cancel`). Each of these, and
/// `join_timeout`, ends the call within about a second whatever etcd is doing (down, frozen or
/// restarting).
///
/// A failed call withdraws this node's join request before it returns, so no round is ever
/// sealed with a node that gave up; a write to etcd already in flight is waited for first (at
/// most about one second past `join_timeout`, or one etcd request when cancelled). If the
/// round was sealed with this node in it before the withdrawal (a cancel or timeout racing
/// the seal), the call succeeds with that round instead: its members count on this node.
///
/// On success fills `*round` and, if `store` is not NULL, sets `*store` to a new handle on the
/// round's store (free with `rdzv_store_free`; see `rdzv_store_t` for its lifetime).
///
/// Cost, per node: one watch (one stream watching the round's leader key and the node's lane of
/// the round) and one join transaction; the seal arrives by that watch with this node's rank
/// (the ranks of about 64 members: its lane), so nothing is read after it. The same at any
/// round size, so a round of N moves O(N) bytes through etcd. Only the round's leader reads
/// every joiner; the full member list is read by nobody else (`rdzv_admin_status` lists it, at
/// O(N)).
#[no_mangle]
pub extern "C" fn rdzv_next(
    rdzv: *mut rdzv_t,
    round: *mut rdzv_round_t,
    store: *mut *mut rdzv_store_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    next(rdzv, std::ptr::null(), round, store, error)
}

/// `rdzv_next`, which also returns `RDZV_ERR_CANCELLED` (withdrawing its join request, as for
/// `rdzv_cancel`) once `cancel` is cancelled: at once, joining nothing, if it already is.
/// `cancel` may be NULL (no token). The token is not consumed. `rdzv_cancel` ends this call
/// too.
#[no_mangle]
pub extern "C" fn rdzv_next_with_cancel(
    rdzv: *mut rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    round: *mut rdzv_round_t,
    store: *mut *mut rdzv_store_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    next(rdzv, cancel, round, store, error)
}

fn next(
    rdzv: *mut rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    round: *mut rdzv_round_t,
    store: *mut *mut rdzv_store_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(rdzv, "rdzv")?;
        let round = arg_out(round, "round")?;
        let (info, round_store) = handle.inner.next_with(&arg_cancel(cancel))?;
        let mut addr = [0 as c_char; RDZV_ADDR_CAPACITY];
        for (dst, src) in addr
            .iter_mut()
            .zip(info.master_addr.bytes().take(RDZV_ADDR_CAPACITY - 1))
        {
            *dst = src as c_char;
        }
        *round = rdzv_round_t {
            round: info.round,
            rank: info.rank,
            world_size: info.world_size,
            master_port: info.master_port,
            master_addr: addr,
        };
        if !store.is_null() {
            // SAFETY: checked non-NULL; writable by contract.
            unsafe { *store = Box::into_raw(Box::new(rdzv_store_t(round_store))) };
        }
        Ok(())
    })
}

/// Sets `*out` to a new handle on the run's store: a store with the same functions and
/// semantics as a round's (`rdzv_store_*`: set, get, add, compare_set, wait, multi_get,
/// delete_key, ...) that lives as long as the run instead of two rounds, for what a job keeps
/// across rounds: a restart budget (`rdzv_store_add` is atomic across nodes), the last hang
/// report, each node's last health check, why a node left. Keys under `notes/` are the run's
/// notes, which `rdzv status` shows (`notes/why` is shown as `why`).
///
/// Lifetime: every value is bound to the run's lease, so the store's data goes with the run:
/// deleted when the last node leaves (`rdzv_shutdown`) or the run is purged, and expired one
/// `lease_ttl` after no live node is left to refresh the lease. Every write is guarded by the
/// run still existing under the lease the store was made with: once the run is gone (or started
/// over under a new lease, after every node was cut off for longer than `lease_ttl`), calls fail
/// with `RDZV_ERR_STATE` (`RDZV_ERR_CLOSED` if the run was closed) and nothing is written; take
/// the store again then. As for a round's store, every call fails with `RDZV_ERR_SHUTDOWN` once
/// this node is shut down (a wait in progress returns at once), a wait whose keys are still
/// missing when the run is closed returns `RDZV_ERR_CLOSED`, and `rdzv_store_cancel` and cancel
/// tokens end waits.
///
/// Needs no round: it may be called as soon as the handle exists. Asks etcd only when this
/// node's leases have lapsed (it registers again then, as `rdzv_next` would; at most
/// `connect_timeout`). Each call makes a new handle on the same store. Does not consume `node`.
/// On success `*out` owns the new handle: free it with `rdzv_store_free` (before or after
/// `rdzv_free`, as a round's store).
#[no_mangle]
pub extern "C" fn rdzv_run_store(
    node: *const rdzv_t,
    out: *mut *mut rdzv_store_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_run_store_with_cancel(node, std::ptr::null(), out, error)
}

/// `rdzv_run_store`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once, without asking etcd, if it already is). `cancel` may be NULL (no token). The token is
/// not consumed.
#[no_mangle]
pub extern "C" fn rdzv_run_store_with_cancel(
    node: *const rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    out: *mut *mut rdzv_store_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(node, "node")?;
        let out = arg_out(out, "out")?;
        let store = handle.inner.run_store_with(&arg_cancel(cancel))?;
        *out = Box::into_raw(Box::new(rdzv_store_t(store)));
        Ok(())
    })
}

/// Sets `*closed` to whether the run has been closed by any node. After this node's first
/// round it answers from the membership watch that `rdzv_num_lost` keeps (no etcd request; a
/// close is seen within the watch's delivery, milliseconds); before it, or while that watch
/// is broken, one etcd read, at most `connect_timeout`. Cheap to poll every monitor tick.
#[no_mangle]
pub extern "C" fn rdzv_is_closed(
    rdzv: *const rdzv_t,
    closed: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_is_closed_with_cancel(rdzv, std::ptr::null(), closed, error)
}

/// `rdzv_is_closed`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled: at
/// once, without asking etcd, if it already is, and promptly whatever etcd is doing if it is
/// cancelled during the call. `cancel` may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_is_closed_with_cancel(
    rdzv: *const rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    closed: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(rdzv, "rdzv")?;
        let out = arg_out(closed, "closed")?;
        *out = handle.inner.is_closed_with(&arg_cancel(cancel))?;
        Ok(())
    })
}

/// Closes the run for every node: blocked `rdzv_next` calls anywhere return `RDZV_ERR_CLOSED`
/// promptly (they watch for it) and later ones fail at once. At most `close_timeout`.
#[no_mangle]
pub extern "C" fn rdzv_set_closed(
    rdzv: *const rdzv_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_set_closed_with_cancel(rdzv, std::ptr::null(), error)
}

/// `rdzv_set_closed`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once, writing nothing, if it already is). A close cancelled while it was on its way to etcd
/// may or may not have been applied, as one that times out; closing again is safe. `cancel`
/// may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_set_closed_with_cancel(
    rdzv: *const rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        arg_ref(rdzv, "rdzv")?
            .inner
            .set_closed_with(&arg_cancel(cancel))
    })
}

/// Sets `*count` to the number of nodes waiting for the round after this node's last round
/// that a new round could admit. Non-zero means the members should call `rdzv_next`. While a
/// re-rendezvous is under way (a member already called `rdzv_next` again) every joiner counts;
/// otherwise newcomers count up to the room left: `max_nodes` minus the surviving members.
/// Spare nodes beyond `max_nodes` are not counted, so a full round is not re-formed for nodes
/// it cannot take; they wait (until their `join_timeout`) and are admitted when a member is
/// lost or leaves. 0 before this node's first round. Answered from the membership watch
/// that `rdzv_num_lost` keeps while it is in sync (no etcd request; a joiner is counted
/// within the watch's delivery); one etcd read while that watch is broken or after a member
/// was lost. Cheap to poll every monitor tick.
#[no_mangle]
pub extern "C" fn rdzv_num_waiting(
    rdzv: *const rdzv_t,
    count: *mut u32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_num_waiting_with_cancel(rdzv, std::ptr::null(), count, error)
}

/// `rdzv_num_waiting`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is). `cancel` may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_num_waiting_with_cancel(
    rdzv: *const rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    count: *mut u32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(rdzv, "rdzv")?;
        let out = arg_out(count, "count")?;
        *out = handle.inner.num_waiting_with(&arg_cancel(cancel))?;
        Ok(())
    })
}

/// Sets `*count` to the number of members of this node's last round that are gone (their
/// lease expired or was revoked: killed, cut off, or found dead by a peer) or that are leaving
/// (drained by `rdzv_admin_drain` or `rdzv_drain`), including this node if its own lease is
/// gone or it is drained. Non-zero means the round is broken: survivors should call
/// `rdzv_next` (a drained node's own `rdzv_next` then ends with `RDZV_ERR_GRACEFUL_EXIT`). The
/// first call after a round starts this node's peer watch: at default settings a member whose
/// processes are all gone is counted within 1.5 s, one no peer can reach within 2 s (it keeps
/// its place if it still reaches etcd), one cut off from etcd alone within `lease_ttl`; a
/// frozen member keeps its place. A drain is counted at once. Answered from memory while a watch is in sync
/// (polling is free); one count-only etcd read otherwise, whatever the round's size.
#[no_mangle]
pub extern "C" fn rdzv_num_lost(
    rdzv: *const rdzv_t,
    count: *mut u32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_num_lost_with_cancel(rdzv, std::ptr::null(), count, error)
}

/// `rdzv_num_lost`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is, even when the count would come from memory). `cancel` may be NULL
/// (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_num_lost_with_cancel(
    rdzv: *const rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    count: *mut u32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(rdzv, "rdzv")?;
        let out = arg_out(count, "count")?;
        *out = handle.inner.num_lost_with(&arg_cancel(cancel))?;
        Ok(())
    })
}

/// Ends the `rdzv_next` running on this handle in another thread (with or without a cancel
/// token): it withdraws this node's join request and returns `RDZV_ERR_CANCELLED`. If no
/// `rdzv_next` is running, the next one to start on this handle returns `RDZV_ERR_CANCELLED`
/// at once, joining nothing: a cancel made just before another thread enters `rdzv_next` is
/// never lost, and no caller needs to repeat it. The cancel is used up once a `rdzv_next` has
/// returned `RDZV_ERR_CANCELLED` because of it; a `rdzv_next` that returned its round just as
/// the cancel came (a cancel racing the seal) leaves it for the next call. The handle stays
/// usable: the `rdzv_next` after the cancelled one joins normally. Reaches `rdzv_next` only;
/// the handle's other calls take a cancel token (their `_with_cancel` forms). Idempotent
/// until used up (two cancels end one call). Never blocks; safe from any thread, but not
/// async-signal-safe (it takes a lock briefly): from a signal handler, wake a thread that
/// calls it.
#[no_mangle]
pub extern "C" fn rdzv_cancel(rdzv: *const rdzv_t, error: *mut *mut rdzv_error_t) -> rdzv_status_t {
    boundary(error, || {
        arg_ref(rdzv, "rdzv")?.inner.cancel();
        Ok(())
    })
}

/// Releases this node: wakes a `rdzv_next` blocked on this handle in another thread (and waits
/// on the stores of its rounds), revokes the node's lease (so the other nodes see it leave at
/// once rather than after `lease_ttl`), and, if this was the last live node of the run,
/// deletes the run's rounds, stores and round counter from etcd, so a finished job leaves
/// nothing behind (a closed run's `closed` marker stays for `retention`). Unlike torch, it
/// does NOT close the run for the others. Idempotent; safe from any thread. Later calls on
/// the handle and its stores fail with `RDZV_ERR_SHUTDOWN`. At most `close_timeout`.
#[no_mangle]
pub extern "C" fn rdzv_shutdown(rdzv: *mut rdzv_t, error: *mut *mut rdzv_error_t) -> rdzv_status_t {
    // Not const: the handle changes (it is shut down). Still safe from any thread.
    boundary(error, || {
        arg_ref(rdzv.cast_const(), "rdzv")?.inner.shutdown()
    })
}

/// Marks this node as leaving the run, as `rdzv_admin_drain` does for any node: for a node
/// that learns first that it will go away (a preemption notice). `reason` may be NULL. At most
/// `connect_timeout` per etcd request (two: its lease, then the mark).
#[no_mangle]
pub extern "C" fn rdzv_drain(
    rdzv: *mut rdzv_t,
    reason: *const c_char,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_drain_with_cancel(rdzv, reason, std::ptr::null(), error)
}

/// `rdzv_drain`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at once,
/// writing nothing, if it already is). A mark cancelled while it was on its way to etcd may or
/// may not have been written; draining again is safe. `cancel` may be NULL (no token). The
/// token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_drain_with_cancel(
    rdzv: *mut rdzv_t,
    reason: *const c_char,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(rdzv.cast_const(), "rdzv")?;
        let reason = optional_str(reason, "reason")?;
        handle.inner.drain_with(reason, &arg_cancel(cancel))
    })
}

/// Sets `*draining` to whether this node was drained (by `rdzv_drain`, an operator or a
/// scheduler): its agent should stop its workers and leave. One etcd read, at most
/// `connect_timeout`.
#[no_mangle]
pub extern "C" fn rdzv_is_draining(
    rdzv: *const rdzv_t,
    draining: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_is_draining_with_cancel(rdzv, std::ptr::null(), draining, error)
}

/// `rdzv_is_draining`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is). `cancel` may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_is_draining_with_cancel(
    rdzv: *const rdzv_t,
    cancel: *const rdzv_cancel_token_t,
    draining: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(rdzv, "rdzv")?;
        let out = arg_out(draining, "draining")?;
        *out = handle.inner.is_draining_with(&arg_cancel(cancel))?;
        Ok(())
    })
}

/// Shuts the handle down (as `rdzv_shutdown`, errors ignored) and frees it. NULL is a no-op.
/// No other thread may be using the handle: call `rdzv_shutdown` and join blocked threads first.
#[no_mangle]
pub extern "C" fn rdzv_free(rdzv: *mut rdzv_t) {
    if !rdzv.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: created by Box::into_raw in rdzv_new, freed once by contract.
            drop(unsafe { Box::from_raw(rdzv) });
        }));
    }
}

/// The run id, NUL-terminated, owned by the handle (valid until `rdzv_free`). NULL for NULL.
#[no_mangle]
pub extern "C" fn rdzv_run_id(rdzv: *const rdzv_t) -> *const c_char {
    // SAFETY: NULL or a live handle.
    unsafe { rdzv.as_ref() }.map_or(std::ptr::null(), |h| h.run_id.as_ptr())
}

/// The backend name (`"etcd-v3"`), owned by the handle. NULL for NULL.
#[no_mangle]
pub extern "C" fn rdzv_backend(rdzv: *const rdzv_t) -> *const c_char {
    // SAFETY: NULL or a live handle.
    unsafe { rdzv.as_ref() }.map_or(std::ptr::null(), |h| h.backend.as_ptr())
}

/// This node's id (16 hex digits, random, unique per handle), owned by the handle. NULL for NULL.
#[no_mangle]
pub extern "C" fn rdzv_node_id(rdzv: *const rdzv_t) -> *const c_char {
    // SAFETY: NULL or a live handle.
    unsafe { rdzv.as_ref() }.map_or(std::ptr::null(), |h| h.node_id.as_ptr())
}
