//! The test harness itself: what a test starts ends with the test process, even when that
//! process is killed (a watchdog, a CI timeout) and runs no destructor. Four etcd servers
//! were once found orphaned after such runs; network namespaces left by such runs once made a
//! later chaos run fail (their /30s were given out again).

use crate::common;

use common::netns::block_network;
use common::{Etcd, NetNs, SpawnTied};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Set in the copy of this test binary that plays the killed test.
const ROLE: &str = "RDZV_HARNESS_TEST_ROLE";

/// Waits at most `timeout` for process `pid` (not our child) to exit.
fn wait_for_exit(pid: u32, timeout: Duration) -> bool {
    // SAFETY: plain system calls on a descriptor we own.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) as libc::c_int;
        if fd < 0 {
            return true; // already gone (and reaped)
        }
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut poll, 1, timeout.as_millis() as libc::c_int);
        libc::close(fd);
        ready == 1
    }
}

/// Starts a copy of this test binary that runs only `test` in the role of the test process to
/// be killed; returns it with the first line it prints that starts with one of `prefixes`.
fn start_the_killed_copy(test: &str, prefixes: &[&str]) -> (std::process::Child, String) {
    // libtest names a test by its path below the crate: this module's, then the function.
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_crate, path)| path);
    let mut copy = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &format!("{module}::{test}"), "--nocapture"])
        .env(ROLE, "killed")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn_tied()
        .unwrap();
    let said = BufReader::new(copy.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .unwrap_or_else(|| panic!("the test process said none of {prefixes:?}"));
    (copy, said)
}

/// In the copy: waits to be killed (or for the test's end, which closes stdin).
fn wait_to_be_killed() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn etcd_dies_with_a_killed_test_process() {
    if std::env::var_os(ROLE).is_some() {
        // The killed test: starts etcd from a test thread that ends before the kill, says
        // its pid, then waits to be killed.
        let etcd = std::thread::spawn(Etcd::start).join().unwrap();
        println!("etcd-pid {} {}", etcd.pid(), etcd.data_dir.display());
        return wait_to_be_killed();
    }
    let (mut test, said) =
        start_the_killed_copy("etcd_dies_with_a_killed_test_process", &["etcd-pid "]);
    let (etcd_pid, data_dir) = said["etcd-pid ".len()..].split_once(' ').unwrap();
    let (etcd_pid, data_dir): (u32, &Path) = (etcd_pid.parse().unwrap(), Path::new(data_dir));
    assert!(data_dir.exists(), "no {}", data_dir.display());
    test.kill().unwrap(); // SIGKILL: no destructor runs
    test.wait().unwrap();
    assert!(
        wait_for_exit(etcd_pid, Duration::from_secs(10)),
        "etcd (pid {etcd_pid}) outlived the killed test process"
    );

    // Its data directory outlives it (no destructor ran); the next etcd a test starts, in any
    // test process, removes it.
    let _etcd = Etcd::start();
    assert!(
        !data_dir.exists(),
        "the data directory of the killed test's etcd is still there: {}",
        data_dir.display()
    );
}

/// Starts the `etcd-test-server` program (the other languages' test etcd); returns it, its
/// stdin and stdout, and the fields of its ready line: endpoint, etcd's pid, data directory.
fn start_the_program() -> (
    std::process::Child,
    std::process::ChildStdin,
    impl BufRead,
    [String; 3],
) {
    start_the_program_in(&std::env::temp_dir())
}

/// `start_the_program` with `tmp` as the program's temporary directory.
fn start_the_program_in(
    tmp: &Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    impl BufRead,
    [String; 3],
) {
    let mut server = Command::new(env!("CARGO_BIN_EXE_etcd-test-server"))
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn_tied()
        .unwrap();
    let stdin = server.stdin.take().unwrap();
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let fields: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    assert_eq!(
        fields.len(),
        4,
        "not `ENDPOINT PID DATADIR VERSION`: {line:?}"
    );
    let [endpoint, pid, dir, _] = <[String; 4]>::try_from(fields).unwrap();
    (server, stdin, stdout, [endpoint, pid, dir])
}

#[test]
fn the_program_ends_etcd_and_its_data_at_the_end_of_its_input() {
    let (mut server, mut stdin, mut stdout, [endpoint, pid, dir]) = start_the_program();
    let etcd_pid: u32 = pid.parse().unwrap();
    assert!(
        TcpListener::bind(&endpoint).is_err(),
        "nothing serves {endpoint}"
    );
    assert!(Path::new(&dir).exists(), "no {dir}");

    // restart: the same ports and data, another process.
    writeln!(stdin, "restart").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let again: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((again[0], again[2]), (endpoint.as_str(), dir.as_str()));
    assert!(
        wait_for_exit(etcd_pid, Duration::from_secs(10)),
        "the old etcd still runs"
    );
    let etcd_pid: u32 = again[1].parse().unwrap();
    assert_ne!(again[1], pid);

    writeln!(stdin, "no such command").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("error "), "{line:?}");

    drop(stdin); // as the end of a test process closes it
    assert!(server.wait().unwrap().success());
    assert!(
        wait_for_exit(etcd_pid, Duration::from_secs(10)),
        "etcd outlived the program"
    );
    assert!(!Path::new(&dir).exists(), "{dir} outlived the program");
}

/// The program answers a SIGSTOP once etcd is frozen, not once the signal is sent: kill()
/// returns before every thread has stopped, and the Go binding's frozen-etcd test once had a
/// request answered in between (the program answered at once then: 46 of 200 answers here
/// came before every thread was stopped).
#[test]
fn the_programs_sigstop_is_answered_once_every_thread_of_etcd_is_stopped() {
    let (_server, mut stdin, mut stdout, [_, pid, _]) = start_the_program();
    let etcd_pid: u32 = pid.parse().unwrap();
    let mut ask = |command: &str| {
        writeln!(stdin, "{command}").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok", "{command}");
    };
    for round in 0..100 {
        ask(&format!("signal {}", libc::SIGSTOP));
        assert!(
            common::all_threads_stopped(etcd_pid),
            "round {round}: the program said ok to SIGSTOP while a thread of etcd still ran"
        );
        ask(&format!("signal {}", libc::SIGCONT));
    }
}

#[test]
fn a_killed_programs_etcd_dies_and_its_data_goes_at_the_next_start() {
    // A temporary directory of its own: every etcd any test process starts (other suites run
    // beside this one) removes the dead processes' directories it finds, and one once removed
    // this one between the kill and the check below.
    let tmp = std::env::temp_dir().join(format!("rdzv-harness-own-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (mut server, _stdin, _stdout, [_, pid, dir]) = start_the_program_in(&tmp);
    server.kill().unwrap(); // SIGKILL: no destructor runs
    server.wait().unwrap();
    let etcd_pid: u32 = pid.parse().unwrap();
    assert!(
        wait_for_exit(etcd_pid, Duration::from_secs(10)),
        "etcd (pid {etcd_pid}) outlived the killed program"
    );
    assert!(
        Path::new(&dir).exists(),
        "{dir} is gone before any start removed it"
    );
    let next = start_the_program_in(&tmp);
    assert!(!Path::new(&dir).exists(), "{dir} outlived the next start");
    drop(next);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The network namespaces the machine has, by name.
fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// True if an interface on this machine holds `address`.
fn address_held(address: &str) -> bool {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .any(|w| w.split('/').next() == Some(address))
}

fn skip(test: &str, why: &str) {
    // Straight to stderr, past libtest's capture, so the skip shows in every run.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

#[test]
fn a_namespace_left_by_a_killed_test_process_is_removed_by_the_next_one() {
    const TEST: &str = "a_namespace_left_by_a_killed_test_process_is_removed_by_the_next_one";
    if std::env::var_os(ROLE).is_some() {
        // The killed test: creates a namespace, says which, then waits to be killed.
        let ns = NetNs::create();
        match &ns {
            Ok(ns) => println!("netns {} {}", ns.name, ns.host_addr),
            Err(why) => println!("skip cannot create a network namespace here ({why})"),
        }
        return wait_to_be_killed();
    }
    let (mut test, said) = start_the_killed_copy(TEST, &["netns ", "skip "]);
    let (name, host_addr) = match said.strip_prefix("netns ") {
        Some(created) => created.split_once(' ').unwrap(),
        None => {
            let _ = test.kill();
            let _ = test.wait();
            return skip(TEST, &said["skip ".len()..]);
        }
    };
    assert!(
        namespaces().iter().any(|n| n == name) && address_held(host_addr),
        "the namespace {name} ({host_addr}) the other process made is not there"
    );
    test.kill().unwrap(); // SIGKILL: no destructor runs
    test.wait().unwrap();

    // (Another test of this binary creating a namespace now may remove it first: either way
    // it must be gone once this process has created one.)
    let _ns = NetNs::create().expect("a namespace here, as in the killed process");
    assert!(
        !namespaces().iter().any(|n| n == name),
        "namespace {name} of a dead process is still there"
    );
    assert!(
        !address_held(host_addr),
        "the veth of a dead process still holds {host_addr}"
    );
}

/// A veth pair, deleted on drop.
struct Veth(String);

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

#[test]
fn a_namespace_skips_a_30_that_an_interface_on_the_machine_already_holds() {
    const TEST: &str = "a_namespace_skips_a_30_that_an_interface_on_the_machine_already_holds";
    // A /30 of 10.213.0.0/16 on an interface of the host, as a namespace of another process
    // would hold it; the namespace's search for a /30 starts there.
    let block = std::process::id() % 16384;
    let taken = Ipv4Addr::from(block_network(block) + 1).to_string();
    // Named like the veth of a namespace of this process: removed as a leftover if this test
    // is killed.
    let pid = std::process::id() % 10_000_000;
    let veth = Veth(format!("rz{pid}h9999"));
    let peer = format!("rz{pid}n9999");
    let add = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !add(&[
        "link", "add", &veth.0, "type", "veth", "peer", "name", &peer,
    ]) || !add(&["addr", "add", &format!("{taken}/30"), "dev", &veth.0])
        || !add(&["link", "set", &veth.0, "up"])
    {
        return skip(TEST, "cannot add a veth pair here");
    }

    let ns = match NetNs::create_from(block) {
        Ok(ns) => ns,
        Err(why) => {
            return skip(
                TEST,
                &format!("cannot create a network namespace here ({why})"),
            )
        }
    };
    assert_ne!(ns.host_addr, taken, "the namespace took a /30 already held");
    // Packets from inside reach the host and the answers come back: a TCP connection from the
    // namespace to a listener on the host side completes (bounded: a lost SYN-ACK would be
    // retried for two minutes).
    let listener = TcpListener::bind((ns.host_addr.as_str(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let connected = ns
        .command("timeout")
        .args(["10", "bash", "-c", "exec 3<>/dev/tcp/$0/$1"])
        .args([&ns.host_addr, &port])
        .status()
        .unwrap();
    assert!(
        connected.success(),
        "no TCP connection from the namespace to {}:{port} ({connected})",
        ns.host_addr
    );
}

/// A test's etcd keeps its ports claimed while it is down, since it starts again on them: no
/// other test process picks them meanwhile (the admin watch test on a killed etcd once failed
/// in CI, beside three other suites starting etcd servers, in a way that fits its restart
/// finding a port taken). The claims go with the `Etcd`.
#[test]
fn an_etcd_keeps_its_ports_claimed_while_it_is_down() {
    let mut etcd = Etcd::start();
    let ports = [etcd.client_port, etcd.peer_port];
    etcd.kill();
    for port in ports {
        assert_eq!(common::port_claimer(port), Some(std::process::id()));
        assert!(!common::claim_port(port), "port {port} claimed twice");
    }
    let picked: Vec<u16> = (0..500).map(|_| common::free_port()).collect();
    for port in &picked {
        common::release_port(*port);
    }
    assert!(
        !picked.iter().any(|p| ports.contains(p)),
        "a pick took a port of the etcd that is down"
    );
    etcd.restart();
    drop(etcd);
    for port in ports {
        assert_eq!(
            common::port_claimer(port),
            None,
            "port {port} still claimed"
        );
    }
}

/// A claim whose process is gone (a test process killed, which ran no destructor) is taken.
#[test]
fn a_port_claimed_by_a_process_that_is_gone_is_taken() {
    let port = common::free_port();
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let claim = std::env::temp_dir()
        .join("rdzv-test-ports")
        .join(port.to_string());
    std::fs::write(&claim, gone_pid.to_string()).unwrap();
    assert!(common::claim_port(port), "a stale claim was not taken");
    assert_eq!(common::port_claimer(port), Some(std::process::id()));
    common::release_port(port);
}
