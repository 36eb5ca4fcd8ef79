//! `rdzv_store_t`: the key-value store of one round, or of the run (c10d `Store` semantics).

use super::boundary::{
    arg_bytes, arg_out, arg_ref, arg_str, arg_strs, boundary, give_bytes, rdzv_error_t,
    rdzv_status_t, to_timeout,
};
use super::cancel::{arg_cancel, rdzv_cancel_token_t};
use rdzv::blocking::BlockingStore;
use rdzv::error::Error;
use std::ffi::c_char;
use std::time::Duration;

/// The longest value the store takes, in bytes: etcd's default request limit (1.5 MiB) less
/// headroom for keys and framing.
// Written out for cbindgen, which cannot read another crate's constants; the asserts hold
// both to the Rust library's.
pub const RDZV_MAX_VALUE_BYTES: usize = 1024 * 1024 + 512 * 1024 - 4096;
/// The longest key the store takes: etcd keeps keys in memory and in every index.
pub const RDZV_MAX_KEY_BYTES: usize = 4096;
const _: () = assert!(RDZV_MAX_VALUE_BYTES == rdzv::store::MAX_VALUE_BYTES);
const _: () = assert!(RDZV_MAX_KEY_BYTES == rdzv::store::MAX_KEY_BYTES);

/// The store of one round, under the run's prefix and the round number: a node of an old round
/// cannot touch a newer round's store. The run's store (`rdzv_run_store`) is the same type,
/// with the same functions, over the whole run instead of one round (its lifetime is described
/// there; the rest below holds for it too). Thread-safe: any function may be called from several
/// threads at once. Keys are non-empty NUL-terminated UTF-8 strings of at most 4096 bytes;
/// values are bytes (at most about 1.5 MiB, etcd's request limit). Timeouts are in
/// milliseconds: negative means the store's default (300 s, see `rdzv_store_set_timeout`),
/// 0 means "do not wait", and values above one year are capped at one year.
///
/// Lifetime: the handle stays valid (for `rdzv_store_free`) after its `rdzv_t` is freed, but
/// its calls then fail: every call fails with `RDZV_ERR_SHUTDOWN` once the node that joined the
/// round is shut down (`rdzv_shutdown` or `rdzv_free`), and a wait in progress returns at once.
/// The data lives as long as the round does: once the round two after it forms, or the run's
/// data is deleted (its last node left), calls fail with `RDZV_ERR_STATE` (`RDZV_ERR_CLOSED` if
/// the run was closed) and nothing is written. A wait whose keys are still missing when the
/// run is closed returns `RDZV_ERR_CLOSED`.
///
/// A wait (`get`, `wait`, `multi_get`) returns at once when cancelled (`rdzv_store_cancel`, or
/// its cancel token) or when the node shuts down, and within a second of its deadline,
/// whatever etcd is doing (down, frozen or restarting): `RDZV_ERR_TIMEOUT`, or
/// `RDZV_ERR_CONNECTION` if etcd did not answer. A read begun before the deadline may take up
/// to a second past it, so a wait with timeout 0 still returns a key that exists. Every other
/// call has a `_with_cancel` form too, which a cancel token ends in the same way; without
/// one, a call that does not wait takes at most the store's request deadline (the store's
/// timeout, clamped to 5-30 s).
pub struct rdzv_store_t(pub(crate) BlockingStore);

fn store_ref<'a>(s: *const rdzv_store_t) -> rdzv::Result<&'a BlockingStore> {
    Ok(&arg_ref(s, "store")?.0)
}

/// Sets `key` to the `value_len` bytes at `value` (`value` may be NULL when `value_len` is 0).
#[no_mangle]
pub extern "C" fn rdzv_store_set(
    store: *const rdzv_store_t,
    key: *const c_char,
    value: *const u8,
    value_len: usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_set_with_cancel(store, key, value, value_len, std::ptr::null(), error)
}

/// `rdzv_store_set`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once, writing nothing, if it already is). A write cancelled on its way to etcd may or may
/// not have been applied, as one that times out. `cancel` may be NULL (no token). The token is
/// not consumed. The same holds for every store write's `_with_cancel` form below.
#[no_mangle]
pub extern "C" fn rdzv_store_set_with_cancel(
    store: *const rdzv_store_t,
    key: *const c_char,
    value: *const u8,
    value_len: usize,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        store_ref(store)?.set_with(
            arg_str(key, "key")?,
            arg_bytes(value, value_len, "value")?,
            &arg_cancel(cancel),
        )
    })
}

/// Waits up to `timeout_ms` for `key` to be set, then returns its value: `*value` receives a
/// buffer of `*value_len` bytes that the caller frees with `rdzv_bytes_free`. If the key is
/// still absent at the deadline: `RDZV_ERR_TIMEOUT`.
#[no_mangle]
pub extern "C" fn rdzv_store_get(
    store: *const rdzv_store_t,
    key: *const c_char,
    timeout_ms: i64,
    value: *mut *mut u8,
    value_len: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    get(
        store,
        key,
        timeout_ms,
        std::ptr::null(),
        value,
        value_len,
        error,
    )
}

/// `rdzv_store_get`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is). `cancel` may be NULL (no token). The token is not consumed.
/// `rdzv_store_cancel` ends this call too.
#[no_mangle]
pub extern "C" fn rdzv_store_get_with_cancel(
    store: *const rdzv_store_t,
    key: *const c_char,
    timeout_ms: i64,
    cancel: *const rdzv_cancel_token_t,
    value: *mut *mut u8,
    value_len: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    get(store, key, timeout_ms, cancel, value, value_len, error)
}

fn get(
    store: *const rdzv_store_t,
    key: *const c_char,
    timeout_ms: i64,
    cancel: *const rdzv_cancel_token_t,
    value: *mut *mut u8,
    value_len: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let (value, value_len) = (arg_out(value, "value")?, arg_out(value_len, "value_len")?);
        let bytes = store_ref(store)?.get_with(
            arg_str(key, "key")?,
            to_timeout(timeout_ms),
            &arg_cancel(cancel),
        )?;
        (*value, *value_len) = give_bytes(bytes);
        Ok(())
    })
}

/// Atomically adds `delta` to the decimal integer stored at `key` (absent counts as 0) and sets
/// `*new_value` to the result. `RDZV_ERR_INVALID_ARGUMENT` if the stored value is not an
/// integer or the sum overflows. Exact under any number of concurrent adders, and counted once
/// when etcd's answer to it is lost and the library sends it again.
#[no_mangle]
pub extern "C" fn rdzv_store_add(
    store: *const rdzv_store_t,
    key: *const c_char,
    delta: i64,
    new_value: *mut i64,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_add_with_cancel(store, key, delta, std::ptr::null(), new_value, error)
}

/// `rdzv_store_add`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (see
/// `rdzv_store_set_with_cancel`: an add cancelled on its way may have added).
#[no_mangle]
pub extern "C" fn rdzv_store_add_with_cancel(
    store: *const rdzv_store_t,
    key: *const c_char,
    delta: i64,
    cancel: *const rdzv_cancel_token_t,
    new_value: *mut i64,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(new_value, "new_value")?;
        *out = store_ref(store)?.add_with(arg_str(key, "key")?, delta, &arg_cancel(cancel))?;
        Ok(())
    })
}

/// Sets `key` to `desired` if it currently holds `expected` (or is absent and `expected_len`
/// is 0), atomically. `*value` receives the value the key holds afterwards (when the key is
/// absent and `expected` is not empty: `expected`, unchanged store), freed with
/// `rdzv_bytes_free`.
#[no_mangle]
pub extern "C" fn rdzv_store_compare_set(
    store: *const rdzv_store_t,
    key: *const c_char,
    expected: *const u8,
    expected_len: usize,
    desired: *const u8,
    desired_len: usize,
    value: *mut *mut u8,
    value_len: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_compare_set_with_cancel(
        store,
        key,
        expected,
        expected_len,
        desired,
        desired_len,
        std::ptr::null(),
        value,
        value_len,
        error,
    )
}

/// `rdzv_store_compare_set`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is
/// cancelled (see `rdzv_store_set_with_cancel`).
#[no_mangle]
pub extern "C" fn rdzv_store_compare_set_with_cancel(
    store: *const rdzv_store_t,
    key: *const c_char,
    expected: *const u8,
    expected_len: usize,
    desired: *const u8,
    desired_len: usize,
    cancel: *const rdzv_cancel_token_t,
    value: *mut *mut u8,
    value_len: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let (value, value_len) = (arg_out(value, "value")?, arg_out(value_len, "value_len")?);
        let bytes = store_ref(store)?.compare_set_with(
            arg_str(key, "key")?,
            arg_bytes(expected, expected_len, "expected")?,
            arg_bytes(desired, desired_len, "desired")?,
            &arg_cancel(cancel),
        )?;
        (*value, *value_len) = give_bytes(bytes);
        Ok(())
    })
}

/// Waits up to `timeout_ms` until all `num_keys` keys exist (`RDZV_ERR_TIMEOUT` otherwise).
#[no_mangle]
pub extern "C" fn rdzv_store_wait(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    num_keys: usize,
    timeout_ms: i64,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_wait_with_cancel(store, keys, num_keys, timeout_ms, std::ptr::null(), error)
}

/// `rdzv_store_wait`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is). `cancel` may be NULL (no token). The token is not consumed.
/// `rdzv_store_cancel` ends this call too.
#[no_mangle]
pub extern "C" fn rdzv_store_wait_with_cancel(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    num_keys: usize,
    timeout_ms: i64,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        store_ref(store)?.wait_with(
            &arg_strs(keys, num_keys, "keys")?,
            to_timeout(timeout_ms),
            &arg_cancel(cancel),
        )
    })
}

/// Sets `*all_exist` to whether all `num_keys` keys exist now. Does not wait.
#[no_mangle]
pub extern "C" fn rdzv_store_check(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    num_keys: usize,
    all_exist: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_check_with_cancel(store, keys, num_keys, std::ptr::null(), all_exist, error)
}

/// `rdzv_store_check`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled (at
/// once if it already is). `cancel` may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_store_check_with_cancel(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    num_keys: usize,
    cancel: *const rdzv_cancel_token_t,
    all_exist: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(all_exist, "all_exist")?;
        *out = store_ref(store)?
            .check_with(&arg_strs(keys, num_keys, "keys")?, &arg_cancel(cancel))?;
        Ok(())
    })
}

/// Deletes `key`; `*deleted` tells whether it existed. `deleted` may be NULL.
#[no_mangle]
pub extern "C" fn rdzv_store_delete_key(
    store: *const rdzv_store_t,
    key: *const c_char,
    deleted: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_delete_key_with_cancel(store, key, std::ptr::null(), deleted, error)
}

/// `rdzv_store_delete_key`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled
/// (see `rdzv_store_set_with_cancel`). `deleted` may be NULL.
#[no_mangle]
pub extern "C" fn rdzv_store_delete_key_with_cancel(
    store: *const rdzv_store_t,
    key: *const c_char,
    cancel: *const rdzv_cancel_token_t,
    deleted: *mut bool,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let existed =
            store_ref(store)?.delete_key_with(arg_str(key, "key")?, &arg_cancel(cancel))?;
        if let Some(out) = unsafe { deleted.as_mut() } {
            *out = existed;
        }
        Ok(())
    })
}

/// Sets `*count` to the number of keys in this store.
#[no_mangle]
pub extern "C" fn rdzv_store_num_keys(
    store: *const rdzv_store_t,
    count: *mut i64,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_num_keys_with_cancel(store, std::ptr::null(), count, error)
}

/// `rdzv_store_num_keys`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled
/// (at once if it already is). `cancel` may be NULL (no token). The token is not consumed.
#[no_mangle]
pub extern "C" fn rdzv_store_num_keys_with_cancel(
    store: *const rdzv_store_t,
    cancel: *const rdzv_cancel_token_t,
    count: *mut i64,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(count, "count")?;
        *out = store_ref(store)?.num_keys_with(&arg_cancel(cancel))?;
        Ok(())
    })
}

/// Waits up to `timeout_ms` for all `num_keys` keys, then returns their values read at one
/// revision: `values[i]`/`value_lens[i]` (caller-provided arrays of `num_keys` entries) receive
/// a buffer per key, each freed with `rdzv_bytes_free`. On failure the arrays are untouched.
#[no_mangle]
pub extern "C" fn rdzv_store_multi_get(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    num_keys: usize,
    timeout_ms: i64,
    values: *mut *mut u8,
    value_lens: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_multi_get_with_cancel(
        store,
        keys,
        num_keys,
        timeout_ms,
        std::ptr::null(),
        values,
        value_lens,
        error,
    )
}

/// `rdzv_store_multi_get`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled
/// (at once if it already is). `cancel` may be NULL (no token). The token is not consumed.
/// `rdzv_store_cancel` ends this call too.
#[no_mangle]
pub extern "C" fn rdzv_store_multi_get_with_cancel(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    num_keys: usize,
    timeout_ms: i64,
    cancel: *const rdzv_cancel_token_t,
    values: *mut *mut u8,
    value_lens: *mut usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let keys = arg_strs(keys, num_keys, "keys")?;
        if num_keys > 0 && (values.is_null() || value_lens.is_null()) {
            return Err(Error::invalid(
                "values/value_lens: expected arrays of num_keys entries, got NULL",
            ));
        }
        let got =
            store_ref(store)?.multi_get_with(&keys, to_timeout(timeout_ms), &arg_cancel(cancel))?;
        for (i, bytes) in got.into_iter().enumerate() {
            let (ptr, len) = give_bytes(bytes);
            // SAFETY: caller-provided arrays of num_keys entries, checked non-NULL.
            unsafe {
                *values.add(i) = ptr;
                *value_lens.add(i) = len;
            }
        }
        Ok(())
    })
}

/// Sets `num_keys` keys at once (all or nothing): `keys[i]` to the `value_lens[i]` bytes at
/// `values[i]`. etcd takes at most 128 writes per transaction: beyond 128 keys, each 128 in
/// turn are set all or nothing, and an error leaves the earlier ones set (setting again is
/// safe).
#[no_mangle]
pub extern "C" fn rdzv_store_multi_set(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    values: *const *const u8,
    value_lens: *const usize,
    num_keys: usize,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    rdzv_store_multi_set_with_cancel(
        store,
        keys,
        values,
        value_lens,
        num_keys,
        std::ptr::null(),
        error,
    )
}

/// `rdzv_store_multi_set`, which also returns `RDZV_ERR_CANCELLED` once `cancel` is cancelled
/// (see `rdzv_store_set_with_cancel`; beyond 128 keys, the transactions sent before the
/// cancel stay applied).
#[no_mangle]
pub extern "C" fn rdzv_store_multi_set_with_cancel(
    store: *const rdzv_store_t,
    keys: *const *const c_char,
    values: *const *const u8,
    value_lens: *const usize,
    num_keys: usize,
    cancel: *const rdzv_cancel_token_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let keys = arg_strs(keys, num_keys, "keys")?;
        let mut bufs = Vec::with_capacity(num_keys);
        if num_keys > 0 {
            if values.is_null() || value_lens.is_null() {
                return Err(Error::invalid(
                    "values/value_lens: expected arrays of num_keys entries, got NULL",
                ));
            }
            for i in 0..num_keys {
                // SAFETY: caller-provided arrays of num_keys entries, checked non-NULL.
                let (ptr, len) = unsafe { (*values.add(i), *value_lens.add(i)) };
                bufs.push(arg_bytes(ptr, len, &format!("values[{i}]"))?);
            }
        }
        store_ref(store)?.multi_set_with(&keys, &bufs, &arg_cancel(cancel))
    })
}

/// Sets the default timeout of `get`, `wait` and `multi_get` (c10d's `set_timeout`).
/// `timeout_ms` must be >= 0.
#[no_mangle]
pub extern "C" fn rdzv_store_set_timeout(
    store: *mut rdzv_store_t,
    timeout_ms: i64,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let s = store_ref(store.cast_const())?;
        if timeout_ms < 0 {
            return Err(Error::invalid(format!(
                "timeout_ms: expected >= 0, got {timeout_ms}"
            )));
        }
        s.set_timeout(Duration::from_millis(timeout_ms as u64));
        Ok(())
    })
}

/// Ends every `rdzv_store_get`, `rdzv_store_wait` and `rdzv_store_multi_get` running on this
/// store in other threads (with or without a cancel token): they return `RDZV_ERR_CANCELLED`.
/// If none is running, the next one to start returns `RDZV_ERR_CANCELLED` at once: a cancel
/// made just as another thread starts a wait is never lost. Waits that start while cancelled
/// ones are still returning end too. The cancel is used up once a wait has returned
/// `RDZV_ERR_CANCELLED` because of it (a wait that found its keys just as the cancel came
/// leaves it for the next wait); the store stays usable, and later waits run normally.
/// Reaches the waits only; the store's other calls take a cancel token. Never blocks; safe
/// from any thread, but not async-signal-safe.
#[no_mangle]
pub extern "C" fn rdzv_store_cancel(
    store: *const rdzv_store_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        store_ref(store)?.cancel();
        Ok(())
    })
}

/// Frees a store handle. NULL is a no-op. No other thread may be using it.
#[no_mangle]
pub extern "C" fn rdzv_store_free(store: *mut rdzv_store_t) {
    if !store.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: created by Box::into_raw in rdzv_next, freed once by contract.
            drop(unsafe { Box::from_raw(store) });
        }));
    }
}
