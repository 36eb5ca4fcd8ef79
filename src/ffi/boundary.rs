//! The panic and argument boundary shared by every exported function, and the error object.

use rdzv::error::{Error, ErrorKind, Result};
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status of a call. Values are fixed and will never be renumbered.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rdzv_status_t {
    /// Success.
    RDZV_OK = 0,
    /// An argument was NULL, not UTF-8, malformed or out of range; nothing was changed.
    RDZV_ERR_INVALID_ARGUMENT = 1,
    /// The run is closed (torch: RendezvousClosedError).
    RDZV_ERR_CLOSED = 2,
    /// The call did not complete in time (torch: RendezvousTimeoutError).
    RDZV_ERR_TIMEOUT = 3,
    /// etcd unreachable or refused the request after retries, or this node's lease expired
    /// (torch: RendezvousConnectionError).
    RDZV_ERR_CONNECTION = 4,
    /// Corrupt or foreign data under the run's prefix (torch: RendezvousStateError).
    RDZV_ERR_STATE = 5,
    /// The run closed while this node waited outside the running round (it arrived late, or
    /// a full round left it out); not a failure
    /// (torch: RendezvousGracefulExitError).
    RDZV_ERR_GRACEFUL_EXIT = 6,
    /// The handle was shut down, possibly from another thread while this call was blocked.
    RDZV_ERR_SHUTDOWN = 7,
    /// A bug in rdzv, such as a caught panic. Please report it.
    RDZV_ERR_INTERNAL = 8,
    /// The call was cancelled: by its cancel token (`rdzv_cancel_token_cancel`), or by
    /// `rdzv_cancel`, `rdzv_store_cancel` or `rdzv_admin_cancel` while it ran; the handle stays
    /// usable (Go: context cancelled).
    RDZV_ERR_CANCELLED = 9,
}

/// An error: its status and a readable message. Created by a failing call when the caller
/// passes a non-NULL `rdzv_error_t **`; owned by the caller, freed with `rdzv_error_free`.
/// Immutable, so it may be read from any thread.
pub struct rdzv_error_t {
    status: rdzv_status_t,
    message: CString,
}

pub(crate) fn status_of(kind: ErrorKind) -> rdzv_status_t {
    use rdzv_status_t::*;
    match kind {
        ErrorKind::InvalidArgument => RDZV_ERR_INVALID_ARGUMENT,
        ErrorKind::Closed => RDZV_ERR_CLOSED,
        ErrorKind::Timeout => RDZV_ERR_TIMEOUT,
        ErrorKind::Connection | ErrorKind::LeaseLost => RDZV_ERR_CONNECTION,
        ErrorKind::State => RDZV_ERR_STATE,
        ErrorKind::GracefulExit => RDZV_ERR_GRACEFUL_EXIT,
        ErrorKind::Shutdown => RDZV_ERR_SHUTDOWN,
        ErrorKind::Internal => RDZV_ERR_INTERNAL,
        ErrorKind::Cancelled => RDZV_ERR_CANCELLED,
    }
}

/// Runs `body`, catching panics, and reports its outcome as a status (and an error object
/// when `error` is not NULL).
pub(crate) fn boundary(
    error: *mut *mut rdzv_error_t,
    body: impl FnOnce() -> Result<()>,
) -> rdzv_status_t {
    // A program that reaches rdzv through the C ABI gets rdzv's log routing (once).
    rdzv::log::install_default();
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::internal(format!(
            "internal error (panic caught at the C boundary): {what}"
        )))
    });
    match outcome {
        Ok(()) => rdzv_status_t::RDZV_OK,
        Err(err) => {
            let status = status_of(err.kind());
            if !error.is_null() {
                let message = CString::new(err.message().replace('\0', "\\0")).unwrap_or_default();
                // SAFETY: the caller passed a writable `rdzv_error_t **` (checked non-NULL).
                unsafe { *error = Box::into_raw(Box::new(rdzv_error_t { status, message })) };
            }
            status
        }
    }
}

/// A required input string: non-NULL, NUL-terminated, UTF-8.
pub(crate) fn arg_str<'a>(ptr: *const c_char, name: &str) -> Result<&'a str> {
    if ptr.is_null() {
        return Err(Error::invalid(format!(
            "{name}: expected a string, got NULL"
        )));
    }
    // SAFETY: non-NULL and, by the API contract, NUL-terminated and alive for the call.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| Error::invalid(format!("{name}: not valid UTF-8")))
}

/// A required input handle.
pub(crate) fn arg_ref<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    // SAFETY: by the API contract a non-NULL handle points to a live object of this type.
    unsafe { ptr.as_ref() }
        .ok_or_else(|| Error::invalid(format!("{name}: expected a handle, got NULL")))
}

/// A required output location.
pub(crate) fn arg_out<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: by the API contract a non-NULL output pointer is writable.
    unsafe { ptr.as_mut() }
        .ok_or_else(|| Error::invalid(format!("{name}: expected an output pointer, got NULL")))
}

/// Bytes in: `(NULL, 0)` is the empty value; NULL with a length is an error.
pub(crate) fn arg_bytes<'a>(ptr: *const u8, len: usize, name: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!("{name}: NULL with length {len}")));
    }
    if len > isize::MAX as usize {
        return Err(Error::invalid(format!(
            "{name}: length {len} is not a valid buffer size"
        )));
    }
    // SAFETY: by the API contract `ptr` points to `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// An optional input string: NULL is "".
pub(crate) fn optional_str<'a>(ptr: *const c_char, name: &str) -> Result<&'a str> {
    match ptr.is_null() {
        true => Ok(""),
        false => arg_str(ptr, name),
    }
}

/// An array of `n` input strings.
pub(crate) fn arg_strs<'a>(
    ptr: *const *const c_char,
    n: usize,
    name: &str,
) -> Result<Vec<&'a str>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!(
            "{name}: NULL array with {n} entries"
        )));
    }
    // SAFETY: by the API contract `ptr` points to `n` string pointers.
    let items = unsafe { std::slice::from_raw_parts(ptr, n) };
    items
        .iter()
        .enumerate()
        .map(|(i, &p)| arg_str(p, &format!("{name}[{i}]")))
        .collect()
}

/// Hands a byte buffer to C; freed with `rdzv_bytes_free(ptr, len)`.
pub(crate) fn give_bytes(bytes: Vec<u8>) -> (*mut u8, usize) {
    let boxed = bytes.into_boxed_slice();
    let len = boxed.len();
    (Box::into_raw(boxed).cast::<u8>(), len)
}

/// Converts a millisecond timeout: negative means "the default" (None).
pub(crate) fn to_timeout(ms: i64) -> Option<std::time::Duration> {
    (ms >= 0).then(|| std::time::Duration::from_millis(ms as u64))
}

/// The name of a status code, e.g. `"RDZV_ERR_TIMEOUT"`; `"RDZV_ERR_UNKNOWN"` for a value
/// that is not a status. Takes an `int` so any value is safe to pass. Static storage; never NULL.
#[no_mangle]
pub extern "C" fn rdzv_status_name(status: i32) -> *const c_char {
    const NAMES: [&CStr; 10] = [
        c"RDZV_OK",
        c"RDZV_ERR_INVALID_ARGUMENT",
        c"RDZV_ERR_CLOSED",
        c"RDZV_ERR_TIMEOUT",
        c"RDZV_ERR_CONNECTION",
        c"RDZV_ERR_STATE",
        c"RDZV_ERR_GRACEFUL_EXIT",
        c"RDZV_ERR_SHUTDOWN",
        c"RDZV_ERR_INTERNAL",
        c"RDZV_ERR_CANCELLED",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"RDZV_ERR_UNKNOWN".as_ptr(), |name| name.as_ptr())
}

/// The error's status. Returns `RDZV_ERR_INVALID_ARGUMENT` for NULL.
#[no_mangle]
pub extern "C" fn rdzv_error_status(error: *const rdzv_error_t) -> rdzv_status_t {
    // SAFETY: NULL or a live error from this library.
    unsafe { error.as_ref() }.map_or(rdzv_status_t::RDZV_ERR_INVALID_ARGUMENT, |e| e.status)
}

/// The error's message, NUL-terminated UTF-8, owned by the error: valid until
/// `rdzv_error_free`. Returns "" for NULL. Messages never contain passwords or key contents.
#[no_mangle]
pub extern "C" fn rdzv_error_message(error: *const rdzv_error_t) -> *const c_char {
    // SAFETY: NULL or a live error from this library.
    unsafe { error.as_ref() }.map_or(c"".as_ptr(), |e| e.message.as_ptr())
}

/// Frees an error. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rdzv_error_free(error: *mut rdzv_error_t) {
    if !error.is_null() {
        // SAFETY: created by Box::into_raw in `boundary`, freed once by contract.
        drop(unsafe { Box::from_raw(error) });
    }
}

/// Frees a buffer returned by an `rdzv_store_*` call, given the length returned with it.
/// NULL is a no-op.
#[no_mangle]
pub extern "C" fn rdzv_bytes_free(bytes: *mut u8, len: usize) {
    if !bytes.is_null() {
        // SAFETY: created by `give_bytes` with exactly this length, freed once by contract.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(bytes, len)) });
    }
}
