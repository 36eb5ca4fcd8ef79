//! librdzv: the C library. The C ABI over the Rust library (the `rdzv` crate, core/), glue
//! only: every exported function checks its arguments, calls the Rust library's blocking API
//! inside `boundary` (which catches panics and turns errors into a status and an optional
//! error object), and writes outputs only on success. This crate is the artifact: the shared
//! and static library (`librdzv.so.0`, `librdzv.a`), their exported symbols and the header
//! cbindgen makes from these sources (build.rs). A Rust program depends on `rdzv` instead,
//! which builds none of it.
//!
//! The conventions every function keeps (statuses and error objects, ownership, threads,
//! deadlines, strings and bytes) are written once, in `cbindgen.toml`'s header: the top of
//! `include/rdzv.h`. Each function's doc comment is its entry in that header.

#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C, where `unsafe` means nothing; each function's
// documented contract is what makes the dereference sound. C signatures also run long.
#![allow(clippy::not_unsafe_ptr_arg_deref, clippy::too_many_arguments)]

/// Each area of the C ABI, one file under src/ffi/.
mod ffi {
    pub mod admin;
    pub mod boundary;
    pub mod cancel;
    pub mod inprocess;
    pub mod log;
    pub mod params;
    pub mod progress;
    pub mod rendezvous;
    pub mod store;
    pub mod version;
}

pub use ffi::admin::*;
pub use ffi::boundary::*;
pub use ffi::cancel::*;
pub use ffi::inprocess::*;
pub use ffi::log::*;
pub use ffi::params::*;
pub use ffi::progress::*;
pub use ffi::rendezvous::*;
pub use ffi::store::*;
pub use ffi::version::*;
