//! rdzv's integration tests, one module per area, linked into one test program (as wasmtime's
//! `tests/all`): one link instead of one per area, and libtest runs the tests of every area
//! side by side instead of one program after another. Each test starts its own etcd (free
//! ports, a temporary data directory), so they share nothing but the process.
//!
//! Run one area with `cargo test --test all rendezvous::`, one test with its full name.
//! `tests/logs.rs` and `tests/logs_subscriber.rs` stay programs of their own: they test what
//! the library does with the process's global logging, which the tests here share
//! (`records`).

use rdzv_test_support as common;
use rdzv_test_support::records;

mod admin;
mod c_api;
mod chaos;
mod cluster;
mod drain;
mod election;
mod faults;
mod harness;
mod interrupt;
mod lifetime;
mod peers;
mod processes;
mod races;
mod rendezvous;
mod run_store;
mod scale;
mod security;
mod soak;
mod store;
mod wakeups;
mod watched;
