//! This machine's CPUs: how many this process may use, which ones, and the CPU-list form
//! (`0-2,4`) that sysfs and numactl write.

use std::collections::BTreeSet;

/// A set of logical CPU numbers.
pub type Cpus = BTreeSet<usize>;

/// How many CPUs this process may run on (`--nproc-per-node=cpu`).
pub fn count() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The CPUs this process may run on.
pub fn current_affinity() -> Result<Cpus, String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// `0-2,4` for {0, 1, 2, 4}, as sysfs and numactl write CPU lists.
pub fn format_list(cpus: &Cpus) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(usize, usize)> = None;
    for &c in cpus {
        run = match run {
            Some((start, end)) if c == end + 1 => Some((start, c)),
            Some(done) => {
                out.push(range(done));
                Some((c, c))
            }
            None => Some((c, c)),
        };
    }
    out.extend(run.map(range));
    out.join(",")
}

fn range((start, end): (usize, usize)) -> String {
    match start == end {
        true => start.to_string(),
        false => format!("{start}-{end}"),
    }
}

/// A CPU list as sysfs writes it; `None` if it is not one.
pub fn parse_list(text: &str) -> Option<Cpus> {
    let mut cpus = Cpus::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse().ok()?),
            None => {
                cpus.insert(part.trim().parse().ok()?);
            }
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_as_sysfs_writes_them() {
        let cpus = parse_list("0-2,4,6-7\n").unwrap();
        assert_eq!(cpus, Cpus::from([0, 1, 2, 4, 6, 7]));
        assert_eq!(format_list(&cpus), "0-2,4,6-7");
        assert!(parse_list("0-x").is_none());
    }
}
