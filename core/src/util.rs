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

/// A TCP port for MASTER_PORT that was free a moment ago. Rank 0's trainers listen on it
/// only later, so it is picked outside the kernel's ephemeral range: the ports the kernel
/// hands to every outgoing connection (and to `bind` on port 0), which on a busy machine
/// took a port picked the old way before the trainers could listen on it. Only a listener
/// choosing the same port can take it now. Falls back to an ephemeral port if no other is free.
pub fn free_port() -> u16 {
    if let Some((from, to)) = master_ports() {
        let span = u32::from(to - from) + 1;
        for _ in 0..64 {
            // random_unit() < 1, so the offset is below span and the port at most `to`.
            let port = (u32::from(from) + (random_unit() * f64::from(span)) as u32) as u16;
            if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29500)
}

const MASTER_PORTS_FROM: u16 = 20000;

/// The ports MASTER_PORT is picked from: from `MASTER_PORTS_FROM` (above the well-known and
/// most service ports; torch's default 29500 is in here) up to the ephemeral range, or above
/// it if it starts lower; none if the ephemeral range covers everything from there up.
fn master_ports() -> Option<(u16, u16)> {
    let (low, high) = ephemeral_ports();
    match low > MASTER_PORTS_FROM {
        true => Some((MASTER_PORTS_FROM, low - 1)),
        false => high
            .checked_add(1)
            .map(|above| (above.max(MASTER_PORTS_FROM), u16::MAX)),
    }
}

/// The kernel's ephemeral port range (Linux's default if it cannot be read), read once per
/// process: every join picks a port, and reading the file each time took 4% of the CPU time
/// of a round of 1024 nodes in one process.
fn ephemeral_ports() -> (u16, u16) {
    static RANGE: once_cell::sync::Lazy<(u16, u16)> = once_cell::sync::Lazy::new(|| {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
        let parsed = range.and_then(|r| {
            let mut it = r.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        });
        parsed.unwrap_or((32768, 60999))
    });
    *RANGE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cause of a flake: MASTER_PORT picked with `bind(0)` is an ephemeral port, and an
    /// outgoing connection of any process on the machine could take it before rank 0's
    /// trainers listened on it (EADDRINUSE in torch's TCPStore). Master ports must come from
    /// outside that range, and be free when picked.
    #[test]
    fn master_ports_are_outside_the_ephemeral_range_and_free() {
        let (low, high) = ephemeral_ports();
        for _ in 0..200 {
            let port = free_port();
            assert!(
                !(low..=high).contains(&port),
                "port {port} is in the ephemeral range {low}-{high}"
            );
            assert!(
                port >= MASTER_PORTS_FROM,
                "port {port} is below {MASTER_PORTS_FROM}"
            );
            // Nothing else in this process listens in that range, so it is still free.
            assert!(
                std::net::TcpListener::bind(("0.0.0.0", port)).is_ok(),
                "port {port} was picked but is not free"
            );
        }
    }
}
