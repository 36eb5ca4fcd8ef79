//! `--numa-binding`: each worker runs on the CPUs near its accelerator, with torchrun 2.15's
//! four policies (torch/numa/binding.py).
//!
//! - Local rank i uses device i, as in torchrun. A device is a GPU as `accelerators` finds
//!   them on the PCI bus (NVIDIA or AMD, in PCI address order, which is CUDA's order for
//!   identical GPUs; workers also get `CUDA_DEVICE_ORDER=PCI_BUS_ID` unless it is set, so it
//!   is CUDA's for any). When the launcher has `CUDA_VISIBLE_DEVICES` (or
//!   `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`), device i is its entry i.
//! - The binding is the worker's CPU affinity, set between fork and exec. torchrun runs the
//!   worker under `numactl --physcpubind`, which does the same with one more program.
//! - Everything comes from sysfs (`sysfs`), under `RDZV_SYSFS_ROOT` when set (a test's made-up
//!   machine).
//! - As in torchrun, a binding that cannot be made (no GPU, a UUID in `CUDA_VISIBLE_DEVICES`,
//!   fewer cores than devices) fails the launch with the reason.

use super::accelerators::{self, visible_devices};
use super::cpus::{current_affinity, Cpus};
use super::sysfs::Sysfs;
use std::collections::BTreeMap;

/// torchrun's `--numa-binding` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The CPUs of the device's NUMA node.
    Node,
    /// The CPUs of every NUMA node of the device's socket.
    Socket,
    /// The device's share of its node's physical cores, none shared with another device.
    Exclusive,
    /// One group of cores sharing the last-level cache, on the device's node.
    CoreComplex,
}

impl Policy {
    /// The flag's values, torchrun's names.
    pub const NAMES: [&'static str; 4] = ["node", "socket", "exclusive", "core-complex"];
    const ALL: [Policy; 4] = [
        Policy::Node,
        Policy::Socket,
        Policy::Exclusive,
        Policy::CoreComplex,
    ];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn parse(name: &str) -> Option<Policy> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The CPUs of local ranks `0..n` under `policy`, on this machine, within this process's own
/// CPU affinity.
pub fn bindings(policy: Policy, n: u32) -> Result<Vec<Cpus>, String> {
    let machine = Machine::read(
        Sysfs::from_env(),
        current_affinity()?,
        accelerators::visible_gpus(),
    )?;
    (0..n as usize)
        .map(|i| machine.cpus_for(policy, i))
        .collect()
}

/// What the policies need of the machine.
struct Machine {
    sys: Sysfs,
    /// This process's CPUs: a binding never leaves them.
    allowed: Cpus,
    /// The NUMA node of each visible device, by device index.
    device_nodes: Vec<usize>,
}

impl Machine {
    /// `visible`: the launcher's visible-devices variable and its value, if it has one.
    fn read(sys: Sysfs, allowed: Cpus, visible: Option<(&str, String)>) -> Result<Machine, String> {
        let gpus = accelerators::gpus(&sys);
        if gpus.is_empty() {
            return Err(
                "no GPU on this machine's PCI bus (NVIDIA or AMD): nothing to bind to".into(),
            );
        }
        let visible = visible_devices(gpus.len(), visible)?;
        let device_nodes = visible
            .iter()
            .map(|&g| accelerators::numa_node(&sys, &gpus[g]))
            .collect::<Result<_, _>>()?;
        Ok(Machine {
            sys,
            allowed,
            device_nodes,
        })
    }

    fn cpus_for(&self, policy: Policy, device: usize) -> Result<Cpus, String> {
        let Some(&node) = self.device_nodes.get(device) else {
            return Err(format!(
                "local rank {device} has no device: {} visible",
                self.device_nodes.len()
            ));
        };
        let cpus = match policy {
            Policy::Node => self.node_cpus(node)?,
            Policy::Socket => self.socket_cpus(node)?,
            Policy::Exclusive => self.exclusive_cpus(node, device)?,
            Policy::CoreComplex => self.core_complex_cpus(node, device)?,
        };
        match cpus.is_empty() {
            true => Err(format!(
                "device {device}'s NUMA node {node} has none of this process's CPUs"
            )),
            false => Ok(cpus),
        }
    }

    /// The node's CPUs this process may use.
    fn node_cpus(&self, node: usize) -> Result<Cpus, String> {
        let all = self
            .sys
            .cpus(&format!("sys/devices/system/node/node{node}/cpulist"))?;
        Ok(all.intersection(&self.allowed).copied().collect())
    }

    fn package(&self, cpu: usize) -> Result<i64, String> {
        self.sys.number(&format!(
            "sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        ))
    }

    fn socket_cpus(&self, node: usize) -> Result<Cpus, String> {
        let Some(&first) = self.node_cpus(node)?.first() else {
            return Ok(Cpus::new());
        };
        let socket = self.package(first)?;
        let mut cpus = Cpus::new();
        for other in self.sys.cpus("sys/devices/system/node/possible")? {
            // A possible node need not be online (no directory): it has no CPUs.
            let theirs = self.node_cpus(other).unwrap_or_default();
            if let Some(&c) = theirs.first() {
                if self.package(c)? == socket {
                    cpus.extend(theirs);
                }
            }
        }
        Ok(cpus)
    }

    /// The devices on `node` and `device`'s position among them.
    fn position_on_node(&self, node: usize, device: usize) -> (usize, usize) {
        let on_node: Vec<usize> = (0..self.device_nodes.len())
            .filter(|&d| self.device_nodes[d] == node)
            .collect();
        let position = on_node.iter().position(|&d| d == device).unwrap_or(0);
        (position, on_node.len())
    }

    /// The node's CPUs in groups (`group_of` names a CPU's group), keyed and ordered by each
    /// group's smallest CPU.
    fn grouped(
        &self,
        node: usize,
        group_of: impl Fn(usize) -> Result<Cpus, String>,
    ) -> Result<BTreeMap<usize, Cpus>, String> {
        let mut groups: BTreeMap<usize, Cpus> = BTreeMap::new();
        for cpu in self.node_cpus(node)? {
            let key = group_of(cpu)?.first().copied().unwrap_or(cpu);
            groups.entry(key).or_default().insert(cpu);
        }
        Ok(groups)
    }

    fn exclusive_cpus(&self, node: usize, device: usize) -> Result<Cpus, String> {
        let cores = self.grouped(node, |cpu| {
            self.sys.cpus(&format!(
                "sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
            ))
        })?;
        if cores.is_empty() {
            return Ok(Cpus::new()); // none of the node's CPUs is this process's
        }
        let (position, devices) = self.position_on_node(node, device);
        let (each, extra) = (cores.len() / devices, cores.len() % devices);
        if each == 0 {
            return Err(format!(
                "NUMA node {node} has {} physical cores for {devices} devices",
                cores.len()
            ));
        }
        let start = position * each + position.min(extra);
        let count = each + usize::from(position < extra);
        Ok(cores
            .into_values()
            .skip(start)
            .take(count)
            .flatten()
            .collect())
    }

    fn core_complex_cpus(&self, node: usize, device: usize) -> Result<Cpus, String> {
        let mut complexes: Vec<(usize, Cpus)> = self
            .grouped(node, |cpu| self.last_level_cache(cpu))?
            .into_iter()
            .collect();
        // Fuller complexes first, then by their smallest CPU.
        complexes.sort_by_key(|(key, cpus)| (std::cmp::Reverse(cpus.len()), *key));
        if complexes.is_empty() {
            return Ok(Cpus::new()); // none of the node's CPUs is this process's
        }
        let (position, _) = self.position_on_node(node, device);
        Ok(complexes.swap_remove(position % complexes.len()).1)
    }

    /// The CPUs sharing `cpu`'s highest-level data or unified cache.
    fn last_level_cache(&self, cpu: usize) -> Result<Cpus, String> {
        let dir = format!("sys/devices/system/cpu/cpu{cpu}/cache");
        let mut best: Option<(i64, Cpus)> = None;
        for index in self
            .sys
            .entries(&dir)
            .into_iter()
            .filter(|e| e.starts_with("index"))
        {
            let kind = self.sys.read(&format!("{dir}/{index}/type"))?;
            if !matches!(kind.trim(), "Unified" | "Data") {
                continue;
            }
            let level = self.sys.number(&format!("{dir}/{index}/level"))?;
            if best.as_ref().is_none_or(|(l, _)| level > *l) {
                best = Some((
                    level,
                    self.sys.cpus(&format!("{dir}/{index}/shared_cpu_list"))?,
                ));
            }
        }
        best.map(|(_, cpus)| cpus)
            .ok_or_else(|| format!("{dir}: no data or unified cache"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cpus::format_list;
    use crate::host::sysfs::MadeUp;

    /// A made-up machine: `nodes` NUMA nodes of `cores` cores with 2 threads each (CPU c and
    /// c + total cores are siblings), one socket per two nodes, an L3 per 4 cores, and a GPU
    /// on each node listed in `gpus`.
    fn machine(nodes: usize, cores: usize, gpus: &[usize]) -> (Machine, MadeUp) {
        let tree = MadeUp::new("numa");
        let write = |path: &str, text: &str| tree.write(path, text);
        let total = nodes * cores;
        for n in 0..nodes {
            let own: Cpus = (n * cores..(n + 1) * cores)
                .flat_map(|c| [c, c + total])
                .collect();
            write(
                &format!("sys/devices/system/node/node{n}/cpulist"),
                &format_list(&own),
            );
        }
        // One more node possible than present, as on machines with room for more.
        write("sys/devices/system/node/possible", &format!("0-{nodes}"));
        for c in 0..total {
            let node = c / cores;
            for cpu in [c, c + total] {
                let base = format!("sys/devices/system/cpu/cpu{cpu}");
                write(
                    &format!("{base}/topology/thread_siblings_list"),
                    &format!("{c},{}", c + total),
                );
                write(
                    &format!("{base}/topology/physical_package_id"),
                    &(node / 2).to_string(),
                );
                let l3 = c / 4 * 4;
                let shared: Cpus = (l3..(l3 + 4).min((node + 1) * cores))
                    .flat_map(|x| [x, x + total])
                    .collect();
                write(&format!("{base}/cache/index0/type"), "Instruction\n");
                write(&format!("{base}/cache/index0/level"), "1\n");
                write(
                    &format!("{base}/cache/index0/shared_cpu_list"),
                    &format!("{cpu}"),
                );
                write(&format!("{base}/cache/index3/type"), "Unified\n");
                write(&format!("{base}/cache/index3/level"), "3\n");
                write(
                    &format!("{base}/cache/index3/shared_cpu_list"),
                    &format_list(&shared),
                );
            }
        }
        // A network card first: not a GPU.
        write("sys/bus/pci/devices/0000:00:01.0/vendor", "0x15b3\n");
        write("sys/bus/pci/devices/0000:00:01.0/class", "0x020000\n");
        for (i, node) in gpus.iter().enumerate() {
            let dev = format!("sys/bus/pci/devices/0000:{:02x}:00.0", 0x10 + i);
            write(&format!("{dev}/vendor"), "0x10de\n");
            write(&format!("{dev}/class"), "0x030200\n");
            write(&format!("{dev}/numa_node"), &format!("{node}\n"));
        }
        let allowed: Cpus = (0..2 * total).collect();
        let m = Machine::read(tree.sysfs(), allowed, None).unwrap();
        (m, tree)
    }

    fn list(m: &Machine, policy: Policy, device: usize) -> String {
        format_list(&m.cpus_for(policy, device).unwrap())
    }

    #[test]
    fn each_policy_binds_as_torchrun_does() {
        // 4 nodes of 8 cores (64 CPUs), two sockets, two GPUs on node 0 and one on node 3.
        let (m, _tree) = machine(4, 8, &[0, 0, 3]);
        assert_eq!(list(&m, Policy::Node, 0), "0-7,32-39");
        assert_eq!(list(&m, Policy::Node, 2), "24-31,56-63");
        assert_eq!(list(&m, Policy::Socket, 0), "0-15,32-47");
        assert_eq!(list(&m, Policy::Socket, 2), "16-31,48-63");
        // Node 0's 8 cores split between its two GPUs, hyperthreads with their cores.
        assert_eq!(list(&m, Policy::Exclusive, 0), "0-3,32-35");
        assert_eq!(list(&m, Policy::Exclusive, 1), "4-7,36-39");
        assert_eq!(list(&m, Policy::Exclusive, 2), "24-31,56-63");
        // Two L3 complexes of 4 cores on node 0: one each.
        assert_eq!(list(&m, Policy::CoreComplex, 0), "0-3,32-35");
        assert_eq!(list(&m, Policy::CoreComplex, 1), "4-7,36-39");
        let err = m.cpus_for(Policy::Node, 3).unwrap_err();
        assert!(
            err.contains("local rank 3 has no device: 3 visible"),
            "{err}"
        );
    }

    #[test]
    fn a_node_without_any_of_this_process_cpus_is_an_error_under_every_policy() {
        let (mut m, _tree) = machine(2, 4, &[0, 1]);
        m.allowed = (4..8).chain(12..16).collect(); // node 1's only
        for policy in Policy::ALL {
            let err = m.cpus_for(policy, 0).unwrap_err();
            assert!(
                err.contains("NUMA node 0 has none of this process's CPUs"),
                "{policy:?}: {err}"
            );
        }
        assert_eq!(list(&m, Policy::Node, 1), "4-7,12-15");
    }

    #[test]
    fn policies_read_back_from_their_names() {
        for name in Policy::NAMES {
            assert_eq!(Policy::parse(name).map(Policy::name), Some(name));
        }
        assert_eq!(Policy::parse("nodes"), None);
    }

    #[test]
    fn exclusive_gives_the_first_devices_one_more_core_and_fails_without_a_core_each() {
        let (m, _tree) = machine(1, 5, &[0, 0]);
        assert_eq!(list(&m, Policy::Exclusive, 0), "0-2,5-7");
        assert_eq!(list(&m, Policy::Exclusive, 1), "3-4,8-9");
        let (m, _tree) = machine(1, 1, &[0, 0]);
        let err = m.cpus_for(Policy::Exclusive, 0).unwrap_err();
        assert!(err.contains("1 physical cores for 2 devices"), "{err}");
    }
}
