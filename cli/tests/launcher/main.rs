//! `rdzv run` end to end: real launcher processes on a real etcd, with small shell workers
//! that print their environment (the launcher forwards their lines as they are, which the
//! tests read through pipes). Every wait is bounded and waits on an event: a line on a pipe,
//! a process exit (pidfd), an etcd watch.
//!
//! One binary, a module per area: `rendezvous` (forming and re-forming on etcd), `backends`
//! (standalone, static, c10d), `failures` (restarts and the failure report), `signals`,
//! `operators` (`rdzv status`, `close`, `purge`, `drain`), `logs` (the console and log
//! files), `flags` (the command line), `devices` (GPUs and NUMA nodes of a made-up machine);
//! what they share in `support`.

use rdzv_test_support as common;
#[path = "../support/launch.rs"]
mod launch;

mod backends;
mod devices;
mod events;
mod failures;
mod flags;
mod inprocess;
mod logs;
mod operators;
mod rendezvous;
mod signals;
mod support;
