//! `rdzv_admin_t`: an operator's or scheduler's handle on a run, which never joins it, and
//! `rdzv_run_status_t`, what it reads.

use super::boundary::{
    arg_out, arg_ref, arg_str, boundary, optional_str, rdzv_error_t, rdzv_status_t, to_timeout,
};
use super::cancel::{arg_cancel, rdzv_cancel_token_t};
use super::params::{params_ref, rdzv_params_t};
use rdzv::admin::{Purge, RunStatus};
use rdzv::blocking::BlockingAdmin;
use rdzv::error::Error;
use std::ffi::{c_char, CString};

/// An operator's handle on one run (the run id and key prefix of its params): reads its
/// status, watches it change, closes, purges and drains it, and never joins it (it holds no
/// lease, so it is never counted, waited for or sealed into a round). Thread-safe: every
/// function may be called on the same handle from several threads at once, except that only
/// one `rdzv_admin_watch` runs at a time per handle (a second one fails with
/// `RDZV_ERR_INVALID_ARGUMENT`); `rdzv_admin_cancel` from another thread ends it (never lost:
/// with no watch running, the next one to start ends). Every call that talks to etcd has a
/// `_with_cancel` form that a cancel token ends. Status and
/// watch need read access to the run's prefix in etcd; close, purge and drain need write
/// access (without it they fail with `RDZV_ERR_CONNECTION`, naming the operation etcd
/// refused). A handle belongs to the process that created it (after `fork()`, create a new
/// one in the child).
pub struct rdzv_admin_t(BlockingAdmin);

/// One member of a sealed round, as `rdzv_run_status_t` lists them.
#[repr(C)]
pub struct rdzv_member_t {
    /// Its rank in the round.
    pub rank: u32,
    /// Its node id, NUL-terminated.
    pub node_id: *const c_char,
    /// The address it registered, NUL-terminated; "" when it is not alive.
    pub addr: *const c_char,
    /// Its lease is live. A member that is not alive is lost: the survivors re-form without it.
    pub alive: bool,
    /// It was drained (a planned departure): the survivors re-form without it at once.
    pub draining: bool,
}

/// A node that joined the round open for joining, as `rdzv_run_status_t` lists them.
#[repr(C)]
pub struct rdzv_joiner_t {
    /// Its node id, NUL-terminated.
    pub node_id: *const c_char,
    /// The address it registered, NUL-terminated.
    pub addr: *const c_char,
    /// Its rank in the sealed round if it was a member (a re-rendezvous is under way), else -1
    /// (a newcomer waiting to be admitted).
    pub member_rank: i64,
    /// It was drained: it will not be sealed into a round.
    pub draining: bool,
}

/// A run as an operator sees it, read at one etcd revision (a consistent snapshot even while
/// rounds form). Made by `rdzv_admin_status` or `rdzv_admin_watch`; every pointer in it
/// (strings and arrays) is owned by the status and valid until `rdzv_run_status_free`.
/// Immutable, so it may be read from any thread.
#[repr(C)]
pub struct rdzv_run_status_t {
    /// The run id, NUL-terminated.
    pub run_id: *const c_char,
    /// False when etcd holds nothing for the run: never started, finished and cleaned up, or
    /// purged. A run that does not exist is not an error: its status is empty.
    pub exists: bool,
    /// The run was closed (the marker lasts `retention`).
    pub closed: bool,
    /// The round open for joining.
    pub open_round: u64,
    /// Whether a sealed round is recorded; the `sealed_*`, `master_*` and `members` fields
    /// describe it when true (and are 0, "" and empty otherwise).
    pub has_sealed: bool,
    /// The last sealed round: the one the members are running.
    pub sealed_round: u64,
    /// Rank 0's bootstrap address (MASTER_ADDR), NUL-terminated.
    pub master_addr: *const c_char,
    /// Rank 0's bootstrap port (MASTER_PORT).
    pub master_port: u16,
    /// The sealed round's members in rank order (`num_members` of them).
    pub members: *const rdzv_member_t,
    pub num_members: usize,
    /// Nodes that joined the open round, in arrival order (`num_waiting` of them): newcomers
    /// waiting to be admitted, and members already re-joining during a re-rendezvous.
    pub waiting: *const rdzv_joiner_t,
    pub num_waiting: usize,
    /// Members of the sealed round that are not alive (lost).
    pub num_lost: usize,
    /// Members of the sealed round that are alive but drained (leaving).
    pub num_draining: usize,
    /// Live nodes of the run: members, waiting nodes and spares alike.
    pub num_alive: usize,
    /// The etcd revision the status was read at; a watch returns increasing revisions.
    pub revision: i64,
}

/// A status and the storage its pointers point into. `public` comes first, so a pointer to
/// the whole is a pointer to it.
#[repr(C)]
struct OwnedStatus {
    public: rdzv_run_status_t,
    _strings: Vec<CString>,
    _members: Vec<rdzv_member_t>,
    _waiting: Vec<rdzv_joiner_t>,
}

fn give_status(s: &RunStatus) -> *mut rdzv_run_status_t {
    let mut strings = Vec::new();
    // A CString's buffer stays where it is when the CString moves into the vector.
    let mut text = |s: &str| {
        let owned = CString::new(s.replace('\0', "")).unwrap_or_default();
        let ptr = owned.as_ptr();
        strings.push(owned);
        ptr
    };
    let run_id = text(&s.run_id);
    let (members, master_addr, master_port, sealed_round) = match &s.sealed {
        Some(sealed) => (
            sealed
                .members
                .iter()
                .map(|m| rdzv_member_t {
                    rank: m.rank,
                    node_id: text(&m.node),
                    addr: text(m.addr.as_deref().unwrap_or("")),
                    alive: m.alive,
                    draining: m.draining,
                })
                .collect::<Vec<_>>(),
            text(&sealed.master_addr),
            sealed.master_port,
            sealed.round,
        ),
        None => (Vec::new(), text(""), 0, 0),
    };
    let waiting: Vec<rdzv_joiner_t> = s
        .waiting
        .iter()
        .map(|j| rdzv_joiner_t {
            node_id: text(&j.node),
            addr: text(&j.addr),
            member_rank: j.member_rank.map_or(-1, i64::from),
            draining: j.draining,
        })
        .collect();
    let public = rdzv_run_status_t {
        run_id,
        exists: s.exists,
        closed: s.closed,
        open_round: s.open_round,
        has_sealed: s.sealed.is_some(),
        sealed_round,
        master_addr,
        master_port,
        members: members.as_ptr(),
        num_members: members.len(),
        waiting: waiting.as_ptr(),
        num_waiting: waiting.len(),
        num_lost: s.lost().len(),
        num_draining: s.draining().len(),
        num_alive: s.alive,
        revision: s.revision,
    };
    let owned = Box::new(OwnedStatus {
        public,
        _strings: strings,
        _members: members,
        _waiting: waiting,
    });
    Box::into_raw(owned).cast::<rdzv_run_status_t>()
}

/// Creates an operator handle: connects to etcd within `connect_timeout`
/// (`RDZV_ERR_CONNECTION`, naming the endpoints, if etcd does not answer) and registers
/// nothing. Does not consume `params`. On success `*out` owns the new handle (free with
/// `rdzv_admin_free`).
#[no_mangle]
pub extern "C" fn rdzv_admin_new(
    params: *const rdzv_params_t,
    out: *mut *mut rdzv_admin_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(out, "out")?;
        let params = params_ref(params)?.clone();
        *out = Box::into_raw(Box::new(rdzv_admin_t(BlockingAdmin::new(params)?)));
        Ok(())
    })
}

/// Frees an operator handle. NULL is a no-op. No other thread may be using it: cancel and
/// join a thread blocked in `rdzv_admin_watch` first.
#[no_mangle]
pub extern "C" fn rdzv_admin_free(admin: *mut rdzv_admin_t) {
    if !admin.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: created by Box::into_raw in rdzv_admin_new, freed once by contract.
            drop(unsafe { Box::from_raw(admin) });
        }));
    }
}

/// Reads the run's status at one etcd revision: two etcd reads (and etcd's alarm list, at
/// most once a second per process while there is no alarm), at most `connect_timeout`. A run that does not exist gives an empty status (`exists` false), not
/// an error. On success `*out` owns the status (free with `rdzv_run_status_free`).
#[no_mangle]
pub extern "C" fn rdzv_admin_status(
    admin: *const rdzv_admin_t,
    out: *mut *mut rdzv_run_status_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_admin_status_with_cancel(admin, std::ptr::null(), out, error)
}

/// `rdzv_admin_status`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled: at
/// once, without asking etcd, if it already is, and promptly whatever etcd is doing if it is
/// cancelled during the call. `cancel` may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_admin_status_with_cancel(
    admin: *const rdzv_admin_t,
    cancel: *const rdzv_cancel_token_t,
    out: *mut *mut rdzv_run_status_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(admin, "admin")?;
        let out = arg_out(out, "out")?;
        *out = give_status(&handle.0.status_with(&arg_cancel(cancel))?);
        Ok(())
    })
}

/// Watches the run: the first call returns its current status; each later call blocks until
/// the run changes as an operator sees it (a join, a seal, a loss, a drain, a close; not the
/// workers' store traffic) and returns the new status, so successive calls return the changes
/// in order (changes within a moment of each other, such as a round's joins and its seal,
/// come as one status, once they have passed: at most 200 ms after the first). It waits by
/// etcd watch, never by polling, and makes each status from the watch's events: etcd is read
/// only when the watch opens or reopens, so a watching scheduler costs etcd no read per
/// change. Returns `RDZV_ERR_TIMEOUT` when
/// nothing changed within `timeout_ms` (0 or more; negative is an invalid argument): the
/// watch stays open and the next call goes on from there, losing nothing. `RDZV_ERR_CANCELLED` when
/// `rdzv_admin_cancel` ends it (made during the call, or before it while no watch ran). If etcd restarts the watch is reopened and the state read
/// again; an etcd that stays unreachable ends the call with `RDZV_ERR_CONNECTION` after
/// `connect_timeout` (call again to resume). On success `*out` owns the status (free with
/// `rdzv_run_status_free`).
#[no_mangle]
pub extern "C" fn rdzv_admin_watch(
    admin: *const rdzv_admin_t,
    timeout_ms: i64,
    out: *mut *mut rdzv_run_status_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_admin_watch_with_cancel(admin, timeout_ms, std::ptr::null(), out, error)
}

/// `rdzv_admin_watch`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is). `cancel` may be NULL (no token). The token is not consumed.
/// `rdzv_admin_cancel` ends this call too.
#[no_mangle]
pub extern "C" fn rdzv_admin_watch_with_cancel(
    admin: *const rdzv_admin_t,
    timeout_ms: i64,
    cancel: *const rdzv_cancel_token_t,
    out: *mut *mut rdzv_run_status_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(admin, "admin")?;
        let out = arg_out(out, "out")?;
        let timeout = to_timeout(timeout_ms).ok_or_else(|| {
            Error::invalid(format!(
                "timeout_ms: expected 0 or more milliseconds, got {timeout_ms}"
            ))
        })?;
        *out = give_status(&handle.0.watch_next_with(timeout, &arg_cancel(cancel))?);
        Ok(())
    })
}

/// Ends the `rdzv_admin_watch` running on this handle in another thread (with or without a
/// cancel token): it returns `RDZV_ERR_CANCELLED`. If none is running, the next one to start
/// returns `RDZV_ERR_CANCELLED` at once: a cancel made just as another thread starts a watch
/// is never lost. The cancel is used up once a watch has returned `RDZV_ERR_CANCELLED` because
/// of it (a watch that returned a status just as the cancel came leaves it for the next one);
/// the handle stays usable, and its watch loses nothing. Reaches the watch only; the handle's
/// other calls take a cancel token. Never blocks; safe from any thread, but not
/// async-signal-safe.
#[no_mangle]
pub extern "C" fn rdzv_admin_cancel(
    admin: *const rdzv_admin_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        arg_ref(admin, "admin")?.0.cancel();
        Ok(())
    })
}

/// Closes the run for every node, as `rdzv_set_closed` does: blocked `rdzv_next` calls
/// return `RDZV_ERR_CLOSED` and later ones fail at once. At most `close_timeout`.
#[no_mangle]
pub extern "C" fn rdzv_admin_close(
    admin: *const rdzv_admin_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_admin_close_with_cancel(admin, std::ptr::null(), error)
}

/// `rdzv_admin_close`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once, writing nothing, if it already is). A close cancelled while it was on its way to etcd
/// may or may not have been applied; closing again is safe. `cancel` may be NULL (no token).
/// The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_admin_close_with_cancel(
    admin: *const rdzv_admin_t,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        arg_ref(admin, "admin")?.0.close_with(&arg_cancel(cancel))
    })
}

/// Deletes every key of the run (rounds, stores, round counter, closed marker), so its id can
/// be used again at once. Refuses while the run is running, deleting nothing: while any node's
/// `alive` key is there, or the run's lease is still refreshed (a running job whose `alive`
/// keys something else deleted), unless `force` (which leaves running nodes without their
/// keys: they fail). The check and the delete are one transaction. On success sets
/// `*deleted` to the number of keys deleted (0 when refused or when there was nothing) and
/// `*alive` to the number of live nodes that made it refuse, at least 1 when it refused (0
/// when it purged). Either output may be NULL.
#[no_mangle]
pub extern "C" fn rdzv_admin_purge(
    admin: *const rdzv_admin_t,
    force: bool,
    deleted: *mut i64,
    alive: *mut u32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_admin_purge_with_cancel(admin, force, std::ptr::null(), deleted, alive, error)
}

/// `rdzv_admin_purge`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once, deleting nothing, if it already is). A purge cancelled while it was on its way to
/// etcd may or may not have been applied (it is one transaction: all or nothing). `cancel` may
/// be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_admin_purge_with_cancel(
    admin: *const rdzv_admin_t,
    force: bool,
    cancel: *const rdzv_cancel_token_t,
    deleted: *mut i64,
    alive: *mut u32,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(admin, "admin")?;
        let (n, refused) = match handle.0.purge_with(force, &arg_cancel(cancel))? {
            Purge::Deleted(n) => (n, 0),
            // Never 0 when refused (0 means purged): a run whose lease is live counts one.
            Purge::Refused { alive, lease_live } => (
                0,
                alive.max(lease_live as usize).min(u32::MAX as usize) as u32,
            ),
        };
        // SAFETY: each output is NULL or writable by contract.
        unsafe {
            if let Some(out) = deleted.as_mut() {
                *out = n;
            }
            if let Some(out) = alive.as_mut() {
                *out = refused;
            }
        }
        Ok(())
    })
}

/// Marks node `node_id` (as `rdzv_node_id` or the status names it) as leaving the run: a
/// planned departure (a preemption notice, maintenance, a scale-down). The other members count
/// it in `rdzv_num_lost` at once, so their agents re-rendezvous without waiting for a lease to
/// expire and without spending restarts, and the next round forms without it; its own
/// `rdzv_next` ends with `RDZV_ERR_GRACEFUL_EXIT` and `rdzv_is_draining` turns true, so its
/// agent stops its workers and leaves. Does not close the run. The mark lasts as long as the
/// node's lease. `reason` (may be NULL) is shown to the node and in logs. Fails with
/// `RDZV_ERR_INVALID_ARGUMENT` naming the node if it is not a live node of the run. At most
/// `connect_timeout`.
#[no_mangle]
pub extern "C" fn rdzv_admin_drain(
    admin: *const rdzv_admin_t,
    node_id: *const c_char,
    reason: *const c_char,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_admin_drain_with_cancel(admin, node_id, reason, std::ptr::null(), error)
}

/// `rdzv_admin_drain`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once, writing nothing, if it already is). A mark cancelled while it was on its way to etcd
/// may or may not have been written; draining again is safe. `cancel` may be NULL (no token).
/// The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_admin_drain_with_cancel(
    admin: *const rdzv_admin_t,
    node_id: *const c_char,
    reason: *const c_char,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let handle = arg_ref(admin, "admin")?;
        let node = arg_str(node_id, "node_id")?;
        let reason = optional_str(reason, "reason")?;
        handle.0.drain_with(node, reason, &arg_cancel(cancel))
    })
}

/// Frees a status and everything it points to. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rdzv_run_status_free(status: *mut rdzv_run_status_t) {
    if !status.is_null() {
        // SAFETY: created by `give_status` (a Box<OwnedStatus> whose first field is the public
        // struct), freed once by contract.
        drop(unsafe { Box::from_raw(status.cast::<OwnedStatus>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdzv::admin::{Joiner, Member, SealedRound};
    use std::ffi::CStr;

    #[test]
    fn a_status_survives_the_trip_through_c_structs() {
        let status = RunStatus {
            run_id: "job".into(),
            exists: true,
            closed: false,
            failure: None,
            open_round: 4,
            sealed: Some(SealedRound {
                round: 3,
                master_addr: "10.0.0.1".into(),
                master_port: 29500,
                members: vec![
                    Member {
                        rank: 0,
                        node: "a".into(),
                        addr: Some("h0".into()),
                        alive: true,
                        draining: false,
                    },
                    Member {
                        rank: 1,
                        node: "b".into(),
                        addr: None,
                        alive: false,
                        draining: false,
                    },
                    Member {
                        rank: 2,
                        node: "c".into(),
                        addr: Some("h2".into()),
                        alive: true,
                        draining: true,
                    },
                ],
            }),
            waiting: vec![Joiner {
                node: "d".into(),
                addr: "h3".into(),
                member_rank: None,
                draining: false,
            }],
            alive: 3,
            notes: Default::default(),
            alarms: vec![],
            revision: 42,
        };
        let raw = give_status(&status);
        // SAFETY: just made; freed below.
        let s = unsafe { &*raw };
        let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string();
        assert_eq!(text(s.run_id), "job");
        assert!(s.exists && !s.closed && s.has_sealed);
        assert_eq!((s.open_round, s.sealed_round, s.master_port), (4, 3, 29500));
        assert_eq!(text(s.master_addr), "10.0.0.1");
        let members = unsafe { std::slice::from_raw_parts(s.members, s.num_members) };
        let nodes: Vec<_> = members.iter().map(|m| text(m.node_id)).collect();
        assert_eq!(nodes, ["a", "b", "c"]);
        assert_eq!(text(members[1].addr), "");
        assert!(!members[1].alive && members[2].draining);
        let waiting = unsafe { std::slice::from_raw_parts(s.waiting, s.num_waiting) };
        assert_eq!(
            (text(waiting[0].node_id), waiting[0].member_rank),
            ("d".into(), -1)
        );
        assert_eq!(
            (s.num_lost, s.num_draining, s.num_alive, s.revision),
            (1, 1, 3, 42)
        );
        rdzv_run_status_free(raw);
    }
}
