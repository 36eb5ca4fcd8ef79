//! rdzv: torchelastic-style rendezvous for elastic training on the etcd v3 API, with a C ABI.
//!
//! Layers, bottom up: `params` (what to join), `backend` (etcd connection, retries, key
//! layout, leases), `rendezvous` (the round protocol), `store` (the per-round key-value
//! store), `blocking` (one runtime, `block_on` per call) and `ffi` (the C ABI, glue only).
//! Beside them, `admin` reads, watches, closes and purges a run for operators without
//! joining it. `cancel` is the token a caller hands to the calls that wait, to end them.

pub mod admin;
pub mod backend;
pub mod blocking;
pub mod cancel;
pub mod error;
pub mod ffi;
pub mod log;
pub mod params;
pub mod rendezvous;
pub mod store;
mod util;

pub use blocking::{BlockingAdmin, BlockingRendezvous, BlockingStore};
pub use cancel::CancelToken;
pub use error::{Error, ErrorKind, Result};
pub use params::Params;
pub use rendezvous::{Rendezvous, RoundInfo};
pub use store::Store;
/// A port for MASTER_PORT: free a moment ago, outside the kernel's ephemeral range (what a
/// node publishes for rank 0 when it joins; the launcher's standalone mode uses it too).
pub use util::free_port as free_master_port;
