//! One rendezvous node as a process, for the multi-process benchmark (`bench_processes`).
//! Connects, prints `ready`, waits for a line on stdin (so every process is released at
//! once), calls `next` and prints the CLOCK_MONOTONIC times of the call and the return in
//! nanoseconds (shared by all processes of the machine), then shuts down.
//!
//! ```text
//! bench_node URL   ->  ready
//!                  <-  (any line)
//!                  ->  {"called":N,"returned":N,"rank":R}
//! ```

use rdzv::{BlockingRendezvous, Params};
use std::io::{BufRead, Write};

fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn main() {
    let url = std::env::args().nth(1).expect("usage: bench_node URL");
    let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go).unwrap();
    let called = monotonic_ns();
    let (info, _store) = node.next().unwrap();
    let returned = monotonic_ns();
    writeln!(
        out,
        "{{\"called\":{called},\"returned\":{returned},\"rank\":{}}}",
        info.rank
    )
    .unwrap();
    out.flush().unwrap();
    node.shutdown().unwrap();
}
