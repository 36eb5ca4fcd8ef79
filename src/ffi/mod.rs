//! The C ABI. Glue only: every exported function checks its arguments, calls the blocking
//! facade inside `boundary` (which catches panics and turns errors into a status and an
//! optional error object), and writes outputs only on success.
//!
//! Conventions, stated once here and on every function in `include/rdzv.h`:
//! - Every fallible function returns `rdzv_status_t` (`RDZV_OK` = 0) and takes a trailing
//!   `rdzv_error_t **error` that may be NULL. On failure, if `error` is not NULL, `*error`
//!   receives a new error object that the caller frees with `rdzv_error_free`. The error
//!   travels with the call, so it is safe to read from Go, where a goroutine can change OS
//!   threads between two cgo calls (a thread-local "last error" would not be).
//! - Strings in are NUL-terminated UTF-8; NULL or invalid UTF-8 gives
//!   `RDZV_ERR_INVALID_ARGUMENT` naming the argument. Store values are bytes with a length.
//! - Buffers out are allocated by rdzv and freed with `rdzv_bytes_free`; handles with their
//!   own `_free`. `_free(NULL)` is a no-op.

#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C, where `unsafe` means nothing; each function's
// documented contract is what makes the dereference sound. C signatures also run long.
#![allow(clippy::not_unsafe_ptr_arg_deref, clippy::too_many_arguments)]

mod admin;
mod boundary;
mod cancel;
mod log;
mod params;
mod rendezvous;
mod store;
mod version;

pub use admin::*;
pub use boundary::*;
pub use cancel::*;
pub use log::*;
pub use params::*;
pub use rendezvous::*;
pub use store::*;
pub use version::*;
