//! Small helpers with no better home: randomness from the OS and free-port discovery.

/// Fills `buf` from the kernel's random source.
fn fill_random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n <= 0 {
            // getrandom cannot fail on Linux ≥ 3.17 except for EINTR; fall back to the clock.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            for (i, b) in buf[filled..].iter_mut().enumerate() {
                *b = (nanos >> ((i % 16) * 8)) as u8 ^ std::process::id() as u8;
            }
            return;
        }
        filled += n as usize;
    }
}

/// A uniformly distributed number in [0, 1), for backoff jitter.
pub fn random_unit() -> f64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// A fresh 64-bit random node id in hex: unique across hosts and restarts without
/// coordination (two of 10^4 nodes collide with probability below 10^-11), and short, since
/// every sealed round lists all of them.
pub fn new_node_id() -> String {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A TCP port that was free a moment ago, for MASTER_PORT (the same race torch accepts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29500)
}
