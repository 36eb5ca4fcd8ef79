//! What the workers say and where it goes: the console (their own lines, `--tee`'s prefix, the
//! local ranks filter, a slow reader), `--log-dir` and `--redirects` files as torchrun makes
//! them, the prefix template, and the agent's own lines under LOGLEVEL and RDZV_LOG.

use crate::common::Etcd;
use crate::launch::RDZV;
use crate::support::{code, rdzv, rdzv_env, run_dir, Scratch, WorkerLines, FAST};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn log_dir_keeps_per_worker_files() {
    let s = Scratch::new();
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = s.standalone(&["--nproc-per-node=2", "--redirects=1", &logs_arg], "ok");
    l.exits_with(0, 30);
    assert!(
        !l.said("START rank="),
        "--redirects=1 keeps stdout off the console"
    );
    let run_dir = run_dir(&logs);
    for rank in 0..2 {
        let out =
            std::fs::read_to_string(run_dir.join(format!("attempt_0/{rank}/stdout.log"))).unwrap();
        assert!(out.starts_with(&format!("START rank={rank} ")), "{out}");
        // Only the redirected stream has a file, as torchrun lays it out.
        assert!(!run_dir
            .join(format!("attempt_0/{rank}/stderr.log"))
            .exists());
    }
}

#[test]
fn a_long_line_reaches_a_console_that_reads_it_slowly_whole() {
    // A 10 MB line without a newline, teed, to a console that takes seconds to read it: the
    // launcher used to wait 2 s for its workers' output and exit mid-write (the line was in
    // stdout.log, but cut short on the console).
    let s = Scratch::new();
    let logs = s.path("logs");
    let mut cmd = Command::new(RDZV);
    cmd.args(["run", "--standalone", "--tee", "3", "--log-dir"])
        .arg(&logs)
        .args([
            "python3",
            "-c",
            "import sys; sys.stdout.write('x' * 10_000_000)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("PET_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    // 64 KiB every 40 ms: about 6 s for the line.
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let (mut xs, mut buf) = (0usize, vec![0u8; 64 * 1024]);
        loop {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => return xs,
                Ok(n) => xs += buf[..n].iter().filter(|&&b| b == b'x').count(),
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the launcher did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code(status), 0);
    assert_eq!(
        reader.join().unwrap(),
        10_000_000,
        "the console lost part of the line"
    );
}

#[test]
fn tee_and_the_local_ranks_filter_choose_what_the_console_shows() {
    let s = Scratch::new();
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let flags = [
        "--nproc-per-node=2",
        "--tee=3",
        "--local-ranks-filter=1",
        &logs_arg,
    ];
    let mut l = s.standalone(&flags, "ok");
    l.exits_with(0, 30);
    assert!(
        l.said("[default1]:START") && !l.said("START rank=0"),
        "{}",
        l.output()
    );
    let out = std::fs::read_to_string(run_dir(&logs).join("attempt_0/0/stdout.log")).unwrap();
    assert!(
        out.starts_with("START rank=0 "),
        "files keep the filtered ranks: {out}"
    );
}

#[test]
fn console_lines_are_the_workers_own_and_teed_lines_carry_torchruns_prefix() {
    let s = Scratch::new();
    // By default the console shows what the workers wrote, unprefixed (so torch's own
    // `[rank1]:` lines are not doubled).
    let mut plain = s.standalone(&["--nproc-per-node=2"], "err");
    plain.exits_with(0, 30);
    for rank in 0..2 {
        assert!(
            plain
                .lines_with(&format!("START rank={rank} "))
                .any(|x| x.starts_with("START ")),
            "{}",
            plain.output()
        );
        assert!(plain.said(&format!("ERR from rank {rank}")));
    }
    assert!(!plain.said("]:START"), "{}", plain.output());

    // --tee: torchrun's `[${role_name}${local_rank}]:`, and duplicate filters (`,,` a comma).
    let logs = s.path("logs");
    let logs_arg = format!("--log-dir={}", logs.display());
    let flags = [
        "--nproc-per-node=2",
        "--tee=3",
        "--role=trainer",
        "--duplicate-stdout-filters=rank=1,,nothing,START rank=0",
        "--duplicate_stderr_filters=ERR",
        &logs_arg,
    ];
    let mut teed = s.standalone(&flags, "err");
    teed.exits_with(0, 30);
    assert!(teed.said("[trainer0]:START rank=0 "), "{}", teed.output());
    assert!(teed.said("[trainer1]:START rank=1 "), "{}", teed.output());
    assert!(teed.said("[trainer1]:ERR from rank 1"), "{}", teed.output());
    let attempt = run_dir(&logs).join("attempt_0");
    let filtered = std::fs::read_to_string(attempt.join("filtered_stdout.log")).unwrap();
    assert!(
        filtered.starts_with("[trainer0]:START rank=0 ") && filtered.lines().count() == 1,
        "{filtered}"
    );
    let filtered = std::fs::read_to_string(attempt.join("filtered_stderr.log")).unwrap();
    assert_eq!(filtered.lines().count(), 2, "{filtered}");

    // A template, from the flag or from torchrun's variable (the flag wins).
    let w = s.worker();
    let mut templated = rdzv(&[
        "run",
        "--standalone",
        "--nproc-per-node=2",
        "--tee=1",
        "--log-line-prefix-template=${role_name}/${rank}/${local_rank}> ",
        &w,
        "ok",
    ]);
    templated.exits_with(0, 30);
    assert!(
        templated.said("default/1/1> START rank=1 "),
        "{}",
        templated.output()
    );
    let mut by_variable = rdzv_env(
        &["run", "--standalone", "--tee=1", &w, "ok"],
        &[("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "r${rank}| ")],
    );
    by_variable.exits_with(0, 30);
    assert!(
        by_variable.said("r0| START rank=0 "),
        "{}",
        by_variable.output()
    );
}

/// Every file under `dir`, as paths relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn log_dir_and_redirects_create_the_files_torchrun_creates() {
    let s = Scratch::new();
    // --log-dir alone: a directory per worker, no stream files (error.json only on failure).
    let logs = s.path("alone");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = s.standalone(&["--nproc-per-node=2", &logs_arg], "err");
    l.exits_with(0, 30);
    let run = run_dir(&logs);
    assert!(run.join("attempt_0/0").is_dir() && run.join("attempt_0/1").is_dir());
    assert_eq!(files_under(&run), Vec::<String>::new());
    assert!(
        l.said("START rank=1 "),
        "the console still shows everything"
    );

    // -r 0:1,1:2: local rank 0's stdout and local rank 1's stderr, nothing else.
    let logs = s.path("split");
    let logs_arg = format!("--log-dir={}", logs.display());
    let mut l = s.standalone(&["--nproc-per-node=2", "-r", "0:1,1:2", &logs_arg], "err");
    l.exits_with(0, 30);
    let run = run_dir(&logs);
    assert_eq!(
        files_under(&run),
        ["attempt_0/0/stdout.log", "attempt_0/1/stderr.log"]
    );
    assert!(!l.said("START rank=0 "), "rank 0's stdout went to its file");
    assert!(l.said("START rank=1 ") && !l.said("ERR from rank 1"));
    let err = std::fs::read_to_string(run.join("attempt_0/1/stderr.log")).unwrap();
    assert_eq!(err, "ERR from rank 1\n");
}

/// torch's LOGLEVEL, as torchrun's agent reads it: at DEBUG the agent's steps and torchrun's
/// "Rendezvous info" banner for a standalone job; at INFO the banner and settings, no steps;
/// by default neither. RDZV_LOG's bare level does the same, and on etcd also asks the
/// library for its records.
#[test]
fn loglevel_and_rdzv_log_show_the_agents_steps_and_torchruns_banner() {
    let s = Scratch::new();
    let w = s.worker();
    let standalone = |env: &[(&str, &str)]| {
        let mut l = rdzv_env(
            &["run", "--standalone", "--nproc-per-node=2", &w, "ok"],
            env,
        );
        l.exits_with(0, 30);
        l
    };
    let quiet = standalone(&[]);
    assert!(
        !quiet.said("Rendezvous info:") && !quiet.said("debug:"),
        "{}",
        quiet.output()
    );
    for env in [("LOGLEVEL", "DEBUG"), ("RDZV_LOG", "debug")] {
        let debug = standalone(&[env]);
        let banner = debug.line_with("--rdzv-backend=static --rdzv-endpoint=localhost:0");
        assert!(
            banner.contains("--rdzv-id=standalone-"),
            "{env:?}: {banner}"
        );
        assert!(
            debug.said("Rendezvous info:"),
            "{env:?}: {}",
            debug.output()
        );
        assert!(
            debug.said("  nproc_per_node   : 2"),
            "{env:?}: {}",
            debug.output()
        );
        for rank in 0..2 {
            let started = format!("debug: started worker rank {rank} (local rank {rank}): pid ");
            assert!(debug.said(&started), "{env:?}: {}", debug.output());
        }
        assert!(debug.said("debug: round 0: the group ended: every worker succeeded"));
    }
    let info = standalone(&[("LOGLEVEL", "INFO")]);
    assert!(info.said("Rendezvous info:"), "{}", info.output());
    assert!(!info.said("debug:"), "{}", info.output());
    // On etcd: the library's own records come too (the rendezvous's retries and waits).
    let etcd = Etcd::start();
    let url = etcd.url("loglevel", FAST);
    let mut l = rdzv_env(&["run", "--rdzv", &url, &w, "ok"], &[("LOGLEVEL", "DEBUG")]);
    l.exits_with(0, 60);
    assert!(
        l.said("debug rdzv::"),
        "no library debug record: {}",
        l.output()
    );
    assert!(
        !l.said("Rendezvous info:"),
        "a named rendezvous has no banner"
    );
}

/// `${hostname}` in `--log-line-prefix-template` is the machine's host name, as in torchrun.
#[test]
fn the_prefix_template_knows_the_host_name() {
    let s = Scratch::new();
    let w = s.worker();
    let mut l = rdzv(&[
        "run",
        "--standalone",
        "--tee=3",
        "--log-line-prefix-template=<${hostname}|${rank}>",
        &w,
        "ok",
    ]);
    l.exits_with(0, 30);
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most len bytes into the buffer.
    assert_eq!(
        unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) },
        0
    );
    let host = std::ffi::CStr::from_bytes_until_nul(&name)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        l.said(&format!("<{host}|0>START rank=0 ")),
        "{}",
        l.output()
    );
}
