//! Compiles the C test program and the C example against include/rdzv.h, links them with the
//! built library and runs them against a real etcd.

use crate::common;

use common::{Etcd, SpawnTied};
use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>/, where `cargo build` put librdzv.so (this test binary lives in its deps/).
/// Not deps/ itself: every build that includes the C library's crate rewrites the copy there,
/// and one with other features (a test build's) rewrote it under the running C programs.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// A directory of this test's own where the library has its installed names: the programs
/// record the SONAME, `librdzv.so.0`, and the build leaves only `librdzv.so` (a build script
/// may not write outside its OUT_DIR), so they are linked against and find at run time a
/// `librdzv.so.0` link here to the built library, as an installed one would be.
fn soname_dir() -> PathBuf {
    let built = library_dir().join("librdzv.so");
    assert!(built.exists(), "librdzv.so not found at {built:?}");
    let dir = library_dir().join("c-api-test");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["librdzv.so.0", "librdzv.so"] {
        let link = dir.join(name);
        // Tests run in parallel: the first makes each link, and one already there is kept.
        if std::fs::read_link(&link).is_err() {
            let made = std::os::unix::fs::symlink(&built, &link);
            assert!(
                made.is_ok() || std::fs::read_link(&link).is_ok(),
                "cannot link {link:?}: {made:?}"
            );
        }
    }
    dir
}

fn compile(source: &str, output: &str) -> PathBuf {
    // The repository: this test belongs to tests/ (the rdzv-tests package).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let lib = soname_dir();
    // One program per test process: the test command runs this suite in several processes at
    // once (one per etcd version), and a program one of them is writing cannot be executed by
    // another ("Text file busy"). Those of processes that have ended are removed here.
    let out = lib.join(format!("{output}-{}", std::process::id()));
    for entry in std::fs::read_dir(&lib).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix(&format!("{output}-"))
            .and_then(|p| p.parse::<u32>().ok());
        if owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join(source))
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lrdzv");
    if let Ok(flags) = std::env::var("RDZV_C_FLAGS") {
        cmd.args(flags.split_whitespace()); // e.g. -fsanitize=address
    }
    let status = cmd.status().expect("a C compiler");
    assert!(status.success(), "compiling {source} failed");
    out
}

#[test]
fn c_program_runs_a_rendezvous_end_to_end() {
    let etcd = Etcd::start();
    let exe = compile("tests/c/rdzv_test.c", "rdzv_c_test");
    let out = Command::new(exe)
        .args([etcd.endpoint(), "c-test".into()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "C test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed, 0 failed"));
}

/// The C worker side of in-process restart against the launcher's side of the control file
/// (`rdzv::inprocess`, what `rdzv run --in-process-restart` writes): a round handed out, a
/// leave seen by `rdzv_inprocess_check` and answered by `rdzv_inprocess_next`, which then
/// returns the next round and sets its variables in the environment.
#[test]
fn c_worker_runs_two_rounds_of_in_process_restart_in_one_process() {
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("rdzv-c-inprocess-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let control = dir.join("inprocess.json");
    let round = |rank: &str, world: &str, port: &str| -> Vec<(String, String)> {
        [
            ("RANK", rank),
            ("WORLD_SIZE", world),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("GROUP_RANK", rank),
            ("GROUP_WORLD_SIZE", world),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
            ("MASTER_ADDR", "host-a"),
            ("MASTER_PORT", port),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    rdzv::inprocess::write_run(&control, 0, &round("0", "1", "29500")).unwrap();
    let exe = compile("tests/c/inprocess_test.c", "rdzv_c_inprocess");
    let mut child = Command::new(exe)
        .env(rdzv::inprocess::CONTROL_FILE_ENV, &control)
        .env_remove("RANK")
        .stdout(std::process::Stdio::piped())
        .spawn_tied()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut line = || lines.next().expect("a line").unwrap();
    assert_eq!(
        line(),
        "ROUND rank=0 world=1 local=0 lws=1 group=0 groups=1 restart=0 master=host-a:29500 env_rank=0"
    );
    rdzv::inprocess::write_leave(&control, 1).unwrap();
    assert_eq!(line(), "LEAVING");
    let asked = std::time::Instant::now();
    while !rdzv::inprocess::has_left(&control, 1) {
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(10),
            "no answer"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    rdzv::inprocess::write_run(&control, 2, &round("3", "4", "29600")).unwrap();
    assert_eq!(
        line(),
        "ROUND rank=3 world=4 local=0 lws=1 group=3 groups=4 restart=0 master=host-a:29600 env_rank=3"
    );
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn c_example_nodes_exchange_values() {
    let etcd = Etcd::start();
    let exe = compile("examples/c/node.c", "rdzv_c_node");
    let url = etcd.url("c-example", "min_nodes=2&max_nodes=2");
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .arg(&url)
                .stdout(std::process::Stdio::piped())
                .spawn_tied()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}");
        assert!(line.contains("\"peers\":[\"c\",\"c\"]"), "{line}");
    }
}

#[test]
fn c_program_is_clean_under_valgrind() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("SKIPPED: valgrind is not installed");
        return;
    }
    let etcd = Etcd::start();
    let exe = compile("tests/c/rdzv_test.c", "rdzv_c_test_valgrind");
    let out = Command::new("valgrind")
        .args(["-q", "--error-exitcode=9", "--leak-check=full"])
        .args([
            "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite",
        ])
        .arg(exe)
        .args([etcd.endpoint(), "c-valgrind".into()])
        // The forked child deliberately leaks the parent's runtime; the fork case runs above.
        .env("RDZV_TEST_NO_FORK", "1")
        // Valgrind runs the program's threads one at a time, tens of times slower: on a busy
        // machine three nodes' connect, lease grant and registration took more than the
        // default 10 s (each node failed with "did not answer register alive in time").
        // The same for the leases: a keep-alive due every third of the 10 s TTL came late
        // enough beside the test command's other lanes that etcd expired a node's lease.
        .env("RDZV_TEST_URL_OPTIONS", "&connect_timeout=120&lease_ttl=60")
        // The same slowness for the program's own bounds on how long a cancel takes: the plain
        // run above holds them as they are.
        .env("RDZV_TEST_TIME_SCALE", "10")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "memory errors or leaks under valgrind:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed, 0 failed"));
}

#[test]
fn c_log_handler_gets_the_records_and_stderr_gets_them_after_a_reset() {
    let etcd = Etcd::start();
    let exe = compile("tests/c/log_test.c", "rdzv_c_log_test");
    let out = Command::new(exe)
        .args([etcd.endpoint(), "c-log".into()])
        .env("RDZV_LOG", "info")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "C log test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("1 passed, 0 failed"));
    // The handle made after rdzv_set_log_handler(NULL, NULL) logged to stderr.
    assert!(
        stderr.contains("rdzv  INFO rdzv::rendezvous: connected to etcd run=c-log node="),
        "{stderr}"
    );
}
