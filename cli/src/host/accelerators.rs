//! This machine's accelerators, read from the PCI bus in sysfs without loading any GPU
//! library: one probe for everything that asks, `--nproc-per-node=gpu|xpu|auto` (how many)
//! and `--numa-binding` (which one, on which NUMA node).
//!
//! - A GPU is an NVIDIA (PCI vendor 0x10de) or AMD (0x1002) display controller (class
//!   0x03xxxx), in PCI address order: CUDA's order for identical GPUs (and for any under
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which the binding sets), and ROCm's.
//! - An NVIDIA GPU counts only while NVIDIA's driver has a device node for it (`/dev/nvidiaN`,
//!   as many as there are): a container sees every GPU of its host on the bus but gets the
//!   nodes of its own only, and a machine without the driver has none, which is what CUDA sees.
//! - An XPU is an Intel (0x8086) display controller that Level Zero, torch's XPU runtime,
//!   drives as a card of its own: bound to the `xe` or `i915` driver (without it Level Zero
//!   sees nothing) and not the integrated GPU, which Intel places at 0000:00:02.0 on every
//!   machine (a discrete or data-center card sits behind a PCIe port, on a bus of its own).
//!   torch would also count an integrated GPU its driver supports; one worker per card is what
//!   a training job asks for. A card of two tiles counts once: under Level Zero's FLAT
//!   hierarchy torch counts each tile, so give the count or `ZE_AFFINITY_MASK` there.
//! - The launcher's visible-devices variables narrow the count as the runtimes do:
//!   `CUDA_VISIBLE_DEVICES` (or `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`, the first set)
//!   for GPUs, `ZE_AFFINITY_MASK` for XPUs. For a binding, device i is entry i of the list.

use super::sysfs::Sysfs;

const PCI_DEVICES: &str = "sys/bus/pci/devices";
const NVIDIA: &str = "0x10de";
const AMD: &str = "0x1002";
const INTEL: &str = "0x8086";
/// Where Intel's integrated graphics always are.
const INTEL_INTEGRATED: &str = "0000:00:02.0";
/// The drivers through which Level Zero reaches an Intel GPU.
const LEVEL_ZERO_DRIVERS: [&str; 2] = ["xe", "i915"];
/// The variables that narrow the GPUs a process sees, the first set wins.
const GPU_VISIBLE: [&str; 3] = [
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
];

/// A display controller on the PCI bus.
pub struct PciGpu {
    /// Its PCI address (`0000:17:00.0`), the name of its directory in sysfs.
    pub address: String,
    vendor: String,
}

/// The display controllers (class 0x03xxxx) on the bus, in PCI address order.
fn display_controllers(sys: &Sysfs) -> Vec<PciGpu> {
    sys.entries(PCI_DEVICES)
        .into_iter()
        .filter_map(|address| {
            let file = |name: &str| {
                sys.read(&format!("{PCI_DEVICES}/{address}/{name}"))
                    .unwrap_or_default()
            };
            let vendor = file("vendor").trim().to_string();
            file("class")
                .trim()
                .starts_with("0x03")
                .then_some(PciGpu { address, vendor })
        })
        .collect()
}

/// The NVIDIA and AMD GPUs on the bus, in PCI address order.
pub fn gpus(sys: &Sysfs) -> Vec<PciGpu> {
    display_controllers(sys)
        .into_iter()
        .filter(|d| d.vendor == NVIDIA || d.vendor == AMD)
        .collect()
}

/// The Intel GPUs Level Zero drives as cards of their own, in PCI address order.
pub fn xpus(sys: &Sysfs) -> Vec<PciGpu> {
    display_controllers(sys)
        .into_iter()
        .filter(|d| d.vendor == INTEL && d.address != INTEL_INTEGRATED)
        .filter(|d| {
            sys.link_name(&format!("{PCI_DEVICES}/{}/driver", d.address))
                .is_some_and(|driver| LEVEL_ZERO_DRIVERS.contains(&driver.as_str()))
        })
        .collect()
}

/// The NUMA node of a device on the bus (0 on a machine of one node, where sysfs says -1).
pub fn numa_node(sys: &Sysfs, device: &PciGpu) -> Result<usize, String> {
    sys.number(&format!("{PCI_DEVICES}/{}/numa_node", device.address))
        .map(|n| n.max(0) as usize)
}

/// The GPUs this process may use (`--nproc-per-node=gpu`).
pub fn gpu_count() -> u32 {
    count_gpus(&Sysfs::from_env(), visible_gpus()) as u32
}

/// The XPUs this process may use (`--nproc-per-node=xpu`).
pub fn xpu_count() -> u32 {
    let mask = std::env::var("ZE_AFFINITY_MASK").ok();
    count_xpus(&Sysfs::from_env(), mask.as_deref()) as u32
}

fn count_gpus(sys: &Sysfs, listed: Option<(&str, String)>) -> usize {
    let on_bus = gpus(sys);
    let nvidia = on_bus.iter().filter(|g| g.vendor == NVIDIA).count();
    let present = nvidia.min(nvidia_device_nodes(sys)) + (on_bus.len() - nvidia);
    let Some((_, list)) = listed else {
        return present;
    };
    // As CUDA reads it: entries up to the first index that names no device; a UUID (or a MIG
    // name) is one device the driver resolves.
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .take_while(|e| {
            e.parse::<i64>()
                .map_or(true, |i| (0..present as i64).contains(&i))
        })
        .count()
        .min(present)
}

/// NVIDIA's device nodes, `/dev/nvidia0`, `/dev/nvidia1`, ... (not `nvidiactl` and the like).
fn nvidia_device_nodes(sys: &Sysfs) -> usize {
    sys.entries("dev")
        .iter()
        .filter(|name| {
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count()
}

/// `ZE_AFFINITY_MASK` keeps the cards (`1`) or tiles (`1.0`) it lists, of those present;
/// Level Zero skips an entry that names none.
fn count_xpus(sys: &Sysfs, mask: Option<&str>) -> usize {
    let present = xpus(sys).len();
    let Some(mask) = mask.filter(|m| !m.trim().is_empty()) else {
        return present;
    };
    mask.split(',')
        .map(str::trim)
        .filter(|e| {
            let card = e.split('.').next().unwrap_or("");
            card.parse::<usize>().is_ok_and(|c| c < present)
        })
        .count()
}

/// The launcher's visible-devices variable for GPUs and its value, if it has one.
pub fn visible_gpus() -> Option<(&'static str, String)> {
    GPU_VISIBLE
        .into_iter()
        .find_map(|name| std::env::var(name).ok().map(|v| (name, v)))
}

/// The GPU on the bus of each device index, for a binding: the visible-devices list, else
/// all of them. A UUID cannot be matched to a PCI address without the driver's library.
pub fn visible_devices(gpus: usize, listed: Option<(&str, String)>) -> Result<Vec<usize>, String> {
    let Some((name, list)) = listed else {
        return Ok((0..gpus).collect());
    };
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| match entry.parse::<usize>() {
            Ok(g) if g < gpus => Ok(g),
            Ok(g) => Err(format!("{name} names GPU {g}, but the PCI bus has {gpus}")),
            Err(_) => Err(format!(
                "{name}={list}: devices are matched by index; {entry:?} is not one (UUIDs need the \
                 GPU driver's library, which rdzv does not load)"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::sysfs::MadeUp;

    /// A made-up machine's bus: (address, vendor, class, driver) per device, and `nodes`
    /// NVIDIA device nodes in /dev.
    fn machine(devices: &[(&str, &str, &str, &str)], nodes: usize) -> MadeUp {
        let tree = MadeUp::new("accelerators");
        for (address, vendor, class, driver) in devices {
            let dev = format!("{PCI_DEVICES}/{address}");
            tree.write(&format!("{dev}/vendor"), &format!("{vendor}\n"));
            tree.write(&format!("{dev}/class"), &format!("{class}\n"));
            if !driver.is_empty() {
                tree.link(
                    &format!("{dev}/driver"),
                    &format!("sys/bus/pci/drivers/{driver}"),
                );
            }
        }
        tree.write("dev/nvidiactl", "");
        tree.write("dev/nvidia-uvm", "");
        for n in 0..nodes {
            tree.write(&format!("dev/nvidia{n}"), "");
        }
        tree
    }

    /// A workstation: Intel's integrated GPU, a network card, two NVIDIA GPUs, one AMD GPU
    /// and an Intel discrete card (Arc, a VGA controller) and a data-center card (Max, a
    /// display controller), each bound to a Level Zero driver, and an Intel card with none.
    const WORKSTATION: [(&str, &str, &str, &str); 8] = [
        ("0000:00:02.0", INTEL, "0x030000", "i915"),
        ("0000:05:00.0", "0x15b3", "0x020000", "mlx5_core"),
        ("0000:17:00.0", NVIDIA, "0x030200", "nvidia"),
        ("0000:18:00.0", AMD, "0x038000", "amdgpu"),
        ("0000:3a:00.0", INTEL, "0x030000", "xe"),
        ("0000:4b:00.0", INTEL, "0x038000", "i915"),
        ("0000:5c:00.0", INTEL, "0x038000", ""),
        ("0000:c3:00.0", NVIDIA, "0x030200", "nvidia"),
    ];

    #[test]
    fn gpus_are_nvidia_and_amd_display_controllers_in_pci_order() {
        let tree = machine(&WORKSTATION, 2);
        let sys = tree.sysfs();
        let found: Vec<String> = gpus(&sys).into_iter().map(|g| g.address).collect();
        assert_eq!(found, ["0000:17:00.0", "0000:18:00.0", "0000:c3:00.0"]);
        assert_eq!(count_gpus(&sys, None), 3);
        let list = |v: &str| Some(("CUDA_VISIBLE_DEVICES", v.to_string()));
        assert_eq!(count_gpus(&sys, list("2,0")), 2);
        assert_eq!(count_gpus(&sys, list("")), 0);
        // CUDA stops at the first index that names no device; a UUID is one device.
        assert_eq!(count_gpus(&sys, list("1,7,0")), 1);
        assert_eq!(count_gpus(&sys, list("GPU-8f2c,0")), 2);
    }

    #[test]
    fn nvidia_gpus_count_only_with_their_device_nodes() {
        // A container given one of its host's two NVIDIA GPUs, and a machine without the driver.
        let tree = machine(&WORKSTATION, 1);
        let sys = tree.sysfs();
        assert_eq!(count_gpus(&sys, None), 2, "one NVIDIA, one AMD");
        let tree = machine(&WORKSTATION, 0);
        let sys = tree.sysfs();
        assert_eq!(count_gpus(&sys, None), 1, "the AMD GPU only");
        assert_eq!(gpus(&sys).len(), 3, "a binding still sees the bus");
    }

    #[test]
    fn xpus_are_intel_cards_level_zero_drives_not_the_integrated_gpu() {
        let tree = machine(&WORKSTATION, 2);
        let sys = tree.sysfs();
        let found: Vec<String> = xpus(&sys).into_iter().map(|g| g.address).collect();
        assert_eq!(found, ["0000:3a:00.0", "0000:4b:00.0"]);
        assert_eq!(count_xpus(&sys, None), 2);
        assert_eq!(count_xpus(&sys, Some("1")), 1);
        assert_eq!(count_xpus(&sys, Some("0.0,0.1")), 2, "two tiles of card 0");
        assert_eq!(count_xpus(&sys, Some("0,5")), 1, "no card 5");
        assert_eq!(count_xpus(&sys, Some("")), 2);
        // A laptop: the integrated GPU alone is no XPU.
        let tree = machine(&WORKSTATION[..2], 0);
        let sys = tree.sysfs();
        assert_eq!(count_xpus(&sys, None), 0);
        assert_eq!(count_gpus(&sys, None), 0);
    }

    #[test]
    fn visible_devices_pick_the_gpus_by_index() {
        assert_eq!(visible_devices(4, None).unwrap(), [0, 1, 2, 3]);
        let list = |v: &str| Some(("CUDA_VISIBLE_DEVICES", v.to_string()));
        assert_eq!(visible_devices(4, list("3,1")).unwrap(), [3, 1]);
        let err = visible_devices(4, list("4")).unwrap_err();
        assert!(err.contains("names GPU 4, but the PCI bus has 4"), "{err}");
        let err = visible_devices(4, list("GPU-8f2c")).unwrap_err();
        assert!(err.contains("\"GPU-8f2c\" is not one"), "{err}");
    }
}
