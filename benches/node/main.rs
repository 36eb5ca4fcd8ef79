//! Rendezvous nodes as a process, for the multi-process benchmark (`bench_processes`): one
//! node, or K nodes sharing the process's connection (`bench_node URL K`, for rounds larger
//! than a machine has processes to spare). Connects, prints `ready`, waits for a line on stdin
//! (so every process is released at once), calls `next` on every node and prints the
//! CLOCK_MONOTONIC times of the last call and the last return in nanoseconds (shared by all
//! processes of the machine), then shuts down.
//!
//! ```text
//! bench_node URL [K]  ->  ready
//!                     <-  (any line)
//!                     ->  {"called":N,"returned":N}
//! ```

use rdzv::{BlockingRendezvous, Params, Rendezvous};
use std::io::{BufRead, Write};
use std::sync::Arc;

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
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: bench_node URL [K]");
    let k: usize = args
        .next()
        .map_or(1, |k| k.parse().expect("K must be a number"));
    let params = Params::from_url(&url).unwrap();
    let (called, returned) = match k {
        // One node per process, as a C or Python program uses the library.
        1 => {
            let node = BlockingRendezvous::new(params).unwrap();
            ready();
            let called = monotonic_ns();
            node.next().unwrap();
            let returned = monotonic_ns();
            node.shutdown().unwrap();
            (called, returned)
        }
        // K nodes on one thread of this process's own runtime.
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(many(params, k)),
    };
    println!("{{\"called\":{called},\"returned\":{returned}}}");
}

/// Says `ready` and waits for the line that releases every process at once.
fn ready() {
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    std::io::stdin()
        .lock()
        .read_line(&mut String::new())
        .unwrap();
}

/// K nodes calling next at once: the last call and the last return.
async fn many(params: Params, k: usize) -> (u128, u128) {
    let mut nodes = Vec::with_capacity(k);
    for _ in 0..k {
        nodes.push(Arc::new(Rendezvous::new(params.clone()).await.unwrap()));
    }
    // Blocking here is fine: nothing else runs on this thread until the release.
    ready();
    let calls: Vec<_> = nodes
        .iter()
        .map(|node| {
            let node = node.clone();
            tokio::spawn(async move {
                let called = monotonic_ns();
                node.next().await.unwrap();
                (called, monotonic_ns())
            })
        })
        .collect();
    let (mut called, mut returned) = (0, 0);
    for call in calls {
        let (c, r) = call.await.unwrap();
        (called, returned) = (called.max(c), returned.max(r));
    }
    for node in &nodes {
        node.shutdown().await.unwrap();
    }
    (called, returned)
}
