//! The chaos run: a 3-member etcd cluster on this machine, K `rdzv-node` processes that stay
//! in the job round after round the way an agent does (`--follow --exchange --keep-going`,
//! each writing its history), and the seeded fault schedule played against them. Each node
//! runs in a network namespace of its own where the machine allows it (so it can be cut off);
//! elsewhere on loopback, without partitions. At the end the runner closes the run, waits for
//! every node to exit, and hands all histories to the checker.

use super::checker::{self, Report, Violation};
use super::history::{self, now, parse_history, Fault, FaultKind, Process, Run, Time};
use super::schedule::{self, Episode};
use crate::common::node::node_bin;
use crate::common::{EtcdCluster, NetNs, SpawnTied};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Config {
    pub nodes: usize,
    /// How long faults are injected.
    pub duration: Duration,
    pub seed: u64,
    pub lease_ttl: Duration,
    pub last_call: Duration,
    pub slack: Duration,
    /// Rank 0 re-rendezvouses after this long in a round, so rounds keep forming.
    pub churn: Duration,
}

impl Config {
    /// The defaults, with `RDZV_CHAOS_SEED`, `RDZV_CHAOS_NODES` and `RDZV_CHAOS_DURATION`
    /// (`90s`, `30m`, `2h`) from the environment when set.
    pub fn from_env(nodes: usize, duration: Duration) -> Config {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let seed = var("RDZV_CHAOS_SEED")
            .map(|s| s.parse().expect("RDZV_CHAOS_SEED: expected a whole number"))
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    % 1_000_000_000
            });
        let nodes = var("RDZV_CHAOS_NODES")
            .map(|s| {
                s.parse()
                    .expect("RDZV_CHAOS_NODES: expected a whole number")
            })
            .unwrap_or(nodes);
        assert!(nodes >= 4, "RDZV_CHAOS_NODES: at least 4 nodes");
        let duration = var("RDZV_CHAOS_DURATION")
            .map(|s| parse_duration(&s).expect("RDZV_CHAOS_DURATION: expected 90s, 30m or 2h"))
            .unwrap_or(duration);
        Config {
            nodes,
            duration,
            seed,
            lease_ttl: Duration::from_secs(3),
            last_call: Duration::from_secs(1),
            slack: Duration::from_secs(5),
            churn: Duration::from_secs(6),
        }
    }
}

/// `90s`, `30m`, `2h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let (number, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// One place in the job: a node process at a time (a killed one is replaced by a fresh one),
/// in its own network namespace when there is one.
struct Slot {
    ns: Option<NetNs>,
    child: Option<Child>,
    /// Index into `Runner::processes` of the process now in this slot.
    current: usize,
    generation: usize,
    /// Where the process now in this slot writes its output.
    log: PathBuf,
}

struct Runner {
    config: Config,
    dir: PathBuf,
    cluster: EtcdCluster,
    url: String,
    slots: Vec<Slot>,
    processes: Vec<Process>,
    histories: Vec<PathBuf>,
    faults: Vec<Fault>,
    /// When the last fault healed (when the first round formed, until a fault is injected).
    stopped: Time,
    /// Node processes that exited on their own while the job ran: (slot, code).
    unexpected_exits: Vec<(usize, Option<i32>)>,
    run_lease: RunLeaseWatch,
}

/// Watches the run's `lease` key from before the first node starts, and notes when etcd
/// deletes it (`Run::run_lost`). Stops when dropped.
struct RunLeaseWatch {
    lost: Arc<Mutex<Vec<Time>>>,
    stop: Arc<AtomicBool>,
}

impl RunLeaseWatch {
    fn start(endpoints: Vec<String>, key: String) -> RunLeaseWatch {
        let lost = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (opened_tx, opened) = mpsc::channel();
        let (seen, stopping) = (lost.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                // From the revision after the last event seen, across member kills.
                let mut from = 0;
                let mut opened_tx = Some(opened_tx);
                while !stopping.load(Ordering::Relaxed) {
                    let options = etcd_client::WatchOptions::new().with_start_revision(from);
                    let watch = match etcd_client::Client::connect(&endpoints, None).await {
                        Ok(mut client) => client.watch(key.as_str(), Some(options)).await,
                        Err(e) => Err(e),
                    };
                    let Ok(mut stream) = watch else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    if let Some(tx) = opened_tx.take() {
                        let _ = tx.send(());
                    }
                    while !stopping.load(Ordering::Relaxed) {
                        let message =
                            tokio::time::timeout(Duration::from_millis(200), stream.message());
                        let resp = match message.await {
                            Err(_) => continue,
                            Ok(Ok(Some(resp))) => resp,
                            Ok(_) => break,
                        };
                        for event in resp.events() {
                            let Some(kv) = event.kv() else { continue };
                            from = kv.mod_revision() + 1;
                            if event.event_type() == etcd_client::EventType::Delete {
                                seen.lock().unwrap().push(now());
                            }
                        }
                    }
                }
            });
        });
        opened
            .recv_timeout(Duration::from_secs(30))
            .expect("cannot watch the run's lease key");
        RunLeaseWatch { lost, stop }
    }
}

impl Drop for RunLeaseWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn say(line: &str) {
    // Straight to stderr, past libtest's capture: a long run shows its progress.
    let _ = writeln!(std::io::stderr(), "chaos: {line}");
}

fn signal(child: &Child, sig: i32) {
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// The node id a history file starts with (its `start` event), once it has one.
fn node_of(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let first = text.lines().next()?;
    history::Event::parse(first).ok().map(|e| e.node)
}

impl Runner {
    fn start(config: Config) -> Runner {
        let dir = std::env::temp_dir().join(format!(
            "rdzv-chaos-{}-seed-{}",
            std::process::id(),
            config.seed
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut namespaces = Vec::new();
        for _ in 0..config.nodes {
            match NetNs::create() {
                Ok(ns) => namespaces.push(ns),
                Err(why) => {
                    say(&format!(
                        "SKIPPED partitions: cannot create a network namespace here ({why}); \
                         every node runs on loopback"
                    ));
                    namespaces.clear();
                    break;
                }
            }
        }
        let hosts: Vec<&str> = namespaces.iter().map(|ns| ns.host_addr.as_str()).collect();
        let cluster = EtcdCluster::start_on(3, &hosts);
        let query = format!(
            "min_nodes={}&max_nodes={}&lease_ttl={}&last_call_timeout={}&connect_timeout=3\
             &join_timeout=60&store_timeout=10&close_timeout=5",
            config.nodes / 2,
            config.nodes,
            config.lease_ttl.as_secs(),
            config.last_call.as_secs_f64(),
        );
        let url = cluster.url("chaos", &query);
        let params = rdzv::Params::from_url(&url).unwrap();
        let run_lease = RunLeaseWatch::start(
            (0..cluster.member_count())
                .map(|i| cluster.endpoint(i))
                .collect(),
            format!(
                "{}/{}/lease",
                params.key_prefix().trim_end_matches('/'),
                params.run_id()
            ),
        );
        let mut namespaces = namespaces.into_iter();
        let slots = (0..config.nodes)
            .map(|_| Slot {
                ns: namespaces.next(),
                child: None,
                current: 0,
                generation: 0,
                log: PathBuf::new(),
            })
            .collect();
        let mut runner = Runner {
            config,
            dir,
            cluster,
            url,
            slots,
            processes: Vec::new(),
            histories: Vec::new(),
            faults: Vec::new(),
            stopped: 0,
            unexpected_exits: Vec::new(),
            run_lease,
        };
        for slot in 0..runner.config.nodes {
            runner.spawn(slot);
        }
        runner
    }

    fn partitions(&self) -> bool {
        self.slots.iter().all(|s| s.ns.is_some())
    }

    /// Starts a fresh node in `slot`.
    fn spawn(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        let name = format!("node-{slot}-{}", s.generation);
        s.generation += 1;
        let history = self.dir.join(format!("{name}.jsonl"));
        s.log = self.dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&s.log).unwrap();
        let (mut command, url) = match &s.ns {
            Some(ns) => (
                ns.command(node_bin()),
                self.url.replace("127.0.0.1", &ns.host_addr),
            ),
            None => (Command::new(node_bin()), self.url.clone()),
        };
        let churn = format!("{}", self.config.churn.as_secs_f64());
        let child = command
            .arg(&url)
            .args([
                "--rounds",
                "forever",
                "--follow",
                "--exchange",
                "--keep-going",
            ])
            .args(["--churn", &churn, "--history"])
            .arg(&history)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn_tied()
            .expect("cannot start rdzv-node");
        s.child = Some(child);
        s.current = self.processes.len();
        self.processes.push(Process {
            slot,
            node: None,
            spawned: now(),
            ended: None,
            events: Vec::new(),
        });
        self.histories.push(history);
    }

    /// Notes node processes that exited on their own (with `--keep-going` a node only exits
    /// when the run is closed).
    fn reap(&mut self) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(child) = s.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                // Its last line says why (a CI log shows this, not the run's files).
                let text = std::fs::read_to_string(&s.log).unwrap_or_default();
                let last = text.lines().last().unwrap_or("(no output)");
                say(&format!(
                    "node in slot {i} exited on its own: {status}; it said: {last}"
                ));
                self.processes[s.current].ended = Some(now());
                self.unexpected_exits.push((i, status.code()));
                s.child = None;
            }
        }
    }

    /// Reads every history as it stands now.
    fn snapshot(&mut self, closed: Time) -> Run {
        for (p, path) in self.processes.iter_mut().zip(&self.histories) {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            p.events = parse_history(&text)
                .unwrap_or_else(|e| panic!("history {} is malformed: {e}", path.display()));
            p.node = p.events.first().map(|e| e.node.clone());
        }
        Run {
            lease_ttl: self.config.lease_ttl,
            last_call: self.config.last_call,
            slack: self.config.slack,
            processes: self.processes.clone(),
            faults: self.faults.clone(),
            faults_stopped: self.stopped,
            closed,
            // Once closed, the last node out deletes the run's keys, its lease key with them.
            run_lost: (self.run_lease.lost.lock().unwrap().iter())
                .copied()
                .filter(|&t| t < closed)
                .collect(),
        }
    }

    /// Waits, reading the histories again every 250 ms for at most `limit`, until every live
    /// node is in one round of all of them sealed after `after`. Returns when that was.
    fn wait_whole(&mut self, from: Time, after: Time, limit: Duration) -> Option<Time> {
        let deadline = Instant::now() + limit;
        loop {
            let run = self.snapshot(Time::MAX);
            if let Some(t) = checker::first_whole(&run, from, after) {
                return Some(t);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn inject(&mut self, episode: usize, kind: FaultKind, target: usize) -> usize {
        let node = match kind {
            FaultKind::EtcdKill => None,
            _ => node_of(&self.histories[self.slots[target].current]),
        };
        let injected = now();
        match kind {
            FaultKind::Kill => {
                let s = &mut self.slots[target];
                if let Some(mut child) = s.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                self.processes[s.current].ended = Some(now());
            }
            FaultKind::Pause => {
                if let Some(child) = &self.slots[target].child {
                    signal(child, libc::SIGSTOP);
                }
            }
            FaultKind::EtcdKill => self.cluster.kill(target),
            FaultKind::Partition => self.slots[target].ns.as_ref().unwrap().cut(),
        }
        self.faults.push(Fault {
            episode,
            kind,
            target,
            node,
            injected,
            healed: Time::MAX,
        });
        self.faults.len() - 1
    }

    fn heal(&mut self, fault: usize) {
        let (kind, target) = (self.faults[fault].kind, self.faults[fault].target);
        match kind {
            FaultKind::Kill => self.spawn(target),
            FaultKind::Pause => {
                if let Some(child) = &self.slots[target].child {
                    signal(child, libc::SIGCONT);
                }
            }
            FaultKind::EtcdKill => self.cluster.restart(target),
            FaultKind::Partition => self.slots[target].ns.as_ref().unwrap().heal(),
        }
        self.faults[fault].healed = now();
        self.stopped = self.faults[fault].healed;
    }

    /// Plays one episode: injects and heals its faults at their times.
    fn play(&mut self, number: usize, episode: &Episode) {
        let described: Vec<String> = episode
            .faults
            .iter()
            .map(|f| {
                format!(
                    "{} (target {}, at +{:.1} s for {:.1} s)",
                    f.kind.name(),
                    f.target,
                    f.offset.as_secs_f64(),
                    f.hold.as_secs_f64()
                )
            })
            .collect();
        say(&format!("episode {number}: {}", described.join("; ")));
        // (time from the start of the episode, fault index in the episode, inject?)
        let mut actions: Vec<(Duration, usize, bool)> = Vec::new();
        for (i, f) in episode.faults.iter().enumerate() {
            actions.push((f.offset, i, true));
            actions.push((f.offset + f.hold, i, false));
        }
        actions.sort_by_key(|&(at, i, inject)| (at, !inject, i));
        let start = Instant::now();
        let mut injected = vec![0; episode.faults.len()];
        for (at, i, inject) in actions {
            // Fault injection at its planned time, not a wait for an event.
            std::thread::sleep(at.saturating_sub(start.elapsed()));
            self.reap();
            let f = &episode.faults[i];
            match inject {
                true => injected[i] = self.inject(number, f.kind, f.target),
                false => self.heal(injected[i]),
            }
        }
    }

    /// Closes the run and waits (at most 30 s) for every node process to exit; returns when the
    /// run was closed and the exit code of every node that did not exit 0.
    fn close(&mut self) -> (Time, Vec<(usize, Option<i32>)>) {
        let params = rdzv::Params::from_url(&self.url).unwrap();
        let closer = rdzv::BlockingRendezvous::new(params).expect("cannot connect to close");
        let closed = now();
        closer.set_closed().expect("cannot close the run");
        let (tx, rx) = mpsc::channel();
        let mut running = 0;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(mut child) = s.child.take() {
                let tx = tx.clone();
                running += 1;
                std::thread::spawn(move || {
                    let code = child.wait().map(|st| st.code()).unwrap_or(None);
                    let _ = tx.send((i, code, child));
                });
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut failed = Vec::new();
        for _ in 0..running {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, code, _)) => {
                    let current = self.slots[i].current;
                    self.processes[current].ended = Some(now());
                    if code != Some(0) {
                        failed.push((i, code));
                    }
                }
                Err(_) => panic!("node processes did not exit within 30 s of closing the run"),
            }
        }
        drop(closer);
        (closed, failed)
    }
}

impl Runner {
    /// Once every node is gone, waits (by watch) for the run's keys to go, for at most two
    /// lease TTLs and some slack (a killed node's lease, then the run's lease, which the last
    /// node alive refreshed): the run must then hold nothing but its `closed` marker. Err: the
    /// keys still there.
    fn left_behind(&self) -> Result<(), Vec<String>> {
        let run = format!("/rdzv/{}/", crate::common::node::run_of(&self.url));
        let limit = 2 * self.config.lease_ttl + self.config.slack + Duration::from_secs(5);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoints: Vec<String> = (0..self.cluster.member_count())
            .map(|i| self.cluster.endpoint(i))
            .collect();
        rt.block_on(async {
            let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
            let watch = etcd_client::WatchOptions::new().with_prefix();
            let mut stream = client.watch(run.as_str(), Some(watch)).await.unwrap();
            let mut keys = Vec::new();
            let settled = tokio::time::timeout(limit, async {
                loop {
                    let read = etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only();
                    let resp = client.get(run.as_str(), Some(read)).await.unwrap();
                    keys = resp
                        .kvs()
                        .iter()
                        .map(|kv| kv.key_str().unwrap().trim_start_matches(&run).to_string())
                        .collect();
                    if keys.iter().all(|k| k == "closed") {
                        return;
                    }
                    stream.message().await.unwrap().unwrap();
                }
            })
            .await;
            match settled {
                Ok(()) => {
                    say("nothing left behind: the run holds only its closed marker");
                    Ok(())
                }
                Err(_) => Err(keys),
            }
        })
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(mut child) = s.child.take() {
                // SIGKILL ends a stopped process too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs the job under faults for `config.duration` and checks the whole history. Returns
/// the report, or the first violation (the run's files are kept then, and their place said).
pub fn run(config: Config) -> Result<Report, Violation> {
    let seed = config.seed;
    say(&format!(
        "seed {seed} (replay with RDZV_CHAOS_SEED={seed}), {} nodes, faults for {} s",
        config.nodes,
        config.duration.as_secs()
    ));
    let started = Instant::now();
    let mut runner = Runner::start(config);
    let bound = runner.config.lease_ttl + runner.config.last_call + runner.config.slack;
    // The job's first round, with every node (starting 3 etcd members and K processes on a
    // busy machine takes a while; this is not the bound under test).
    runner.stopped = match runner.wait_whole(0, 0, Duration::from_secs(60)) {
        Some(t) => t,
        None => {
            runner.reap();
            panic!(
                "the job never formed its first round of every node (nodes that exited: {:?}; \
                 their output is in {})",
                runner.unexpected_exits,
                runner.dir.display()
            );
        }
    };
    let shape = schedule::Shape {
        nodes: runner.config.nodes,
        etcd_members: runner.cluster.member_count(),
        partitions: runner.partitions(),
        lease_ttl: runner.config.lease_ttl,
    };
    let faults_from = Instant::now();
    for (number, episode) in schedule::episodes(seed, shape).enumerate() {
        if faults_from.elapsed() + episode.gap >= runner.config.duration {
            break;
        }
        std::thread::sleep(episode.gap);
        runner.play(number, &episode);
    }
    runner.reap();
    let stopped = runner.stopped;
    let after = runner
        .faults
        .iter()
        .filter(|f| f.kind.breaks_the_round())
        .map(|f| f.injected)
        .max()
        .unwrap_or(0);
    // Give the job the bound and a little more; the checker judges the bound itself.
    let whole = runner.wait_whole(stopped, after, bound + Duration::from_secs(2));
    say(&format!(
        "faults stopped; job whole again {}",
        match whole {
            Some(t) => format!(
                "after {:.1} s",
                Duration::from_nanos(t - stopped).as_secs_f64()
            ),
            None => "never".to_string(),
        }
    ));
    let (closed, failed) = runner.close();
    let left = runner.left_behind();
    let run = runner.snapshot(closed);
    let result = checker::check(&run).and_then(|report| match left {
        Ok(()) => Ok(report),
        Err(keys) => Err(Violation {
            t: now(),
            invariant: "nothing left behind",
            message: format!(
                "every node is gone and every lease of theirs has expired, but the run still \
                 holds more than its closed marker: {keys:?}"
            ),
        }),
    });
    let mut result = result.map(|report| {
        say(&format!(
            "run took {:.0} s in all\n{report}",
            started.elapsed().as_secs_f64()
        ));
        report
    });
    if result.is_ok() && !(failed.is_empty() && runner.unexpected_exits.is_empty()) {
        result = Err(Violation {
            t: closed,
            invariant: "exits",
            message: format!(
                "nodes must run until the run is closed and then exit 0: exited on their own \
                 (slot, code) {:?}, after the close {:?}",
                runner.unexpected_exits, failed
            ),
        });
    }
    match &result {
        Ok(_) if std::env::var_os("RDZV_CHAOS_KEEP").is_none() => {
            let _ = std::fs::remove_dir_all(&runner.dir);
        }
        _ => say(&format!(
            "histories, node logs and faults kept in {} (seed {seed})",
            runner.dir.display()
        )),
    }
    if result.is_err() || std::env::var_os("RDZV_CHAOS_KEEP").is_some() {
        save(&run, &runner.histories, &runner.dir.join("run.json"));
    }
    result
}

/// Writes what the histories do not hold (parameters, processes, faults) next to them, so
/// that `recheck` can judge a kept run again.
fn save(run: &Run, histories: &[PathBuf], path: &Path) {
    let processes: Vec<Value> = run
        .processes
        .iter()
        .zip(histories)
        .map(|(p, h)| {
            json!({
                "slot": p.slot,
                "history": h.file_name().unwrap().to_string_lossy(),
                "spawned": p.spawned,
                "ended": p.ended,
            })
        })
        .collect();
    let faults: Vec<Value> = run
        .faults
        .iter()
        .map(|f| {
            json!({
                "episode": f.episode,
                "kind": format!("{:?}", f.kind),
                "target": f.target,
                "node": f.node,
                "injected": f.injected,
                "healed": f.healed,
            })
        })
        .collect();
    let saved = json!({
        "lease_ttl": run.lease_ttl.as_secs_f64(),
        "last_call": run.last_call.as_secs_f64(),
        "slack": run.slack.as_secs_f64(),
        "faults_stopped": run.faults_stopped,
        "run_lost": run.run_lost,
        "closed": run.closed,
        "processes": processes,
        "faults": faults,
    });
    std::fs::write(path, serde_json::to_string_pretty(&saved).unwrap()).unwrap();
}

/// Loads a run kept in `dir` (its `run.json` and the histories it names).
pub fn load(dir: &Path) -> Run {
    let text = std::fs::read_to_string(dir.join("run.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("run.json").display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let secs = |k: &str| Duration::from_secs_f64(v[k].as_f64().unwrap());
    let processes = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let history = dir.join(p["history"].as_str().unwrap());
            let events = parse_history(&std::fs::read_to_string(&history).unwrap()).unwrap();
            Process {
                slot: p["slot"].as_u64().unwrap() as usize,
                node: events.first().map(|e| e.node.clone()),
                spawned: p["spawned"].as_u64().unwrap(),
                ended: p["ended"].as_u64(),
                events,
            }
        })
        .collect();
    let faults = v["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| Fault {
            episode: f["episode"].as_u64().unwrap() as usize,
            kind: *FaultKind::ALL
                .iter()
                .find(|k| format!("{k:?}") == f["kind"].as_str().unwrap())
                .unwrap(),
            target: f["target"].as_u64().unwrap() as usize,
            node: f["node"].as_str().map(str::to_string),
            injected: f["injected"].as_u64().unwrap(),
            healed: f["healed"].as_u64().unwrap(),
        })
        .collect();
    Run {
        lease_ttl: secs("lease_ttl"),
        last_call: secs("last_call"),
        slack: secs("slack"),
        processes,
        faults,
        faults_stopped: v["faults_stopped"].as_u64().unwrap(),
        run_lost: v["run_lost"]
            .as_array()
            .map(|lost| lost.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default(),
        closed: v["closed"].as_u64().unwrap(),
    }
}
