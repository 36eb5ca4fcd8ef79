//! The C ABI. Glue only: every exported function checks its arguments, calls the blocking
//! facade inside `boundary` (which catches panics and turns errors into a status and an
//! optional error object), and writes outputs only on success.
//!
//! The conventions every function keeps (statuses and error objects, ownership, threads,
//! deadlines, strings and bytes) are written once, in `cbindgen.toml`'s header: the top of
//! `include/rdzv.h`. Each function's doc comment is its entry in that header.

#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C, where `unsafe` means nothing; each function's
// documented contract is what makes the dereference sound. C signatures also run long.
#![allow(clippy::not_unsafe_ptr_arg_deref, clippy::too_many_arguments)]

mod admin;
mod boundary;
mod cancel;
mod log;
mod params;
mod progress;
mod rendezvous;
mod store;
mod version;

pub use admin::*;
pub use boundary::*;
pub use cancel::*;
pub use log::*;
pub use params::*;
pub use progress::*;
pub use rendezvous::*;
pub use store::*;
pub use version::*;
