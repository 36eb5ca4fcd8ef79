//! An unmodified PyTorch DDP worker (gloo, `init_method="env://"`) under `rdzv run`: two
//! launchers of two workers each form one world of four and all_reduce in it. Needs the
//! PyTorch environment made by `scripts/torch-env.sh` (`RDZV_TORCH_PYTHON` names its python,
//! else it is looked up in the cache); skipped, saying so, where there is none.

use rdzv_test_support as common;
#[path = "support/launch.rs"]
mod launch;

use common::Etcd;
use launch::{fresh_dir, Launcher, RDZV};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn torch_python() -> Option<PathBuf> {
    // Set but empty: no environment, even where the cache has one (as `cached_python`).
    if let Some(p) = std::env::var_os("RDZV_TORCH_PYTHON") {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let cache = std::env::var_os("RDZV_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("rdzv")))
        .unwrap_or_else(|| home.join(".cache/rdzv"));
    let venv = cache.join("torch-2.15.0");
    venv.join(".complete")
        .exists()
        .then(|| venv.join("bin/python"))
}

#[test]
fn ddp_all_reduce_across_two_launchers() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let results = fresh_dir("launcher-torch");
    let url = etcd.url(
        "ddp",
        "min_nodes=2&max_nodes=2&last_call_timeout=1&lease_ttl=3",
    );
    let args = [
        "--rdzv",
        &url,
        "--nproc-per-node=2",
        "--local-addr=127.0.0.1",
    ];
    let env = [("RESULT_DIR", results.to_str().unwrap())];
    let started = Instant::now();
    let launchers: Vec<_> = (0..2)
        .map(|_| Launcher::run(&python, &args, &allreduce_worker(), &env))
        .collect();
    // Torch imports are slow on a loaded machine: bound the whole job generously.
    let deadline = Instant::now() + Duration::from_secs(300);
    for launcher in launchers {
        let (code, out) = launcher.finish(deadline);
        assert_eq!(code, Some(0), "launcher failed:\n{out}");
    }
    eprintln!(
        "2 x 2 DDP workers: launch to exit {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut ranks = Vec::new();
    for entry in std::fs::read_dir(&results).unwrap() {
        let path = entry.unwrap().path();
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(record["ok"], true, "{record}");
        assert_eq!(record["world"], 4, "{record}");
        assert_eq!(record["MASTER_ADDR"], "127.0.0.1", "{record}");
        ranks.push(record["rank"].as_u64().unwrap());
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3]);
    let _ = std::fs::remove_dir_all(&results);
}

fn allreduce_worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bindings/python/tests/torch_workers/allreduce.py")
}

/// Starts an `rdzv run` of one allreduce.py worker on `url` with `--nnodes=1:2`.
fn torch_launcher(python: &Path, url: &str, results: &Path, wait_unless_world: u32) -> Launcher {
    let args = [
        "--rdzv",
        url,
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--local-addr=127.0.0.1",
    ];
    let env = [
        ("RESULT_DIR", results.to_str().unwrap()),
        ("WAIT_UNLESS_WORLD", &wait_unless_world.to_string()),
    ];
    Launcher::run(python, &args, &allreduce_worker(), &env)
}

/// The records allreduce.py workers wrote for a world of `world` (`launch::records`),
/// each of which must also say it ran in that world.
fn records(results: &Path, world: u32, count: usize, deadline: Instant) -> Vec<serde_json::Value> {
    let found = launch::records(results, world, count, deadline);
    for r in &found {
        assert_eq!(r["world"], world, "{r}");
    }
    found
}

/// Elastic grow with real DDP workers: a job of one node runs; a second launcher arrives; the
/// first node's worker is replaced and both all_reduce in a world of two, without spending the
/// restart budget (`--max-restarts=0`).
#[test]
fn ddp_grows_from_one_node_to_two() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let url = etcd.url("ddp-grow", "last_call_timeout=1&lease_ttl=3");
    let results = fresh_dir("ddp-grow");
    let deadline = Instant::now() + Duration::from_secs(240);
    let first = torch_launcher(&python, &url, &results, 2);
    let alone = records(&results, 1, 1, deadline);
    assert_eq!(alone[0]["rank"], 0);
    let second = torch_launcher(&python, &url, &results, 2);
    let mut both = records(&results, 2, 2, deadline);
    both.sort_by_key(|r| r["rank"].as_u64());
    assert_eq!(both[0]["sum"], 3.0);
    // The node that ran alone keeps rank 0 (stable ranks across rounds).
    assert_eq!(both[0]["agent"], first.id());
    for launcher in [first, second] {
        let (code, out) = launcher.finish(deadline);
        assert_eq!(code, Some(0), "launcher failed:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&results);
}

/// Node loss with real DDP workers: two nodes run; one launcher is SIGKILLed (its worker dies
/// with it); the survivor re-forms alone within about the lease TTL and its new worker
/// all_reduces in a world of one.
#[test]
fn ddp_survives_the_loss_of_a_node() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    let url = etcd.url("ddp-loss", "last_call_timeout=1&lease_ttl=3");
    let results = fresh_dir("ddp-loss");
    let deadline = Instant::now() + Duration::from_secs(240);
    let a = torch_launcher(&python, &url, &results, 1);
    let mut b = torch_launcher(&python, &url, &results, 1);
    let pair = records(&results, 2, 2, deadline);
    let survivor_agent = a.id();
    assert!(pair.iter().any(|r| r["agent"] == survivor_agent));
    let killed = Instant::now();
    b.kill_node();
    let alone = records(&results, 1, 1, deadline);
    assert_eq!(alone[0]["agent"], survivor_agent, "{alone:?}");
    eprintln!(
        "survivor's DDP worker all_reduced alone {:.1} s after the SIGKILL",
        killed.elapsed().as_secs_f64()
    );
    let (code, out) = a.finish(deadline);
    assert_eq!(code, Some(0), "survivor failed:\n{out}");
    let _ = std::fs::remove_dir_all(&results);
}

/// `--in-process-restart` with real DDP workers: two nodes train; one is SIGKILLed whole
/// (launcher and worker, no watchdog: a machine that dies); the survivor's worker, whose
/// all_reduce fails on the dead peer, leaves its function, and runs it again in the same
/// process in a world of one, the model it built kept.
#[test]
fn ddp_survivor_keeps_its_process_when_a_node_dies_in_process_restart() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let etcd = Etcd::start();
    // Default lease: the peer watch finds the dead node, not its lease.
    let url = etcd.url("ddp-in-process", "last_call_timeout=1");
    let results = fresh_dir("ddp-in-process");
    let deadline = Instant::now() + Duration::from_secs(240);
    let worker = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bindings/python/tests/torch_workers/inprocess_ddp.py");
    let args = [
        "--rdzv",
        &url,
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--local-addr=127.0.0.1",
        "--in-process-restart",
        "--no-watchdog",
    ];
    let env = [
        ("RESULT_DIR", results.to_str().unwrap()),
        ("FINAL_WORLD", "1"),
    ];
    let a = Launcher::run(&python, &args, &worker, &env);
    let mut b = Launcher::run(&python, &args, &worker, &env);
    let pair = launch::records(&results, 2, 2, deadline);
    let survivor = pair
        .iter()
        .find(|r| r["agent"] == a.id())
        .expect("the first node's worker trains in the world of two")
        .clone();
    b.kill_node();
    let killed = std::time::SystemTime::now();
    let alone = launch::records(&results, 1, 1, deadline);
    let (code, out) = a.finish(deadline);
    assert_eq!(code, Some(0), "survivor failed:\n{out}");
    assert_eq!(alone[0]["pid"], survivor["pid"], "the same process: {out}");
    assert_eq!(alone[0]["again"], 1, "its function ran once more: {out}");
    assert_eq!(alone[0]["restart"], "0", "no restart spent: {out}");
    let first_step = alone[0]["t"].as_f64().unwrap()
        - killed
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
    eprintln!(
        "in process: the survivor's first step alone came {first_step:.2} s after the SIGKILL"
    );
    let _ = std::fs::remove_dir_all(&results);
}

/// The names of the worker environment the installed torch's agent always sets: the keys of
/// the dict literal assigned to `worker_env` in `local_elastic_agent.py`, read with Python's
/// own parser, plus LOCAL_RANK (set on both branches of `_set_local_rank_env`).
fn torch_agent_env_names(python: &Path) -> BTreeSet<String> {
    let script = r#"
import ast, torch.distributed.elastic.agent.server.local_elastic_agent as m
tree = ast.parse(open(m.__file__).read())
for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
            isinstance(t, ast.Name) and t.id == "worker_env" for t in node.targets):
        for key in node.value.keys:
            if isinstance(key, ast.Constant):
                print(key.value)
"#;
    let out = Command::new(python).args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        names.len() >= 10,
        "found only {names:?} in torch's agent: has its source changed shape?"
    );
    names.insert("LOCAL_RANK".into());
    names
}

/// The user name Python's `getpass.getuser()` gives: the first of its variables that is set,
/// else the password database's name for this uid.
fn user_name() -> String {
    for var in ["LOGNAME", "USER", "LNAME", "USERNAME"] {
        if let Some(name) = std::env::var(var).ok().filter(|n| !n.is_empty()) {
            return name;
        }
    }
    // SAFETY: getpwuid returns null or a pointer to a static record valid until the next call.
    let entry = unsafe { libc::getpwuid(libc::getuid()) };
    assert!(!entry.is_null(), "no password entry for this uid");
    let name = unsafe { std::ffi::CStr::from_ptr((*entry).pw_name) };
    name.to_string_lossy().into_owned()
}

/// Each worker's environment, by RANK: what `launch` (torchrun or rdzv run, standalone, two
/// workers) gave the workers beyond the test's own environment.
fn worker_envs(mut launch: Command, dir: &Path) -> Vec<BTreeMap<String, String>> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let dump = format!("env > {}/$RANK.env", dir.display());
    launch
        .args([
            "--standalone",
            "--nproc-per-node=2",
            "--no-python",
            "sh",
            "-c",
        ])
        .arg(&dump);
    let (code, out) = Launcher::spawn(launch).finish(Instant::now() + Duration::from_secs(180));
    assert_eq!(code, Some(0), "launcher failed:\n{out}");
    let parent: BTreeMap<String, String> = std::env::vars().collect();
    (0..2)
        .map(|rank| {
            let text = std::fs::read_to_string(dir.join(format!("{rank}.env"))).unwrap();
            text.lines()
                .filter_map(|l| l.split_once('='))
                .filter(|(k, v)| parent.get(*k).map(String::as_str) != Some(*v) && *k != "_")
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// `rdzv run` gives a worker what torchrun's agent gives it: every name the installed torch's
/// agent sets, the same set of added variables as torchrun in the same run, and the same values
/// wherever they do not differ by nature (ports, run ids, error file paths, and the agent store:
/// rdzv run serves none, so rank 0's worker hosts the c10d store itself).
#[test]
fn workers_get_the_environment_torchrun_gives() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let agent_names = torch_agent_env_names(&python);
    let dir = std::env::temp_dir().join(format!("rdzv-env-parity-{}", std::process::id()));
    // The second time, torchrun's agent asks inductor for its cache directory before it starts
    // the workers (a sitecustomize does), as it once did on its own under load.
    for inductor_asked in [false, true] {
        let mut torchrun = Command::new(&python);
        if inductor_asked {
            let site = dir.join("site");
            std::fs::create_dir_all(&site).unwrap();
            let ask =
                "from torch._inductor.runtime.cache_dir_utils import cache_dir\ncache_dir()\n";
            std::fs::write(site.join("sitecustomize.py"), ask).unwrap();
            torchrun.env("PYTHONPATH", &site);
        }
        torchrun.args(["-m", "torch.distributed.run"]);
        let mut torch = worker_envs(torchrun, &dir.join("torchrun"));
        if inductor_asked {
            torch
                .iter_mut()
                .for_each(|env| drop(env.remove("PYTHONPATH"))); // the test's own
            assert!(
                torch
                    .iter()
                    .all(|env| env.contains_key("TORCHINDUCTOR_CACHE_DIR")),
                "asking inductor for its cache directory no longer sets TORCHINDUCTOR_CACHE_DIR"
            );
        }
        same_environment(&agent_names, torch, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Checks that `rdzv run`'s workers get what torchrun's workers got (`torch`).
fn same_environment(
    agent_names: &BTreeSet<String>,
    mut torch: Vec<BTreeMap<String, String>>,
    dir: &Path,
) {
    let mut run = Command::new(RDZV);
    run.arg("run");
    let rdzv = worker_envs(run, &dir.join("rdzv"));
    // Not the agent's: torch's inductor writes its default cache directory into the
    // environment of any process that first asks for it (torch._dynamo.package does when it is
    // imported), and torchrun's agent had once by the time it started its workers (1 of about
    // 45 runs of this test, on a loaded machine; what made the agent ask is torch's, and no
    // line of its agent sets the name). Only that exact value is excused.
    let inductor_default = std::env::temp_dir().join(format!("torchinductor_{}", user_name()));
    for env in &mut torch {
        if env
            .get("TORCHINDUCTOR_CACHE_DIR")
            .map(std::path::PathBuf::from)
            == Some(inductor_default.clone())
        {
            env.remove("TORCHINDUCTOR_CACHE_DIR");
        }
    }
    let differ_by_nature = [
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_USE_AGENT_STORE",
    ];
    for (t, r) in torch.iter().zip(&rdzv) {
        let names = |env: &BTreeMap<String, String>| env.keys().cloned().collect::<BTreeSet<_>>();
        let missing: Vec<_> = agent_names.iter().filter(|n| !r.contains_key(*n)).collect();
        assert!(
            missing.is_empty(),
            "torch's agent sets {missing:?}, rdzv run does not"
        );
        assert_eq!(
            names(t),
            names(r),
            "torchrun and rdzv run add different variables"
        );
        for (name, value) in t {
            if !differ_by_nature.contains(&name.as_str()) {
                assert_eq!(r.get(name), Some(value), "{name} differs");
            }
        }
        assert_eq!(r["TORCHELASTIC_USE_AGENT_STORE"], "False");
        assert!(r["MASTER_PORT"].parse::<u16>().is_ok(), "{r:?}");
    }
    assert_eq!(rdzv[1]["RANK"], "1");
}

/// A worker program for the side-by-side runs: prints one line on each stream, and fails on
/// local rank `FAIL_RANK` (if set) through torch's `@record`, which writes its error file.
const PARITY_WORKER: &str = r#"
import os, sys
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    rank = os.environ["RANK"]
    print(f"out rank={rank}", flush=True)
    print(f"err rank={rank}", file=sys.stderr, flush=True)
    if os.environ.get("FAIL_RANK") == os.environ["LOCAL_RANK"]:
        raise ValueError(f"boom on rank {rank}")

main()
"#;

/// One side of a comparison: its exit code, the worker lines its console showed (sorted), and
/// the files under its single run directory in `logs` (relative, sorted).
struct Side {
    code: Option<i32>,
    console: Vec<String>,
    files: Vec<String>,
    /// The lines of the attempt's filtered_stdout.log and filtered_stderr.log, sorted.
    filtered: Vec<String>,
    output: String,
}

/// Runs `launcher` (torchrun or rdzv run, standalone, two workers) with `flags` on the
/// parity worker, with its logs in a fresh directory.
fn side(
    mut launcher: Command,
    python: &Path,
    script: &Path,
    flags: &[&str],
    logs: &Path,
    env: &[(&str, &str)],
) -> Side {
    let _ = std::fs::remove_dir_all(logs);
    std::fs::create_dir_all(logs).unwrap();
    launcher
        .args(["--standalone", "--nproc-per-node=2"])
        .arg(format!("--log-dir={}", logs.display()))
        .args(flags)
        .arg(script)
        .env("PYTHON_EXEC", python)
        .envs(env.iter().copied());
    let (code, output) =
        Launcher::spawn(launcher).finish(Instant::now() + Duration::from_secs(180));
    let mut console = worker_lines(&output);
    console.sort();
    let run_dir = std::fs::read_dir(logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut files = Vec::new();
    let mut dirs = vec![run_dir.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            match path.is_dir() {
                true => dirs.push(path),
                false => files.push(path.strip_prefix(&run_dir).unwrap().display().to_string()),
            }
        }
    }
    files.sort();
    let mut filtered: Vec<String> = files
        .iter()
        .filter(|f| f.contains("filtered_std"))
        .flat_map(|f| {
            let text = std::fs::read_to_string(run_dir.join(f)).unwrap();
            text.lines().map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    filtered.sort();
    Side {
        code,
        console,
        files,
        filtered,
        output,
    }
}

/// The parity worker's lines in a console's text, each with the prefix written before it.
/// Split at the worker's own words, not at line ends: two of torchrun's workers that share its
/// console (untee'd streams) can write their lines into one (`err rank=1err rank=0`).
fn worker_lines(output: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in output.lines() {
        let mut rest = line;
        loop {
            let at = [rest.find("out rank="), rest.find("err rank=")]
                .into_iter()
                .flatten()
                .min();
            let Some(at) = at else { break };
            let digits = rest[at + 9..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(rest.len(), |d| at + 9 + d);
            found.push(rest[..digits].to_string());
            rest = &rest[digits..];
        }
    }
    found
}

fn torchrun(python: &Path) -> Command {
    let mut c = Command::new(python);
    c.args(["-m", "torch.distributed.run"]);
    c
}

fn rdzv_run() -> Command {
    let mut c = Command::new(RDZV);
    c.arg("run");
    c
}

/// The same program and flags under torchrun and `rdzv run`: the same exit code, the same
/// worker lines on the console (unprefixed by default, `[default0]:` when teed, a template's
/// prefix), and the same files in the log directory.
#[test]
fn console_and_log_files_are_torchruns() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-console");
    let script = dir.join("worker.py");
    std::fs::write(&script, PARITY_WORKER).unwrap();
    let cases: [&[&str]; 5] = [
        &[],
        &["--tee=3"],
        &["-r", "0:1,1:2"],
        &["--tee=3", "--role=trainer", "--local-ranks-filter=1"],
        &["--tee=1", "--duplicate-stdout-filters=rank=1"],
    ];
    for flags in cases {
        let t = side(
            torchrun(&python),
            &python,
            &script,
            flags,
            &dir.join("t"),
            &[],
        );
        let r = side(rdzv_run(), &python, &script, flags, &dir.join("r"), &[]);
        assert_eq!(t.code, Some(0), "torchrun {flags:?}:\n{}", t.output);
        assert_eq!(r.code, t.code, "{flags:?}:\n{}", r.output);
        assert_eq!(r.console, t.console, "console lines, {flags:?}");
        assert_eq!(r.files, t.files, "log files, {flags:?}");
        // The filtered files hold the lines as the console shows them, prefix and all.
        assert_eq!(r.filtered, t.filtered, "filtered_*.log, {flags:?}");
    }
    // The template, through torchrun's variable.
    let env = [(
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        "<${role_name}|${rank}|${local_rank}> ",
    )];
    let t = side(
        torchrun(&python),
        &python,
        &script,
        &["--tee=3"],
        &dir.join("t"),
        &env,
    );
    let r = side(
        rdzv_run(),
        &python,
        &script,
        &["--tee=3"],
        &dir.join("r"),
        &env,
    );
    assert_eq!(r.console, t.console, "console lines with a prefix template");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker that fails under `@record`: both launchers exit 1, name the same root cause in
/// the same report layout, keep the same files, and copy the root cause's error file into
/// their own TORCHELASTIC_ERROR_FILE with its message and error code.
#[test]
fn a_failure_is_reported_as_torchrun_reports_it() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-failure");
    let script = dir.join("worker.py");
    std::fs::write(&script, PARITY_WORKER).unwrap();
    let mut copies = Vec::new();
    let mut sides = Vec::new();
    for (name, launcher) in [("t", torchrun(&python)), ("r", rdzv_run())] {
        let own = dir.join(format!("{name}-error.json"));
        let own_arg = own.display().to_string();
        let env = [
            ("FAIL_RANK", "1"),
            ("TORCHELASTIC_ERROR_FILE", own_arg.as_str()),
        ];
        sides.push(side(launcher, &python, &script, &[], &dir.join(name), &env));
        let copied: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
        copies.push(copied);
    }
    let (t, r) = (&sides[0], &sides[1]);
    assert_eq!(t.code, Some(1), "{}", t.output);
    assert_eq!(r.code, t.code, "{}", r.output);
    assert_eq!(r.files, t.files, "log files");
    // torchrun's report block, whole lines as it prints them (no prefix of the launcher's).
    let whole = |side: &Side, line: &str| side.output.lines().any(|l| l.trim_end() == line);
    for line in ["Failures:", "Root Cause (first observed failure):", "[0]:"] {
        for (who, side) in [("torchrun", t), ("rdzv run", r)] {
            assert!(
                whole(side, line),
                "{who} prints no line {line:?}:\n{}",
                side.output
            );
        }
    }
    // Rank 0, which the launcher stopped, is no failure of its own: `rdzv run` names it after
    // the block. torchrun lists it under "Failures:" (exitcode -15) when its agent collects the
    // SIGTERMed worker before it reports, which a loaded machine makes likely (1 run in 3 of
    // the test command): no line of that part is compared.
    assert!(whole(r, "  <NO_OTHER_FAILURES>"), "{}", r.output);
    for line in [
        "FAILED",
        "Root Cause (first observed failure):",
        "rank      : 1 (local_rank: 1)",
        "exitcode  : 1 (pid: ",
        "ValueError: boom on rank 1",
    ] {
        assert!(
            t.output.contains(line),
            "torchrun says no {line:?}:\n{}",
            t.output
        );
        assert!(
            r.output.contains(line),
            "rdzv run says no {line:?}:\n{}",
            r.output
        );
    }
    for (copy, who) in copies.iter().zip(["torchrun", "rdzv run"]) {
        let message = copy["message"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("boom on rank 1"), "{who}: {copy}");
    }
    assert_eq!(
        copies[1]["message"]["errorCode"], copies[0]["message"]["errorCode"],
        "{copies:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a launcher did with a program: its exit code (None: killed at the deadline) and
/// everything it and its workers wrote, stdout then stderr.
struct Ran {
    code: Option<i32>,
    out: String,
}

/// Runs `launcher` (torchrun or `rdzv run`, its flags, program and arguments given) in `cwd`,
/// with `input` on its stdin (then closed), within 180 s.
fn run_with_input(
    mut launcher: Command,
    python: &Path,
    cwd: &Path,
    input: &str,
    env: &[(&str, &str)],
) -> Ran {
    use std::io::{Read, Write};
    launcher
        .current_dir(cwd)
        .env("PYTHON_EXEC", python)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = common::spawn(launcher).unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let readers: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|mut stream| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            text
        })
    })
    .collect();
    let code = launch::wait_or_kill(&mut child, Instant::now() + Duration::from_secs(180));
    let out = readers.into_iter().map(|r| r.join().unwrap()).collect();
    Ran { code, out }
}

/// The lines of `out` that start with one of `tags`, sorted.
fn tagged(out: &str, tags: &[&str]) -> Vec<String> {
    let mut lines: Vec<String> = out
        .lines()
        .filter(|l| tags.iter().any(|t| l.starts_with(t)))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// torchrun hands everything after the script to the script, runs a script without `.py`
/// under Python, replaces `${local_rank}` in its arguments and lets workers read its stdin;
/// `rdzv run` does the same (it took `--help`, `--log_dir`, `-m`... for itself, ran `argv`
/// below as a program, passed `${local_rank}` as it is, and gave workers /dev/null).
#[test]
fn a_scripts_own_options_and_stdin_reach_it_as_under_torchrun() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-argv");
    // No `.py`, not executable: torchrun runs it as `python -u argv`. One write per line:
    // workers share the console, and print() writes a line's end apart from its text.
    let script = dir.join("argv");
    std::fs::write(
        &script,
        "import os, sys\n\
         rank = os.environ['LOCAL_RANK']\n\
         sys.stdout.write(f'ARGV local={rank} {sys.argv[1:]!r}\\n'); sys.stdout.flush()\n\
         if rank == '0':\n\
         \x20   sys.stdout.write(f'STDIN {sys.stdin.readline()!r}\\n'); sys.stdout.flush()\n",
    )
    .unwrap();
    let args = [
        "--help",
        "--log_dir",
        "D",
        "--epochs",
        "3",
        "-m",
        "--max-restarts=3",
        "--nnodes=5",
        "-t",
        "3",
        "data-${local_rank}",
    ];
    let mut sides = Vec::new();
    for (name, mut launcher) in [("torchrun", torchrun(&python)), ("rdzv run", rdzv_run())] {
        let cwd = dir.join(name.replace(' ', "-"));
        std::fs::create_dir_all(&cwd).unwrap();
        launcher
            .args(["--standalone", "--nproc-per-node=2"])
            .arg(&script)
            .args(args);
        let ran = run_with_input(launcher, &python, &cwd, "a line on stdin\n", &[]);
        assert_eq!(ran.code, Some(0), "{name}:\n{}", ran.out);
        assert!(!cwd.join("D").exists(), "{name} took --log_dir for itself");
        sides.push(tagged(&ran.out, &["ARGV ", "STDIN "]));
    }
    let want = |rank: u32| {
        format!(
            "ARGV local={rank} ['--help', '--log_dir', 'D', '--epochs', '3', '-m', \
             '--max-restarts=3', '--nnodes=5', '-t', '3', 'data-{rank}']"
        )
    };
    assert_eq!(
        sides[0],
        [want(0), want(1), "STDIN 'a line on stdin\\n'".to_string()],
        "torchrun"
    );
    assert_eq!(sides[1], sides[0], "rdzv run and torchrun");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `breakpoint()` in a worker (with `--nproc-per-node=1`, the usual way to debug) reads pdb's
/// commands from the launcher's stdin; on a terminal, workers see one (isatty), as torchrun's
/// workers do.
#[test]
fn pdb_and_the_terminal_reach_a_worker_as_under_torchrun() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-pdb");
    let debugged = dir.join("debugged.py");
    std::fs::write(
        &debugged,
        "x = 41\nbreakpoint()\nprint(f'AFTER {x}', flush=True)\n",
    )
    .unwrap();
    let tty = dir.join("tty.py");
    std::fs::write(
        &tty,
        "import os\nprint(f'TTY {os.isatty(0)} {os.isatty(1)} {os.isatty(2)}', flush=True)\n",
    )
    .unwrap();
    for (name, mut launcher) in [("torchrun", torchrun(&python)), ("rdzv run", rdzv_run())] {
        launcher
            .args(["--standalone", "--nproc-per-node=1"])
            .arg(&debugged);
        let env = [("PYTHONBREAKPOINT", "")];
        let ran = run_with_input(launcher, &python, &dir, "p x + 1\nc\n", &env);
        assert_eq!(ran.code, Some(0), "{name}:\n{}", ran.out);
        assert!(
            ran.out.contains("(Pdb) 42") && ran.out.contains("AFTER 41"),
            "{name}: pdb did not read its commands:\n{}",
            ran.out
        );
    }
    // Under a terminal (util-linux's `script` makes one).
    let quoted = |p: &Path| format!("'{}'", p.display());
    for (name, launcher) in [
        (
            "torchrun",
            format!("{} -m torch.distributed.run", quoted(&python)),
        ),
        ("rdzv run", format!("{} run", quoted(Path::new(RDZV)))),
    ] {
        let line = format!(
            "{launcher} --standalone --nproc-per-node=1 {}",
            quoted(&tty)
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .env("PYTHON_EXEC", &python);
        let (code, out) = Launcher::spawn(cmd).finish(Instant::now() + Duration::from_secs(180));
        assert_eq!(code, Some(0), "{name}:\n{out}");
        assert!(out.contains("TTY True True True"), "{name}: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A progress bar's line (`\r`, no newline) reaches the console as it is written, before the
/// worker ends its line, as under torchrun, whose workers write to its console themselves.
#[test]
fn a_partial_line_reaches_the_console_at_once_as_under_torchrun() {
    use std::io::Read;
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-partial");
    let bar = dir.join("bar.py");
    let go = dir.join("go");
    // The worker ends its line only once the test has seen the partial one (the file `go`).
    std::fs::write(
        &bar,
        format!(
            "import os, sys, time\n\
             sys.stdout.write('progress 50%\\r'); sys.stdout.flush()\n\
             end = time.monotonic() + 120\n\
             while not os.path.exists({go:?}) and time.monotonic() < end:\n\
             \x20   time.sleep(0.05)\n\
             print('progress 100%', flush=True)\n",
            go = go.display().to_string()
        ),
    )
    .unwrap();
    for (name, mut launcher) in [("torchrun", torchrun(&python)), ("rdzv run", rdzv_run())] {
        let _ = std::fs::remove_file(&go);
        launcher
            .args(["--standalone", "--nproc-per-node=1"])
            .arg(&bar)
            .env("PYTHON_EXEC", &python)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = common::spawn(launcher).unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(100);
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("progress 50%\r") {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(chunk) => seen.extend(chunk),
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "{name}: the partial line did not reach the console: {:?}",
                        String::from_utf8_lossy(&seen)
                    );
                }
            }
        }
        std::fs::write(&go, b"").unwrap();
        let code = launch::wait_or_kill(&mut child, Instant::now() + Duration::from_secs(60));
        assert_eq!(code, Some(0), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// torchrun's `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` is the workers' grace period after SIGTERM
/// when `--shutdown-timeout` is not given: workers that ignore SIGTERM keep a SIGTERMed
/// launcher that long, not 30 s.
#[test]
fn torchs_shutdown_timeout_variable_bounds_the_grace_period_as_under_torchrun() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-shutdown");
    let stubborn = dir.join("stubborn.py");
    std::fs::write(
        &stubborn,
        "import signal, time\n\
         signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         print('READY', flush=True)\n\
         time.sleep(600)\n",
    )
    .unwrap();
    for (name, mut launcher) in [("torchrun", torchrun(&python)), ("rdzv run", rdzv_run())] {
        launcher
            .args(["--standalone", "--nproc-per-node=1"])
            .arg(&stubborn)
            .env("PYTHON_EXEC", &python)
            .env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "2");
        let mut l = Launcher::spawn(launcher);
        l.wait_line(120, |x| x.contains("READY"));
        let signalled = Instant::now();
        l.signal(libc::SIGTERM);
        l.died(30);
        let took = signalled.elapsed();
        // 2 s of grace, then SIGKILL; the margin is for a loaded machine.
        assert!(
            took < Duration::from_secs(10),
            "{name} took {took:?} after SIGTERM:\n{}",
            l.output()
        );
        eprintln!("{name}: exited {:.2} s after SIGTERM", took.as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A DDP job of two nodes whose rank 1 exits 7 after a first all_reduce, with no restart to
/// spend: every node of the job fails (exits non-zero), under torchrun's c10d backend and
/// under `rdzv run`, and `rdzv run`'s nodes within the bound docs/LAUNCHER.md states (5 s
/// from the failure). Before, the failing `rdzv run` waited `lease_ttl` for a loss that would
/// explain the failure, and the other node could exit 0 when the run closed.
#[test]
fn a_failed_ddp_job_fails_every_node_as_under_torchrun() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-fail");
    let script = dir.join("fail_rank_1.py");
    // os._exit: the time is the launchers', not the interpreter's teardown of torch and gloo
    // after sys.exit (5.7 s once on the loaded 2 cores of the test command, 0.1 s alone).
    std::fs::write(
        &script,
        "import os, sys, time\n\
         import torch, torch.distributed as dist\n\
         dist.init_process_group('gloo', init_method='env://')\n\
         t = torch.zeros(1)\n\
         dist.all_reduce(t)\n\
         if dist.get_rank() == 1:\n\
         \x20   open(os.environ['FAILED_AT'], 'w').write(repr(time.time()))\n\
         \x20   os._exit(7)\n\
         while True:\n\
         \x20   dist.all_reduce(t)\n",
    )
    .unwrap();
    let etcd = Etcd::start();
    let common_flags = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "--monitor-interval=0.1",
    ];
    for name in ["torchrun c10d", "rdzv run"] {
        let failed_at = dir.join(format!("{}-failed-at", name.replace(' ', "-")));
        let port = common::free_port();
        let url = etcd.url("fail", "last_call_timeout=1");
        let node = || {
            let mut cmd = match name {
                "rdzv run" => {
                    let mut c = rdzv_run();
                    c.args(["--rdzv", &url, "--local-addr=127.0.0.1"]);
                    c
                }
                _ => {
                    let mut c = torchrun(&python);
                    c.args([
                        "--rdzv-backend=c10d",
                        &format!("--rdzv-endpoint=127.0.0.1:{port}"),
                        "--rdzv-id=fail",
                    ]);
                    c
                }
            };
            cmd.args(common_flags)
                .arg(&script)
                .env("PYTHON_EXEC", &python)
                .env("FAILED_AT", &failed_at);
            Launcher::spawn(cmd)
        };
        let first = node();
        if name == "torchrun c10d" {
            // The first torchrun hosts the store: the second must find it there.
            launch::wait_for_listener(port, Duration::from_secs(120));
        }
        let mut nodes = [first, node()];
        let mut exits = Vec::new();
        for n in nodes.iter_mut() {
            let status = n.died(180);
            exits.push((status.code(), std::time::SystemTime::now()));
        }
        let failed: f64 = std::fs::read_to_string(&failed_at)
            .unwrap_or_else(|_| panic!("{name}: rank 1 never failed:\n{}", nodes[0].output()))
            .parse()
            .unwrap();
        for (n, (code, at)) in nodes.iter().zip(&exits) {
            let after = at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
                - failed;
            assert!(
                code.is_some_and(|c| c != 0),
                "{name}: a node exited {code:?}:\n{}",
                n.output()
            );
            eprintln!("{name}: a node exited {code:?} {after:.2} s after the failure");
            if name == "rdzv run" {
                assert!(after < 5.0, "{name}: {after:.2} s:\n{}", n.output());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// torchrun's c10d backend takes `is_host`, `read_timeout`, `keep_alive_interval` and
/// `keep_alive_max_attempt` in `--rdzv-conf`; `rdzv run` takes them too (they were usage
/// errors): the same command line runs under both.
#[test]
fn torchs_c10d_rdzv_conf_keys_are_taken_as_by_torchrun() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no PyTorch environment (scripts/torch-env.sh makes one)");
        return;
    };
    let dir = fresh_dir("parity-conf");
    let script = dir.join("ok.py");
    std::fs::write(&script, "print('WORKER RAN', flush=True)\n").unwrap();
    for (name, mut launcher) in [("torchrun", torchrun(&python)), ("rdzv run", rdzv_run())] {
        launcher
            .args([
                "--nnodes=1",
                "--rdzv-backend=c10d",
                &format!("--rdzv-endpoint=127.0.0.1:{}", common::free_port()),
                "--rdzv-conf=is_host=true,read_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=3",
            ])
            .arg(&script)
            .env("PYTHON_EXEC", &python);
        let (code, out) =
            Launcher::spawn(launcher).finish(Instant::now() + Duration::from_secs(180));
        assert_eq!(code, Some(0), "{name}:\n{out}");
        assert!(out.contains("WORKER RAN"), "{name}:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
