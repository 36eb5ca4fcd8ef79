//! `rdzv_params_t`: building the description of a rendezvous.

use super::boundary::{arg_out, arg_ref, arg_str, boundary, rdzv_error_t, rdzv_status_t};
use rdzv::params::Params;
use std::ffi::c_char;

/// Parameters of a rendezvous. Created by `rdzv_params_from_url` or `rdzv_params_new`, changed
/// by `rdzv_params_set`, freed by `rdzv_params_free`. Not thread-safe to change; may be read
/// (passed to `rdzv_new`) from several threads at once while nobody changes it.
pub struct rdzv_params_t(pub(crate) Params);

/// Parses `etcd://HOST:PORT[,HOST:PORT...]/RUN_ID?name=value&...` into new parameters.
/// Schemes: `etcd`/`etcd-v3` (plain), `etcds`/`etcd+https` (TLS). A HOST without a port means
/// etcd's port, 2379 (as in `rdzv_params_new`). Options as for `rdzv_params_set`. On success `*out` owns new parameters (free with `rdzv_params_free`).
#[no_mangle]
pub extern "C" fn rdzv_params_from_url(
    url: *const c_char,
    out: *mut *mut rdzv_params_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(out, "out")?;
        let params = Params::from_url(arg_str(url, "url")?)?;
        *out = Box::into_raw(Box::new(rdzv_params_t(params)));
        Ok(())
    })
}

/// New parameters from explicit values, as torch's `RendezvousParameters`. `backend` is
/// `"etcd-v3"` (or `"etcd"`); `endpoints` is `HOST[:PORT][,HOST[:PORT]...]` (no port: etcd's
/// 2379, as in `rdzv_params_from_url`); `run_id` non-empty;
/// `1 <= min_nodes <= max_nodes`. On success `*out` owns new parameters.
#[no_mangle]
pub extern "C" fn rdzv_params_new(
    backend: *const c_char,
    endpoints: *const c_char,
    run_id: *const c_char,
    min_nodes: u32,
    max_nodes: u32,
    out: *mut *mut rdzv_params_t,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let out = arg_out(out, "out")?;
        let params = Params::new(
            arg_str(backend, "backend")?,
            arg_str(endpoints, "endpoints")?,
            arg_str(run_id, "run_id")?,
            min_nodes,
            max_nodes,
        )?;
        *out = Box::into_raw(Box::new(rdzv_params_t(params)));
        Ok(())
    })
}

/// Sets one option. Names (aliases after `|`): `min_nodes|min_workers`,
/// `max_nodes|max_workers`, `nnodes` (`N` or `MIN:MAX`), `local_addr`,
/// `join_timeout|timeout` (s, default 600), `last_call_timeout` (30), `close_timeout` (30),
/// `lease_ttl|keep_alive_ttl` (10, at least 2), `peer_timeout` (1: how long a member may go
/// unreachable by its peer before it is suspected; 0 leaves dead nodes to `lease_ttl`),
/// `connect_timeout` (10), `store_timeout` (300),
/// `retention` (3600: how long a closed run's marker stays), `key_prefix|etcd_prefix`
/// (`/rdzv`), `protocol` (`http`|`https`), `cacert`, `cert`, `key` (PEM file paths),
/// `username`, `password`. Times are seconds as plain decimals (`30`, `0.5`). An unknown name or
/// a bad value gives `RDZV_ERR_INVALID_ARGUMENT` naming it, and leaves `params` unchanged.
#[no_mangle]
pub extern "C" fn rdzv_params_set(
    params: *mut rdzv_params_t,
    name: *const c_char,
    value: *const c_char,
    error: *mut *mut rdzv_error_t,
) -> rdzv_status_t {
    boundary(error, || {
        let params = arg_out(params, "params")?;
        params
            .0
            .set(arg_str(name, "name")?, arg_str(value, "value")?)
    })
}

/// Frees parameters. NULL is a no-op. Handles created from them are not affected.
#[no_mangle]
pub extern "C" fn rdzv_params_free(params: *mut rdzv_params_t) {
    if !params.is_null() {
        // SAFETY: created by Box::into_raw above, freed once by contract.
        drop(unsafe { Box::from_raw(params) });
    }
}

pub(crate) fn params_ref<'a>(params: *const rdzv_params_t) -> rdzv::Result<&'a Params> {
    Ok(&arg_ref(params, "params")?.0)
}
