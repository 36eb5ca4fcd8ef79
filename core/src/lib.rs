//! rdzv: torchelastic-style rendezvous for elastic training on the etcd v3 API, the Rust
//! library. Its C library (librdzv, the crate `rdzv-c` at the repository's root) is the C ABI
//! over this crate's public API, so this crate builds no C artifact and runs no cbindgen.
//!
//! Layers, bottom up: `error` and `util` (the error and its kinds; node ids, ports, jitter),
//! `params` (what to join), `backend` (etcd connection, retries, key layout, leases),
//! `rendezvous` (the round protocol), `store` (the per-round key-value store) and `blocking`
//! (one runtime, `block_on` per call, which the C ABI is built on). Beside them, `admin`
//! reads, watches, closes and purges a run for operators without joining it; `election`
//! elects a leader through an etcd lease (`rdzv lighthouse`); `progress` is the page a worker
//! writes its heartbeats to and its launcher reads; `inprocess` is the control file of
//! in-process restart, both sides; `log` decides where the `tracing` records
//! go. `cancel` is the token a blocking caller hands to any call that asks etcd, to end it (an
//! async caller drops the future instead). The `rdzv` command (cli/) is built on the public
//! API alone.
//!
//! A node joins a round with [`Rendezvous::next`] and gets its rank, the world size, rank 0's
//! address and the round's [`Store`]; every node of the job runs the same code:
//!
//! ```no_run
//! # async fn node() -> rdzv::Result<()> {
//! use rdzv::{Params, Rendezvous};
//!
//! let params = Params::from_url("etcd://127.0.0.1:2379/job-42?min_nodes=2&max_nodes=4")?;
//! let node = Rendezvous::new(params).await?;
//! let (round, store) = node.next().await?; // blocks until a round of 2 to 4 nodes forms
//! store.set(&format!("node/{}", round.rank), b"hello").await?;
//! let first = store.get("node/0", None).await?; // waits until rank 0 has set it
//! assert_eq!(first, b"hello");
//! node.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! [`BlockingRendezvous`] is the same without async, for threads (the C ABI is built on it).

pub mod admin;
mod backend;
pub mod blocking;
pub mod cancel;
pub mod election;
pub mod error;
pub mod inprocess;
pub mod log;
pub mod params;
pub mod progress;
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
