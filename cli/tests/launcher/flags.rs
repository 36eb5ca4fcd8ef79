//! The command line: PET_* variables and flags, bad input refused in one line, an unreachable
//! etcd waited for, `--rdzv-conf` values, the program run under python or as it is, the
//! flags accepted only for torchrun's sake, and shell completions.

use crate::common::Etcd;
use crate::support::{num, op, rdzv, rdzv_env, unique_run_id, Scratch, WorkerLines, FAST};
use std::time::{Duration, Instant};

#[test]
fn pet_variables_configure_the_launcher_and_flags_win() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let endpoint = etcd.endpoint();
    let run = unique_run_id("pet");
    let mut l = rdzv_env(
        &["run", "--nproc-per-node=2", &s.worker(), "ok"],
        &[
            ("PET_NNODES", "1"),
            ("PET_NPROC_PER_NODE", "3"),
            ("PET_RDZV_BACKEND", "etcd-v2"),
            ("PET_RDZV_ENDPOINT", &endpoint),
            ("PET_RDZV_ID", &run),
            ("PET_RDZV_CONF", "last_call_timeout=1,lease_ttl=2"),
            ("PET_MAX_RESTARTS", "4"),
            ("PET_ROLE", "trainer"),
        ],
    );
    let f = l.start(30);
    l.exits_with(0, 30);
    assert_eq!(
        num(&f, "lws"),
        2,
        "--nproc-per-node wins over PET_NPROC_PER_NODE"
    );
    assert_eq!(f["run"], run);
    assert_eq!(num(&f, "max"), 4);
    assert_eq!(f["role"], "trainer");
    assert!(l.said("rdzv speaks etcd's v3 API"), "{}", l.output());
    assert_eq!(l.lines_with("START rank=").count(), 2);
}

#[test]
fn bad_input_fails_fast_with_one_line() {
    let s = Scratch::new();
    let w = s.worker();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["run", "--bogus", &w], 2, "--bogus"),
        (
            vec!["run", "--nnodes=3:2", "--rdzv-endpoint=127.0.0.1:2379", &w],
            2,
            "--nnodes",
        ),
        (vec!["run", "--standalone"], 2, "PROGRAM"),
        (
            vec!["run", "--standalone", "/no/such/program"],
            2,
            "/no/such/program",
        ),
        (
            vec!["run", "--standalone", "/no/such/script.py"],
            2,
            "script.py",
        ),
        (
            vec!["run", "--standalone", "--no-python", "--module", "x"],
            2,
            "--module",
        ),
        (vec!["run", "--nnodes=2", &w], 2, "--rdzv-endpoint"),
        (
            vec!["run", "--rdzv-backend=zookeeper", "--rdzv-endpoint=h:1", &w],
            2,
            "--rdzv-backend",
        ),
        (
            vec!["run", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1,g:2", &w],
            2,
            "c10d: expected one HOST:PORT",
        ),
        (
            vec!["run", "--rdzv-endpoint=h:1", "--rdzv-conf=bogus=1", &w],
            2,
            "bogus",
        ),
        (
            vec!["run", "--nproc-per-node=zero", "--standalone", &w],
            2,
            "--nproc-per-node",
        ),
        (
            vec![
                "run",
                "--rdzv-endpoint=no-such-host.invalid:2379",
                "--rdzv-id=x",
                &w,
                "ok",
            ],
            1,
            "cannot resolve the host name",
        ),
        (
            vec!["run", "--rdzv=etcd://h:1/x", "--rdzv-id=y", &w],
            2,
            "--rdzv-id",
        ),
        (vec!["status", "notaurl"], 2, "URL"),
        (
            vec!["purge", "etcd://127.0.0.1:1/x"],
            1,
            "connection refused",
        ),
        (vec!["frobnicate"], 2, "frobnicate"),
    ];
    for (args, want, mention) in cases {
        let started = Instant::now();
        let (got, out, err) = op(&args);
        assert_eq!(got, want, "{args:?}: stdout {out:?} stderr {err:?}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: expected one line, got {err:?}");
        assert!(
            lines[0].contains(mention),
            "{args:?}: {err:?} does not mention {mention}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_refused_etcd_is_waited_for_and_a_typo_fails_fast() {
    let mut etcd = Etcd::start();
    let s = Scratch::new();
    let url = etcd.url("late", &format!("join_timeout=120&{FAST}"));
    // Nothing listens on the port now: the launcher waits, saying for what.
    etcd.kill();
    let mut l = s.node(&url, &[], "ok");
    let waiting = l.wait_line(30, |x| x.contains("waiting for etcd at"));
    assert!(waiting.contains(&etcd.endpoint()), "{waiting}");
    etcd.restart();
    l.start(60);
    l.exits_with(0, 60);
    assert!(l.said("connected to etcd at"), "{}", l.output());

    // Still refused at join_timeout: the launcher gives up, naming what refused.
    let mut given_up = s.node("etcd://127.0.0.1:1/x?join_timeout=1", &[], "ok");
    given_up.exits_with(1, 30);
    let error = given_up.line_with("rdzv: error:");
    assert!(
        error.contains("connection refused at 127.0.0.1:1"),
        "{error}"
    );
    // Nothing answers there at all: waited for the same way, bounded by join_timeout.
    let mut silent = s.node(
        "etcd://10.255.255.1:2379/x?connect_timeout=1&join_timeout=2",
        &[],
        "ok",
    );
    silent.exits_with(1, 30);
    assert!(
        silent.said("waiting for etcd at 10.255.255.1:2379"),
        "{}",
        silent.output()
    );

    // A host name that does not resolve is a typo: an error at once, not a wait.
    let w = s.worker();
    let mut typo = rdzv(&[
        "run",
        "--nnodes=1:2",
        "--rdzv-endpoint=no-such-host.invalid:2379",
        &w,
        "ok",
    ]);
    typo.exits_with(1, 20);
    assert!(
        typo.said("cannot resolve the host name"),
        "{}",
        typo.output()
    );
    assert!(!typo.said("waiting for etcd"), "{}", typo.output());
    // An endpoint that does not parse is a usage error.
    let mut bad = rdzv(&[
        "run",
        "--nnodes=1:2",
        "--rdzv-endpoint=host:port:x",
        &w,
        "ok",
    ]);
    bad.exits_with(2, 10);
}

/// `--rdzv-conf` values take effect: `join_timeout=2` ends a node that waits alone for a
/// second one after 2 s (not the default 600), with a timeout error.
#[test]
fn rdzv_conf_values_take_effect() {
    let etcd = Etcd::start();
    let s = Scratch::new();
    let w = s.worker();
    let endpoint = format!("--rdzv-endpoint={}", etcd.endpoint());
    let id = format!("--rdzv-id={}", unique_run_id("conf"));
    let started = Instant::now();
    let mut alone = rdzv(&[
        "run",
        "--nnodes=2",
        &endpoint,
        &id,
        "--rdzv-conf=join_timeout=2,last_call_timeout=1",
        &w,
        "ok",
    ]);
    alone.exits_with(1, 30);
    let took = started.elapsed();
    // 2 s, and a margin for the launcher's start and a loaded machine.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(2 + 5),
        "join_timeout=2 ended the node after {took:?}:\n{}",
        alone.output()
    );
    assert!(alone.said("2 s"), "{}", alone.output());
}

#[test]
fn python_programs_run_under_python3_and_cpu_counts_cpus() {
    let s = Scratch::new();
    let script = s.path("w.py");
    std::fs::write(
        &script,
        // One write per line: python3 -u writes print's text and its newline apart, and two
        // workers on one console can interleave them.
        "import os, sys\nsys.stdout.write(f\"PY {os.environ['RANK']} {os.environ['WORLD_SIZE']}\\n\")\n",
    )
    .unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let script_arg = script.display().to_string();
    let mut l = rdzv(&["run", "--standalone", "--nproc-per-node=cpu", &script_arg]);
    l.exits_with(0, 30);
    assert_eq!(l.lines_with("PY ").count(), cpus, "{}", l.output());
    assert!(l.said(&format!("PY 0 {cpus}")));

    // --module runs python3 -m NAME.
    std::fs::write(
        s.path("wmod.py"),
        "import os\nprint('MOD', os.environ['LOCAL_RANK'])\n",
    )
    .unwrap();
    let path = s.dir.display().to_string();
    let mut m = rdzv_env(
        &["run", "--standalone", "--module", "wmod"],
        &[("PYTHONPATH", &path)],
    );
    m.exits_with(0, 30);
    assert!(
        m.lines_with("MOD 0").any(|x| x == "MOD 0"),
        "{}",
        m.output()
    );
}

/// `--no-python` runs PROGRAM as it is, even a `.py` file: here an executable `.py` that is
/// a shell script. Without the flag it runs under PYTHON_EXEC (`echo` here, which prints what
/// it was given).
#[test]
fn no_python_runs_a_py_file_as_it_is() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    let script = s.path("tool.py");
    std::fs::write(&script, "#!/bin/sh\necho \"DIRECT $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = script.to_str().unwrap();
    let echo = [("PYTHON_EXEC", "echo")];
    let mut direct = rdzv_env(&["run", "--standalone", "--no-python", path, "x"], &echo);
    direct.exits_with(0, 30);
    assert!(direct.said("DIRECT x"), "{}", direct.output());
    let mut python = rdzv_env(&["run", "--standalone", path, "x"], &echo);
    python.exits_with(0, 30);
    assert!(
        python.said(&format!("-u {path} x")) && !python.said("DIRECT"),
        "{}",
        python.output()
    );
}

#[test]
fn accepted_only_flags_start_the_job_and_say_why_they_do_nothing() {
    let s = Scratch::new();
    let script = s.path("w.py");
    std::fs::write(&script, "import os\nprint('PY', os.environ['RANK'])\n").unwrap();
    let script_arg = script.display().to_string();
    let mut l = rdzv(&[
        "run",
        "--standalone",
        "--start-method=fork",
        "--start_method=forkserver",
        "--logs_specs=default",
        "--event-log-handler=console",
        "--no-python",
        "--run-path",
        &script_arg,
    ]);
    l.exits_with(0, 30);
    // --run-path wins over --no-python: the script ran under python3.
    assert!(l.lines_with("PY 0").any(|x| x == "PY 0"), "{}", l.output());
    assert!(
        l.said("--event-log-handler=console"),
        "no note on --event-log-handler: {}",
        l.output()
    );
    let mut bad = s.standalone(&["--start-method=thread"], "ok");
    bad.exits_with(2, 10);
    // An unknown LogsSpecs plugin fails as torchrun fails, naming the flag.
    let mut unknown = s.standalone(&["--logs-specs=custom"], "ok");
    unknown.exits_with(2, 10);
    assert!(
        unknown.said("--logs-specs: no LogsSpecs plugin \"custom\""),
        "{}",
        unknown.output()
    );
}

#[test]
fn print_completion_prints_a_script_for_each_shell() {
    for (shell, says) in [
        ("bash", "rdzv"),
        ("zsh", "#compdef rdzv"),
        ("tcsh", "complete rdzv"),
    ] {
        let (code, out, err) = op(&["run", "--print-completion", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(
            out.contains(says) && out.contains("nproc-per-node"),
            "{shell}: {out}"
        );
    }
    let (code, _, err) = op(&["run", "--print-completion", "fish"]);
    assert_eq!(code, 2, "{err}");
}
