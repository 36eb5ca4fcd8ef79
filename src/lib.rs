//! rdzv: torchelastic-style rendezvous for elastic training on the etcd v3 API, with a C ABI.
//!
//! Layers, bottom up: `params` (what to join), `backend` (etcd connection, retries, key
//! layout, leases), `rendezvous` (the round protocol), `store` (the per-round key-value
//! store), `blocking` (one runtime, `block_on` per call) and `ffi` (the C ABI, glue only).
//! Beside them, `admin` reads, watches, closes and purges a run for operators without
//! joining it. `cancel` is the token a caller hands to the calls that wait, to end them. The
//! `rdzv` command (cli/) is built on the public API alone.

pub mod admin;
mod backend;
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
pub use rendezvous::{ReleaseTicket, Rendezvous, RoundInfo};
pub use store::Store;
/// What rdzv's own tests and benchmarks reach inside the library for (the records a round
/// writes to etcd, to check them from outside). Not part of the API: it may change in any
/// release.
#[doc(hidden)]
pub mod test_support {
    pub use crate::rendezvous::records::{
        chunk_count, inline_members, lane_values, members_from_chunks, parse_rank_chunk,
        FinalRecord, JoinRecord,
    };
}

/// A port for MASTER_PORT: free a moment ago, outside the kernel's ephemeral range (what a
/// node publishes for rank 0 when it joins; the launcher's standalone mode uses it too).
pub use util::free_port as free_master_port;
