//! The machine's accelerators, on a made-up one (`RDZV_SYSFS_ROOT`): `--nproc-per-node=gpu`,
//! `auto` and `xpu`, `--virtual-local-rank`, and `--numa-binding`.

use crate::support::{num, rdzv_env, Scratch, WorkerLines};

/// `--nproc-per-node=gpu`, `auto` and `xpu` count what a made-up machine has
/// (RDZV_SYSFS_ROOT): two NVIDIA GPUs with their device nodes and an AMD one make three GPU
/// workers (`CUDA_VISIBLE_DEVICES` narrows them), `auto` takes the GPUs, and `xpu` counts the
/// Intel card Level Zero drives, not the integrated GPU; a machine without one is told so.
#[test]
fn nproc_per_node_counts_the_machines_accelerators() {
    let s = Scratch::new();
    let w = s.worker();
    let made_up = |name: &str, devices: &[(&str, &str, Option<&str>)], nvidia_nodes: usize| {
        let root = s.path(name);
        for (dev, vendor, driver) in devices {
            let base = root.join("sys/bus/pci/devices").join(dev);
            std::fs::create_dir_all(&base).unwrap();
            std::fs::write(base.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(base.join("class"), "0x030000\n").unwrap();
            if let Some(driver) = driver {
                let target = root.join("sys/bus/pci/drivers").join(driver);
                std::fs::create_dir_all(&target).unwrap();
                std::os::unix::fs::symlink(&target, base.join("driver")).unwrap();
            }
        }
        std::fs::create_dir_all(root.join("dev")).unwrap();
        for i in 0..nvidia_nodes {
            std::fs::write(root.join(format!("dev/nvidia{i}")), "").unwrap();
        }
        std::fs::write(root.join("dev/nvidiactl"), "").unwrap();
        root.display().to_string()
    };
    let gpus = made_up(
        "gpus",
        &[
            ("0000:00:02.0", "0x8086", Some("i915")), // integrated graphics
            ("0000:17:00.0", "0x10de", None),
            ("0000:65:00.0", "0x10de", None),
            ("0000:c3:00.0", "0x1002", None),
        ],
        2,
    );
    let xpu = made_up(
        "xpu",
        &[
            ("0000:00:02.0", "0x8086", Some("i915")),
            ("0000:3a:00.0", "0x8086", Some("xe")),
        ],
        0,
    );
    // The workers a standalone launcher starts on the machine at `root`, or what it said when
    // it failed.
    let workers = |nproc: &str, root: &str, extra: &[(&str, &str)]| -> Result<usize, String> {
        let env = [&[("RDZV_SYSFS_ROOT", root)], extra].concat();
        let mut l = rdzv_env(&["run", "--standalone", nproc, &w, "ok"], &env);
        match l.exit(30).code() {
            Some(0) => Ok(l.lines_with("START rank=").count()),
            _ => Err(l.output()),
        }
    };
    assert_eq!(workers("--nproc-per-node=gpu", &gpus, &[]), Ok(3));
    assert_eq!(workers("--nproc-per-node=auto", &gpus, &[]), Ok(3));
    let one = [("CUDA_VISIBLE_DEVICES", "1")];
    assert_eq!(workers("--nproc-per-node=gpu", &gpus, &one), Ok(1));
    assert_eq!(workers("--nproc-per-node=xpu", &xpu, &[]), Ok(1));
    let none = workers("--nproc-per-node=xpu", &gpus, &[]).unwrap_err();
    assert!(none.to_lowercase().contains("xpu"), "{none}");
}

#[test]
fn virtual_local_rank_gives_each_worker_local_rank_0_and_its_own_device() {
    let s = Scratch::new();
    let w = s.worker();
    let mut l = rdzv_env(
        &[
            "run",
            "--standalone",
            "--nproc-per-node=2",
            "--virtual-local-rank",
            &w,
            "ok",
        ],
        &[("CUDA_VISIBLE_DEVICES", "5,7")],
    );
    let mut starts: Vec<_> = (0..2).map(|_| l.start(30)).collect();
    l.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    assert_eq!(
        (num(&starts[0], "local"), starts[0]["cuda"].as_str()),
        (0, "5")
    );
    assert_eq!(
        (num(&starts[1], "local"), starts[1]["cuda"].as_str()),
        (0, "7")
    );
    // Without the flag: local ranks as usual, the launcher's devices untouched.
    let mut plain = rdzv_env(
        &["run", "--standalone", "--nproc-per-node=2", &w, "ok"],
        &[("CUDA_VISIBLE_DEVICES", "5,7")],
    );
    let mut starts: Vec<_> = (0..2).map(|_| plain.start(30)).collect();
    plain.exits_with(0, 30);
    starts.sort_by_key(|f| num(f, "rank"));
    assert_eq!(
        (num(&starts[1], "local"), starts[1]["cuda"].as_str()),
        (1, "5,7")
    );
}

/// `--numa-binding` on a made-up machine (`RDZV_SYSFS_ROOT`): two NUMA nodes, one of this
/// test's CPUs each, a GPU on each (and a network card). CUDA_VISIBLE_DEVICES=1,0 makes local
/// rank 0 use the second GPU in PCI order. Each worker must run on its GPU's node's CPU. A
/// machine without a GPU fails the launch, as torchrun does.
#[test]
fn numa_binding_runs_each_worker_on_the_cpus_of_its_gpus_node() {
    let s = Scratch::new();
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) },
        0
    );
    let mine: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    // Two CPUs on CI's machines; with one, both nodes have it.
    let (cpu0, cpu1) = (mine[0], *mine.last().unwrap());
    let root = s.path("sysfs");
    let write = |path: &str, text: &str| {
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
    };
    write("sys/devices/system/node/possible", "0-1\n");
    write(
        "sys/devices/system/node/node0/cpulist",
        &format!("{cpu0}\n"),
    );
    write(
        "sys/devices/system/node/node1/cpulist",
        &format!("{cpu1}\n"),
    );
    for (dev, vendor, class, node) in [
        ("0000:05:00.0", "0x15b3", "0x020000", "0"), // a network card
        ("0000:17:00.0", "0x10de", "0x030200", "0"),
        ("0000:c3:00.0", "0x10de", "0x030200", "1"),
    ] {
        let base = format!("sys/bus/pci/devices/{dev}");
        write(&format!("{base}/vendor"), vendor);
        write(&format!("{base}/class"), class);
        write(&format!("{base}/numa_node"), node);
    }
    let w = s.worker();
    let sysfs = root.to_str().unwrap();
    let args = [
        "run",
        "--standalone",
        "--nproc-per-node=2",
        "--numa-binding=node",
        &w,
        "cpus",
    ];
    let env = [("RDZV_SYSFS_ROOT", sysfs), ("CUDA_VISIBLE_DEVICES", "1,0")];
    let mut l = rdzv_env(&args, &env);
    l.exits_with(0, 30);
    for (local, cpu) in [(0, cpu1), (1, cpu0)] {
        let line = format!("CPUS local={local} allowed={cpu} order=PCI_BUS_ID");
        assert!(
            l.lines_with(&line).any(|x| x == line),
            "no {line:?}: {}",
            l.output()
        );
    }
    assert!(
        l.said(&format!(
            "--numa-binding=node: local rank 0 on CPUs {cpu1}, local rank 1 on CPUs {cpu0}"
        )),
        "{}",
        l.output()
    );

    // No GPU: the launch fails with the reason, before any worker starts.
    let empty = s.path("no-gpu");
    std::fs::create_dir_all(&empty).unwrap();
    let env = [("RDZV_SYSFS_ROOT", empty.to_str().unwrap())];
    let mut none = rdzv_env(&args, &env);
    none.exits_with(1, 10);
    assert!(
        none.said("--numa-binding=node: no GPU on this machine's PCI bus"),
        "{}",
        none.output()
    );
    assert!(!none.said("CPUS local="), "{}", none.output());
}
