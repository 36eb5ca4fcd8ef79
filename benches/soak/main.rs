//! Many jobs on one etcd, for a long time: `runs` jobs of `nodes` in-process nodes each, all at
//! once, with churn, for `duration`. Every node is an agent as torch's is: it forms a round,
//! makes a torch job's store traffic in it (`common/torch.rs`), then checks `num_lost` and
//! `num_waiting` every monitor interval and joins again when either is non-zero. Each job's
//! controller makes, at random intervals, one of: a node killed (its handle dropped without
//! shutdown: its lease keeper stops as with SIGKILL, and etcd expires its keys after
//! `lease_ttl`), a node leaving (shutdown), a node drained (`Admin::drain`), a restart of
//! every worker (all join again); a replacement follows each departure. Jobs end at a random
//! time, whatever state they are in (exit barrier and shutdown when whole, shutdown alone
//! otherwise; half of them closed), and a new job takes each one's place.
//!
//! Printed: a round's time (the last member's call of next to the last member's return) for
//! one job alone first, then under the load of all, as each job's ratio to the job alone; the
//! same with a scheduler watching every job's status (`Admin`, from a process of
//! its own) half of the time, in turns of `--alternate` (the scheduler's cost is each job's
//! rounds with it against its own rounds without; the rounds formed while jobs still arrive
//! count for neither); etcd's database size, raft proposals and CPU over time, and its
//! requests by method; calls that failed (should be none); and the keys left under the prefix
//! once every job ended and `lease_ttl` passed (should be `closed` markers alone). Exits 1 if
//! a call failed, a job got stuck, keys other than `closed` were left or the database in use
//! grew in the last third of the run past its bound (`DbSeen::bounded`). Run it with
//! `scripts/soak.sh`.

use rdzv::admin::Admin;
use rdzv::{ErrorKind, Params, Rendezvous};
use rdzv_bench::stats::{ms, percentile};
use rdzv_bench::torch;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

const USAGE: &str = "usage: soak ENDPOINT[,ENDPOINT...] [--runs 100] [--nodes 8] \
    [--duration 3m] [--solo 60s] [--alternate 30s] [--lease-ttl 5] [--monitor 1] [--prefix /soak]
    [--max-ratio 3] [--max-scheduler-cost 0.10] [--scheduler-poll SECONDS]";
// (`soak ENDPOINT --scheduler` is the scheduler's own process: see `scheduler_main`.)

struct Config {
    endpoints: String,
    runs: usize,
    nodes: usize,
    duration: Duration,
    solo: Duration,
    /// How long each turn of the scheduler off, then on, lasts.
    alternate: Duration,
    lease_ttl: u64,
    monitor: Duration,
    prefix: String,
    /// Fail unless each job's median round under the load of all is at most this many times
    /// the job alone's (median over the jobs).
    max_ratio: Option<f64>,
    /// Fail unless the scheduler watching every job adds at most this fraction to that ratio.
    max_scheduler_cost: Option<f64>,
    /// The scheduler also reads every job's status this often (`rdzv status` in a loop), beside
    /// its watch; by default it only watches, as a scheduler of the watch API need do.
    scheduler_poll: Option<Duration>,
}

fn parse_duration(s: &str) -> Duration {
    let (number, unit) = s.split_at(s.find(|c: char| c.is_alphabetic()).unwrap_or(s.len()));
    let n: f64 = number
        .parse()
        .unwrap_or_else(|_| usage(&format!("not a duration: {s}")));
    let scale = match unit {
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => usage(&format!("not a duration: {s} (90s, 3m, 1h)")),
    };
    Duration::from_secs_f64(n * scale)
}

fn usage(why: &str) -> ! {
    eprintln!("soak: {why}\n{USAGE}");
    std::process::exit(2)
}

fn config() -> Config {
    let mut args = std::env::args().skip(1);
    let endpoints = args
        .next()
        .filter(|a| !a.starts_with('-'))
        .unwrap_or_else(|| usage("no endpoint"));
    let mut c = Config {
        endpoints,
        runs: 100,
        nodes: 8,
        duration: Duration::from_secs(180),
        solo: Duration::from_secs(60),
        alternate: Duration::from_secs(30),
        lease_ttl: 5,
        monitor: Duration::from_secs(1),
        prefix: "/soak".into(),
        max_ratio: None,
        max_scheduler_cost: None,
        scheduler_poll: None,
    };
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| usage(&format!("{flag}: not a number: {value}")))
        };
        let fraction = || -> f64 {
            value
                .parse()
                .ok()
                .filter(|v: &f64| *v > 0.0)
                .unwrap_or_else(|| {
                    usage(&format!("{flag}: expected a positive number, got {value}"))
                })
        };
        match flag.as_str() {
            "--runs" => c.runs = number(),
            "--nodes" => c.nodes = number().max(2),
            "--duration" => c.duration = parse_duration(&value),
            "--solo" => c.solo = parse_duration(&value),
            "--alternate" => c.alternate = parse_duration(&value).max(Duration::from_secs(1)),
            "--lease-ttl" => c.lease_ttl = number().max(1) as u64,
            "--monitor" => c.monitor = parse_duration(&value),
            "--prefix" => c.prefix = value,
            "--max-ratio" => c.max_ratio = Some(fraction()),
            "--max-scheduler-cost" => c.max_scheduler_cost = Some(fraction()),
            "--scheduler-poll" => c.scheduler_poll = Some(Duration::from_secs_f64(fraction())),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    c
}

/// A random number in [0, 1), from a small xorshift seeded by the clock (the schedule need not
/// be replayable: the soak checks outcomes, not a particular sequence).
fn random() -> f64 {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u64> = Cell::new(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
            | 1
    ));
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

fn between(low: f64, high: f64) -> Duration {
    Duration::from_secs_f64(low + (high - low) * random())
}

/// When a round was measured: one job alone, or all of them with or without the observer;
/// or while the jobs were still arriving (until every one formed a round), which is neither
/// (its lighter load once made the first turn without the scheduler look faster).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Load {
    Alone,
    Ramp,
    All,
    Observed,
}

/// Everything the jobs report, shared.
#[derive(Default)]
struct Stats {
    /// (load, job, what formed the round, round time)
    rounds: Mutex<Vec<(Load, u64, &'static str, Duration)>>,
    failures: Mutex<Vec<String>>,
    events: Mutex<BTreeMap<&'static str, u64>>,
    observed_statuses: AtomicU64,
    /// Jobs still to form their first round before the ramp ends.
    arriving: AtomicU64,
}

impl Stats {
    fn fail(&self, what: String) {
        eprintln!("soak: FAILED {what}");
        self.failures.lock().unwrap().push(what);
    }
    fn count(&self, event: &'static str) {
        *self.events.lock().unwrap().entry(event).or_default() += 1;
    }
}

/// What a node tells its job's controller.
enum Report {
    /// Returned from next: its round, that round's world size, and when it called and returned.
    Formed {
        node: usize,
        round: u64,
        world: u32,
        called: Instant,
        returned: Instant,
    },
    /// Done with its round's store traffic: it runs (supervises its workers) now.
    Running { node: usize, round: u64 },
    /// It stopped running its round to join a new one.
    Rejoining { node: usize },
    /// Its part of the exit barrier failed.
    BarrierFailed { node: usize, error: String },
    /// Its agent ended (shut down, drained, closed, or failed), and why.
    Ended { node: usize, why: &'static str },
}

/// How a controller stops a node.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    Run,
    /// The job ended while whole: exit barrier, then shutdown.
    Barrier,
    /// Shutdown now (a node leaving, or a job ending mid-change).
    Now,
}

/// The agent of one node: rounds, store traffic, supervision, until stopped or drained.
#[allow(clippy::too_many_arguments)]
async fn agent(
    node: Arc<Rendezvous>,
    index: usize,
    job: u64,
    reports: mpsc::UnboundedSender<Report>,
    mut stop: watch::Receiver<Stop>,
    mut restarts: watch::Receiver<u64>,
    monitor: Duration,
    stats: Arc<Stats>,
) {
    let stopping = |stop: &watch::Receiver<Stop>| *stop.borrow() != Stop::Run;
    let fail = |what: &str, e: &rdzv::Error| {
        stats.fail(format!(
            "job {job} node {index} ({}): {what}: {e}",
            node.node_id()
        ))
    };
    let ended = 'rounds: loop {
        let called = Instant::now();
        let (info, store) = match node.next().await {
            Ok(got) => got,
            // Drained: its next ends with a graceful exit, as the design says.
            Err(e) if e.kind() == ErrorKind::GracefulExit => break "drained",
            Err(e)
                if stopping(&stop)
                    && matches!(e.kind(), ErrorKind::Shutdown | ErrorKind::Closed) =>
            {
                break "stopped in next";
            }
            Err(e) => {
                fail("next", &e);
                break "next failed";
            }
        };
        let _ = reports.send(Report::Formed {
            node: index,
            round: info.round,
            world: info.world_size,
            called,
            returned: Instant::now(),
        });
        if stopping(&stop) {
            break "stopped as its round formed";
        }
        restarts.borrow_and_update();
        if let Err(e) = torch::bootstrap(&store, info.rank, info.world_size).await {
            // A member that left (or was killed) before the traffic ended leaves the others'
            // gets waiting: the next round repeats it, and only a stopping node is excused.
            if !stopping(&stop) {
                fail("store traffic", &e);
            }
            break "store traffic failed";
        }
        let _ = reports.send(Report::Running {
            node: index,
            round: info.round,
        });
        let why = loop {
            tokio::select! {
                _ = stop.changed() => {
                    if *stop.borrow() == Stop::Barrier {
                        if let Err(e) = torch::exit_barrier(&store, info.rank, info.world_size).await {
                            // Judged by the controller: a member that was joining a new round
                            // as the job ended cannot take part.
                            let error = format!("{e}");
                            let _ = reports.send(Report::BarrierFailed { node: index, error });
                        }
                        break 'rounds "exit barrier";
                    }
                    break 'rounds "stopped while running";
                }
                _ = restarts.changed() => break "restart",
                _ = tokio::time::sleep(monitor) => {}
            }
            let lost = node.num_lost().await;
            let waiting = node.num_waiting().await;
            match (lost, waiting) {
                (Ok(0), Ok(0)) => {}
                (Ok(0), Ok(_)) => break "num_waiting > 0",
                (Ok(_), Ok(_)) => break "num_lost > 0",
                (Err(e), _) | (_, Err(e)) => {
                    if !stopping(&stop) {
                        fail("num_lost/num_waiting", &e);
                    }
                    break 'rounds "num_lost/num_waiting failed";
                }
            }
        };
        stats.count(match why {
            "restart" => "agent rejoined: restart",
            "num_lost > 0" => "agent rejoined: num_lost > 0",
            _ => "agent rejoined: num_waiting > 0",
        });
        let _ = reports.send(Report::Rejoining { node: index });
        if stopping(&stop) {
            break "stopped as it rejoined";
        }
    };
    if let Err(e) = node.shutdown().await {
        fail("shutdown", &e);
    }
    let _ = reports.send(Report::Ended {
        node: index,
        why: ended,
    });
}

/// How a churn event ended.
enum Churn {
    /// The job is whole again.
    Whole,
    /// The job's end came first.
    Ended,
    /// Not whole again within the patience given.
    Stuck,
}

/// A node of a job as its controller holds it.
struct Member {
    node: Arc<Rendezvous>,
    task: tokio::task::JoinHandle<()>,
    stop: watch::Sender<Stop>,
    /// The round it runs in (done with the round's store traffic), if any.
    running: Option<u64>,
    /// The world size of the last round it formed.
    world: u32,
}

/// One job from start to end: its controller.
struct Job {
    id: u64,
    url: String,
    params: Params,
    members: HashMap<usize, Member>,
    next_index: usize,
    reports_tx: mpsc::UnboundedSender<Report>,
    reports: mpsc::UnboundedReceiver<Report>,
    restarts: watch::Sender<u64>,
    /// Round → (world, the members' (called, returned)).
    forming: HashMap<u64, (u32, Vec<(Instant, Instant)>)>,
    load: Arc<Mutex<Load>>,
    stats: Arc<Stats>,
    monitor: Duration,
    /// A member left its round or formed a new one since the job was told to end.
    changed_since_stop: bool,
    /// What the next round forms for: the job's start or the last change made.
    forming_for: &'static str,
    /// Whether the job has formed a round yet.
    formed_once: bool,
    barrier_failures: Vec<String>,
    /// How each member ended, once the job is told to end (named in a failure).
    ended: Vec<String>,
}

impl Job {
    async fn start(id: u64, cfg: &Config, load: Arc<Mutex<Load>>, stats: Arc<Stats>) -> Job {
        let url = format!(
            "etcd://{}/soak-{id}?min_nodes={}&max_nodes={}&lease_ttl={}&last_call_timeout=2\
             &join_timeout=600&store_timeout=60&key_prefix={}",
            cfg.endpoints,
            cfg.nodes / 2,
            cfg.nodes,
            cfg.lease_ttl,
            cfg.prefix
        );
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let mut job = Job {
            id,
            params: Params::from_url(&url).unwrap(),
            url,
            members: HashMap::new(),
            next_index: 0,
            reports_tx,
            reports,
            restarts: watch::Sender::new(0),
            forming: HashMap::new(),
            load,
            stats,
            monitor: cfg.monitor,
            changed_since_stop: false,
            forming_for: "job start",
            formed_once: false,
            barrier_failures: Vec::new(),
            ended: Vec::new(),
        };
        for _ in 0..cfg.nodes {
            job.spawn().await;
        }
        job
    }

    /// A new node, and its agent.
    async fn spawn(&mut self) -> bool {
        let node = match Rendezvous::new(self.params.clone()).await {
            Ok(node) => Arc::new(node),
            Err(e) => {
                self.stats.fail(format!("job {}: a new node: {e}", self.id));
                return false;
            }
        };
        let index = self.next_index;
        self.next_index += 1;
        let (stop, stop_rx) = watch::channel(Stop::Run);
        let task = tokio::spawn(agent(
            node.clone(),
            index,
            self.id,
            self.reports_tx.clone(),
            stop_rx,
            self.restarts.subscribe(),
            self.monitor,
            self.stats.clone(),
        ));
        self.members.insert(
            index,
            Member {
                node,
                task,
                stop,
                running: None,
                world: 0,
            },
        );
        true
    }

    fn handle(&mut self, report: Report) {
        match report {
            Report::Formed {
                node,
                round,
                world,
                called,
                returned,
            } => {
                self.changed_since_stop = true;
                if let Some(m) = self.members.get_mut(&node) {
                    m.running = None;
                    m.world = world;
                }
                let entry = self.forming.entry(round).or_insert((world, Vec::new()));
                entry.1.push((called, returned));
                if entry.1.len() == world as usize {
                    let (_, times) = self.forming.remove(&round).unwrap();
                    let last_call = times.iter().map(|t| t.0).max().unwrap();
                    let last_return = times.iter().map(|t| t.1).max().unwrap();
                    let mut load = self.load.lock().unwrap();
                    self.stats.rounds.lock().unwrap().push((
                        *load,
                        self.id,
                        self.forming_for,
                        last_return - last_call,
                    ));
                    // The last of the arriving jobs to form a round ends the ramp.
                    let first = !std::mem::replace(&mut self.formed_once, true);
                    let arriving = &self.stats.arriving;
                    if first && *load == Load::Ramp && arriving.fetch_sub(1, Relaxed) == 1 {
                        *load = Load::All;
                    }
                }
                // Rounds two behind can no longer complete their count (a member killed in
                // them): forget them.
                self.forming.retain(|r, _| *r + 2 > round);
            }
            Report::Running { node, round } => {
                if let Some(m) = self.members.get_mut(&node) {
                    m.running = Some(round);
                }
            }
            Report::Rejoining { node } => {
                self.changed_since_stop = true;
                if let Some(m) = self.members.get_mut(&node) {
                    m.running = None;
                }
            }
            Report::BarrierFailed { node, error } => {
                self.barrier_failures.push(format!("node {node}: {error}"));
            }
            Report::Ended { node, why } => {
                if let Some(m) = self.members.remove(&node) {
                    self.ended
                        .push(format!("node {node} in round {:?}: {why}", m.running));
                }
            }
        }
    }

    /// The round every member runs in, if they all run in one round of exactly them (a
    /// round some member of which was killed is not whole).
    fn whole(&self) -> Option<u64> {
        let first = self.members.values().next()?;
        let round = first.running?;
        let all = self.members.values().all(|m| m.running == Some(round));
        (all && first.world as usize == self.members.len()).then_some(round)
    }

    /// `size` members run in one round later than `after`.
    fn whole_after(&self, size: usize, after: u64) -> bool {
        self.members.len() == size && self.whole().is_some_and(|r| r > after)
    }

    /// Handles reports until `done` holds or `until`; false at `until`.
    async fn wait_for(&mut self, until: Instant, done: impl Fn(&Job) -> bool) -> bool {
        while !done(self) {
            match tokio::time::timeout_at(until, self.reports.recv()).await {
                Ok(Some(report)) => self.handle(report),
                Ok(None) | Err(_) => return false,
            }
        }
        true
    }

    fn pick(&self) -> usize {
        let keys: Vec<usize> = self.members.keys().copied().collect();
        keys[(random() * keys.len() as f64) as usize % keys.len()]
    }

    /// One churn event on a whole job; waits until the job is whole again (at most
    /// `patience`), or until `end`, when the job ends whatever its state.
    async fn churn(&mut self, patience: Duration, end: Instant) -> Churn {
        let stuck = Instant::now() + patience;
        let until = stuck.min(end);
        let size = self.members.len();
        let Some(before) = self.whole() else {
            return Churn::Stuck;
        };
        let outcome = |whole: bool| match whole {
            true => Churn::Whole,
            false if Instant::now() >= end && end < stuck => Churn::Ended,
            false => Churn::Stuck,
        };
        let x = random();
        let departed = if x < 0.25 {
            // Killed: no shutdown, its lease runs out.
            self.stats.count("node killed");
            self.forming_for = "node killed";
            let m = self.members.remove(&self.pick()).unwrap();
            m.task.abort();
            drop(m);
            true
        } else if x < 0.45 {
            self.stats.count("node left (shutdown)");
            self.forming_for = "node left";
            let m = &self.members[&self.pick()];
            let _ = m.stop.send(Stop::Now);
            if let Err(e) = m.node.shutdown().await {
                self.stats.fail(format!("job {}: shutdown: {e}", self.id));
            }
            true
        } else if x < 0.65 {
            self.stats.count("node drained");
            self.forming_for = "node drained";
            let node = self.members[&self.pick()].node.node_id().to_string();
            match Admin::connect(self.params.clone()).await {
                Ok(admin) => {
                    if let Err(e) = admin.drain(&node, "soak").await {
                        self.stats
                            .fail(format!("job {}: drain {node}: {e}", self.id));
                    }
                }
                Err(e) => self.stats.fail(format!("job {}: admin: {e}", self.id)),
            }
            true
        } else {
            self.stats.count("restart (every node joins again)");
            self.forming_for = "restart";
            self.restarts.send_modify(|g| *g += 1);
            false
        };
        if !departed {
            return outcome(self.wait_for(until, |j| j.whole_after(size, before)).await);
        }
        // The others form without it, then a replacement joins and they form with it.
        if !self
            .wait_for(until, |j| j.whole_after(size - 1, before))
            .await
        {
            return outcome(false);
        }
        let without = self.whole().unwrap_or(before);
        self.stats.count("replacement joined");
        self.forming_for = "replacement joined";
        self.spawn().await;
        outcome(self.wait_for(until, |j| j.whole_after(size, without)).await)
    }

    /// Ends the job: exit barrier when whole, else shutdown now; closed half of the time
    /// (by a scheduler's `Admin::close`, after the nodes were told to stop).
    async fn end(mut self) {
        let whole = self.whole().is_some();
        let close = random() < 0.5;
        self.stats.count(match (whole, close) {
            (true, true) => "job ended whole, closed",
            (true, false) => "job ended whole",
            (false, true) => "job ended mid-change, closed",
            (false, false) => "job ended mid-change",
        });
        let stop = if whole && !close {
            Stop::Barrier
        } else {
            Stop::Now
        };
        self.changed_since_stop = false;
        self.ended.clear();
        // Told first: a node that sees the close (its next ends with closed) is stopping.
        for m in self.members.values() {
            let _ = m.stop.send(stop);
        }
        if close {
            let closed = match Admin::connect(self.params.clone()).await {
                Ok(admin) => admin.close().await,
                Err(e) => Err(e),
            };
            if let Err(e) = closed {
                self.stats.fail(format!("job {}: close: {e}", self.id));
            }
        }
        if stop == Stop::Now {
            for m in self.members.values() {
                // Wakes a node blocked in next or in a store wait.
                if let Err(e) = m.node.shutdown().await {
                    self.stats.fail(format!("job {}: shutdown: {e}", self.id));
                }
            }
        }
        let until = Instant::now() + Duration::from_secs(90);
        if !self.wait_for(until, |j| j.members.is_empty()).await {
            self.stats.fail(format!(
                "job {}: {} node(s) did not stop within 90 s",
                self.id,
                self.members.len()
            ));
        }
        // An exit barrier fails for the others when a member was joining a new round as the
        // job ended (its membership changed: torch's barrier times out then too); otherwise
        // it must not.
        if !self.barrier_failures.is_empty() {
            match self.changed_since_stop {
                true => self
                    .stats
                    .count("exit barrier cut short by a membership change"),
                false => {
                    for f in std::mem::take(&mut self.barrier_failures) {
                        self.stats
                            .fail(format!("job {}: exit barrier: {f}", self.id));
                    }
                    self.stats.fail(format!(
                        "job {}: how its nodes ended: {}",
                        self.id,
                        self.ended.join("; ")
                    ));
                }
            }
        }
        for (_, m) in self.members.drain() {
            m.task.abort();
        }
    }
}

/// A scheduler's view of one job: its status watched (`rdzv status --watch`), and read every
/// `poll` if given (`rdzv status`), until aborted.
async fn observe(id: u64, url: String, poll: Option<Duration>, statuses: Arc<AtomicU64>) {
    let fail = |what: &str, e: rdzv::Error| println!("FAILED job {id}: scheduler's {what}: {e}");
    let admin = match Admin::connect(Params::from_url(&url).unwrap()).await {
        Ok(a) => a,
        Err(e) => return fail("connect", e),
    };
    let mut watch = admin.watch();
    let mut poll = poll.map(tokio::time::interval);
    loop {
        let tick = async {
            match poll.as_mut() {
                Some(poll) => _ = poll.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            got = watch.next() => match got {
                Ok(_) => { statuses.fetch_add(1, Relaxed); }
                Err(e) => return fail("watch", e),
            },
            _ = tick => match admin.status().await {
                Ok(_) => { statuses.fetch_add(1, Relaxed); }
                Err(e) => return fail("status", e),
            },
        }
    }
}

/// `soak ENDPOINT --scheduler`: observes the jobs named on stdin (`+ID URL` to start, `-ID`
/// to stop) until stdin ends, then prints `STATUSES N`. Its failures are printed as they
/// happen, as `FAILED ...` lines.
fn scheduler_main() {
    let poll = std::env::args()
        .nth(3)
        .and_then(|secs| secs.parse().ok())
        .map(Duration::from_secs_f64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let statuses = Arc::new(AtomicU64::new(0));
    let (lines_tx, mut lines) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    rt.block_on(async {
        let mut observers: HashMap<u64, tokio::task::JoinHandle<()>> = HashMap::new();
        while let Some(line) = lines.recv().await {
            if let Some(rest) = line.strip_prefix('+') {
                let (id, url) = rest.split_once(' ').expect("+ID URL");
                let id: u64 = id.parse().expect("a job id");
                let observer = observe(id, url.to_string(), poll, statuses.clone());
                let task = tokio::spawn(observer);
                observers.insert(id, task);
            } else if let Some(id) = line.strip_prefix('-') {
                if let Some(task) = observers.remove(&id.parse().expect("a job id")) {
                    task.abort();
                }
            }
        }
        for task in observers.into_values() {
            task.abort();
        }
    });
    println!("STATUSES {}", statuses.load(Relaxed));
}

/// The scheduler's process while it runs, and the jobs it is told about.
#[derive(Default)]
struct Scheduler {
    jobs: Mutex<HashMap<u64, String>>,
    process: Mutex<Option<SchedulerProcess>>,
}

struct SchedulerProcess {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    output: std::thread::JoinHandle<Vec<String>>,
}

impl Scheduler {
    fn tell(&self, line: &str) {
        use std::io::Write;
        if let Some(p) = self.process.lock().unwrap().as_mut() {
            let _ = writeln!(p.stdin, "{line}");
        }
    }

    /// The scheduler's process id while it runs.
    fn pid(&self) -> Option<u32> {
        self.process.lock().unwrap().as_ref().map(|p| p.child.id())
    }

    fn job_started(&self, id: u64, url: &str) {
        let mut jobs = self.jobs.lock().unwrap();
        jobs.insert(id, url.to_string());
        self.tell(&format!("+{id} {url}"));
    }

    fn job_ended(&self, id: u64) {
        let mut jobs = self.jobs.lock().unwrap();
        jobs.remove(&id);
        self.tell(&format!("-{id}"));
    }

    /// Starts the scheduler's process, watching every job there is.
    fn start(&self, endpoints: &str, poll: Option<Duration>) {
        use std::process::{Command, Stdio};
        let jobs = self.jobs.lock().unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([endpoints, "--scheduler"])
            .args(poll.map(|p| p.as_secs_f64().to_string()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the scheduler's process");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let output = std::thread::spawn(move || {
            use std::io::BufRead;
            std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect()
        });
        *self.process.lock().unwrap() = Some(SchedulerProcess {
            child,
            stdin,
            output,
        });
        for (id, url) in jobs.iter() {
            self.tell(&format!("+{id} {url}"));
        }
    }

    /// Stops the scheduler's process; counts the statuses it read and its failures.
    fn stop(&self, stats: &Stats) {
        let Some(p) = self.process.lock().unwrap().take() else {
            return;
        };
        let SchedulerProcess {
            mut child,
            stdin,
            output,
        } = p;
        drop(stdin);
        for line in output.join().unwrap_or_default() {
            if let Some(n) = line.strip_prefix("STATUSES ") {
                stats
                    .observed_statuses
                    .fetch_add(n.parse().unwrap_or(0), Relaxed);
            } else if let Some(failure) = line.strip_prefix("FAILED ") {
                stats.fail(failure.to_string());
            }
        }
        let _ = child.wait();
    }
}

/// One job slot: jobs one after another until `until`, each living 30-90 s.
async fn slot(
    cfg: Arc<Config>,
    first_id: u64,
    until: Instant,
    load: Arc<Mutex<Load>>,
    scheduler: Arc<Scheduler>,
    stats: Arc<Stats>,
    ids: Arc<AtomicU64>,
) {
    let mut id = first_id;
    while Instant::now() < until {
        let mut job = Job::start(id, &cfg, load.clone(), stats.clone()).await;
        stats.count("job started");
        scheduler.job_started(id, &job.url);
        let end = (Instant::now() + between(30.0, 90.0)).min(until);
        let patience = Duration::from_secs(3 * cfg.lease_ttl + 60);
        let size = cfg.nodes;
        let whole = job
            .wait_for(Instant::now() + patience, |j| {
                j.members.len() == size && j.whole().is_some()
            })
            .await;
        if !whole {
            stats.fail(format!("job {id}: round 0 never formed"));
        } else {
            loop {
                let pause = between(2.0, 6.0);
                if Instant::now() + pause >= end {
                    // Reports still count while it waits to end.
                    let _ = job.wait_for(end, |_| false).await;
                    break;
                }
                let _ = job.wait_for(Instant::now() + pause, |_| false).await;
                match job.churn(patience, end).await {
                    Churn::Whole => {}
                    Churn::Ended => break,
                    Churn::Stuck => {
                        stats.fail(format!(
                            "job {id}: not whole again within {} s of a change",
                            patience.as_secs()
                        ));
                        break;
                    }
                }
            }
        }
        job.end().await;
        scheduler.job_ended(id);
        id = ids.fetch_add(1, Relaxed);
    }
}

/// One value of etcd's metrics from one member (as the bench reads them).
async fn member_metric(endpoint: &str, name: &str) -> Option<f64> {
    metric_in(&member_metrics(endpoint).await, name)
}

/// One member's metrics page (empty if it does not answer within 5 s): read once for all
/// the values a sample needs.
async fn member_metrics(endpoint: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut conn = tokio::net::TcpStream::connect(endpoint).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut body = String::new();
        conn.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The value of metric `name` (without labels) in a metrics page.
fn metric_in(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

/// The requests a metrics page counts, by gRPC method: unary calls handled (any outcome) and
/// messages received on streams (a keep-alive or a watch request each).
fn requests_by_method(page: &str) -> BTreeMap<String, f64> {
    let mut by_method = BTreeMap::new();
    for line in page.lines() {
        let Some(labels) = line
            .strip_prefix("grpc_server_handled_total{")
            .or_else(|| line.strip_prefix("grpc_server_msg_received_total{"))
        else {
            continue;
        };
        let stream = line.starts_with("grpc_server_msg_received_total");
        let unary = labels.contains("grpc_type=\"unary\"");
        // A unary call is counted once, by the handled counter.
        if stream == unary {
            continue;
        }
        let method = labels
            .split_once("grpc_method=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(method, _)| method);
        let value = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse::<f64>().ok());
        if let (Some(method), Some(value)) = (method, value) {
            *by_method.entry(method.to_string()).or_default() += value;
        }
    }
    by_method
}

/// The requests of every member, by method, summed; and the raft proposals committed, as the
/// first member counts them (every member commits every proposal). One page per member.
async fn cluster_requests(endpoints: &[String]) -> (BTreeMap<String, f64>, Option<f64>) {
    let mut all = BTreeMap::new();
    let mut proposals = None;
    for (i, e) in endpoints.iter().enumerate() {
        let page = member_metrics(e).await;
        if i == 0 {
            proposals = metric_in(&page, "etcd_server_proposals_committed_total");
        }
        for (method, n) in requests_by_method(&page) {
            *all.entry(method).or_default() += n;
        }
    }
    (all, proposals)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

/// CPU time a process has used (user and system), from /proc (Linux).
fn process_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis: utime and stime are the 12th and
    // 13th of them, in clock ticks.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// Rates of counters between two samples, by name.
#[derive(Default)]
struct Rates(HashMap<String, (Instant, f64)>);

impl Rates {
    fn per_second(&mut self, name: String, now: Option<f64>) -> Option<f64> {
        let now = now?;
        let (then, before) = self.0.insert(name, (Instant::now(), now))?;
        // A counter that went back belongs to a restarted process.
        (now >= before).then(|| (now - before) / then.elapsed().as_secs_f64())
    }
}

/// What the sampler saw of etcd's database: the largest file, the size in use (what
/// compaction keeps bounded) at each sample, in order, and how many compactions it saw.
struct DbSeen {
    largest: f64,
    in_use: Vec<f64>,
    compactions: usize,
}

impl DbSeen {
    /// Whether compaction kept the database bounded: at least two compactions during the run
    /// (without them there is nothing to judge, and a run that cannot judge fails: give a
    /// `--retention` of at most a third of the run), and the size in use in the last third no
    /// more than 1.25 times the largest in the middle third, plus 256 KiB (one retention
    /// period's writes come and go between compactions). A database that grows at a steady
    /// rate, compacted or not, grows from the middle third to the last; comparing with the
    /// whole run before the last third, as this did, let any steady growth pass. Returns the
    /// verdict's line and whether it holds.
    fn bounded(&self) -> (String, bool) {
        let n = self.in_use.len();
        if n < 6 || self.compactions < 2 {
            return (
                format!(
                    "database bound: NOT JUDGED ({n} samples, {} compactions: give --retention \
                     at most a third of --duration)",
                    self.compactions
                ),
                false,
            );
        }
        let max = |s: &[f64]| s.iter().cloned().fold(0.0, f64::max);
        let middle = max(&self.in_use[n / 3..n * 2 / 3]);
        let last = max(&self.in_use[n * 2 / 3..]);
        let bound = middle * 1.25 + 256.0 * 1024.0;
        let holds = last <= bound;
        (
            format!(
                "database bound: in use at most {} in the last third, against {} in the middle third (bound {}, {} compactions): {}",
                mib(last),
                mib(middle),
                mib(bound),
                self.compactions,
                if holds { "held" } else { "EXCEEDED" }
            ),
            holds,
        )
    }
}

/// etcd's database size per member, its raft proposals, CPU, leader changes and slow applies,
/// the CPU of this process and of the scheduler's, and the rounds formed since the last line
/// with their median, printed every 10 s (a slowdown that grows over a run shows when it
/// began, and beside what); returns what it saw of the database.
async fn sample_db(
    endpoints: Vec<String>,
    started: Instant,
    done: Arc<AtomicBool>,
    scheduler: Arc<Scheduler>,
    stats: Arc<Stats>,
) -> DbSeen {
    let mut largest: f64 = 0.0;
    let mut in_use_seen = Vec::new();
    let (mut compactions, mut compacted_to) = (0, None);
    let mut rates = Rates::default();
    let mut rounds_seen = 0;
    while !done.load(Relaxed) {
        let mut line = format!("t={:>5.0}s", started.elapsed().as_secs_f64());
        let mut window: Vec<Duration> = {
            let rounds = stats.rounds.lock().unwrap();
            let window = rounds[rounds_seen.min(rounds.len())..]
                .iter()
                .map(|r| r.3)
                .collect();
            rounds_seen = rounds.len();
            window
        };
        window.sort();
        line += &format!(
            "  rounds {} (median {})",
            window.len(),
            ms(percentile(&window, 0.5), 1)
        );
        let own = rates.per_second("soak".into(), process_cpu("self"));
        let scheduler_cpu = match scheduler.pid() {
            Some(pid) => {
                rates.per_second(format!("scheduler {pid}"), process_cpu(&pid.to_string()))
            }
            None => None,
        };
        line += &format!("  cpu: nodes {:.2}", own.unwrap_or(0.0));
        if let Some(cpu) = scheduler_cpu {
            line += &format!(", scheduler {cpu:.2}");
        }
        for e in &endpoints {
            let page = member_metrics(e).await;
            let metric = |name| metric_in(&page, name);
            let cpu = metric("process_cpu_seconds_total");
            if let Some(cpu) = rates.per_second(format!("cpu {e}"), cpu) {
                line += &format!(", etcd {cpu:.2}");
            }
            let committed = metric("etcd_server_proposals_committed_total");
            if let Some(rate) = rates.per_second(format!("proposals {e}"), committed) {
                line += &format!("  {rate:.0} proposals/s");
            }
            // Counters since the member started: a step between two lines is an event.
            let leaders = metric("etcd_server_leader_changes_seen_total");
            let slow = metric("etcd_server_slow_apply_total");
            line += &format!(
                ", leader changes {:.0}, slow applies {:.0}",
                leaders.unwrap_or(-1.0),
                slow.unwrap_or(-1.0)
            );
            let size = metric("etcd_mvcc_db_total_size_in_bytes");
            let in_use = metric("etcd_mvcc_db_total_size_in_use_in_bytes");
            if let (true, Some(in_use)) = (e == &endpoints[0], in_use) {
                in_use_seen.push(in_use);
            }
            let revision = metric("etcd_debugging_mvcc_current_revision");
            let compacted = metric("etcd_debugging_mvcc_compact_revision");
            let keys = metric("etcd_debugging_mvcc_keys_total");
            if e == &endpoints[0] && compacted.is_some() {
                if compacted_to.is_some() && compacted > compacted_to {
                    compactions += 1;
                }
                compacted_to = compacted;
            }
            match (size, in_use) {
                (Some(size), Some(in_use)) => {
                    largest = largest.max(size);
                    line += &format!(
                        "  db {} (in use {}), keys {:.0}, revision {:.0}, compacted to {:.0}",
                        mib(size),
                        mib(in_use),
                        keys.unwrap_or(-1.0),
                        revision.unwrap_or(-1.0),
                        compacted.unwrap_or(-1.0)
                    );
                }
                _ => line += "  (member not answering)",
            }
        }
        println!("{line}");
        for _ in 0..100 {
            if done.load(Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    DbSeen {
        largest,
        in_use: in_use_seen,
        compactions,
    }
}

fn summarize(what: &str, times: &mut [Duration]) -> Duration {
    times.sort();
    let median = percentile(times, 0.5);
    println!(
        "{what:<34} {:>6} rounds  median {:>9}  p90 {:>9}  p99 {:>9}  max {:>9}",
        times.len(),
        ms(median, 1),
        ms(percentile(times, 0.9), 1),
        ms(percentile(times, 0.99), 1),
        ms(times.last().copied().unwrap_or_default(), 1)
    );
    median
}

/// Each job's median round time over the job alone's: median, p90 and worst of the ratios.
fn ratios(
    what: &str,
    rounds: &[(Load, u64, &'static str, Duration)],
    load: Load,
    alone: Duration,
) -> Option<f64> {
    let mut per_job: HashMap<u64, Vec<Duration>> = HashMap::new();
    for (l, job, _, t) in rounds {
        if *l == load {
            per_job.entry(*job).or_default().push(*t);
        }
    }
    let mut ratios: Vec<f64> = per_job
        .into_values()
        .map(|mut t| {
            t.sort();
            percentile(&t, 0.5).as_secs_f64() / alone.as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    if ratios.is_empty() {
        return None;
    }
    let at = |p: f64| ratios[((ratios.len() - 1) as f64 * p).round() as usize];
    println!(
        "{what:<34} {:>6} jobs    each job's median round / alone: median {:.2}x  p90 {:.2}x  max {:.2}x",
        ratios.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    );
    Some(at(0.5))
}

/// The scheduler's cost, each job against itself: for every job with at least 3 rounds in
/// turns with the scheduler and 3 without, its median round with it over its median without,
/// minus one. Returns the median over those jobs, with their p10 and p90 and count. A job's
/// size, churn and machine load are the same on both sides of its ratio, so what is left is
/// the scheduler's; comparing the medians of all jobs instead mixes in which jobs (and which
/// changes) happened to fall in which turns.
fn paired_cost(rounds: &[(Load, u64, &'static str, Duration)]) -> Option<(f64, f64, f64, usize)> {
    let mut per_job: HashMap<u64, (Vec<Duration>, Vec<Duration>)> = HashMap::new();
    for (load, job, _, t) in rounds {
        let sides = per_job.entry(*job).or_default();
        match load {
            Load::All => sides.0.push(*t),
            Load::Observed => sides.1.push(*t),
            _ => {}
        }
    }
    let mut costs: Vec<f64> = per_job
        .into_values()
        .filter(|(off, on)| off.len() >= 3 && on.len() >= 3)
        .map(|(mut off, mut on)| {
            off.sort();
            on.sort();
            percentile(&on, 0.5).as_secs_f64() / percentile(&off, 0.5).as_secs_f64() - 1.0
        })
        .collect();
    costs.sort_by(f64::total_cmp);
    if costs.is_empty() {
        return None;
    }
    let at = |p: f64| costs[((costs.len() - 1) as f64 * p).round() as usize];
    Some((at(0.5), at(0.1), at(0.9), costs.len()))
}

async fn soak(cfg: Config) -> bool {
    let cfg = Arc::new(cfg);
    let stats = Arc::new(Stats::default());
    let endpoints: Vec<String> = cfg.endpoints.split(',').map(String::from).collect();
    println!(
        "soak: {} jobs of {} nodes at once for {:?}, lease_ttl {} s, monitor interval {:?}, on {}",
        cfg.runs, cfg.nodes, cfg.duration, cfg.lease_ttl, cfg.monitor, cfg.endpoints
    );
    let started = Instant::now();
    let sampling = Arc::new(AtomicBool::new(false));
    let scheduler = Arc::new(Scheduler::default());
    let sampler = tokio::spawn(sample_db(
        endpoints.clone(),
        started,
        sampling.clone(),
        scheduler.clone(),
        stats.clone(),
    ));
    let load = Arc::new(Mutex::new(Load::Alone));
    let ids = Arc::new(AtomicU64::new(1_000_000));

    // One job alone, with the same churn.
    println!("one job alone for {:?}", cfg.solo);
    slot(
        cfg.clone(),
        0,
        Instant::now() + cfg.solo,
        load.clone(),
        scheduler.clone(),
        stats.clone(),
        ids.clone(),
    )
    .await;

    // All of them: a ramp while they arrive.
    stats.arriving.store(cfg.runs as u64, Relaxed);
    *load.lock().unwrap() = Load::Ramp;
    println!("{} jobs at once for {:?}", cfg.runs, cfg.duration);
    let (requests_before, proposals_before) = cluster_requests(&endpoints).await;
    let until = Instant::now() + cfg.duration;
    let slots: Vec<_> = (0..cfg.runs)
        .map(|i| {
            // Started over the first 10 s, as jobs arrive.
            let delay = Duration::from_secs_f64(10.0 * i as f64 / cfg.runs as f64);
            let (cfg, load, scheduler, stats, ids) = (
                cfg.clone(),
                load.clone(),
                scheduler.clone(),
                stats.clone(),
                ids.clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                slot(cfg, 1 + i as u64, until, load, scheduler, stats, ids).await;
            })
        })
        .collect();
    // The scheduler off and on in turns, so that the machine's other load, which drifts,
    // falls on both alike.
    let turns = (cfg.duration.as_secs_f64() / cfg.alternate.as_secs_f64()).max(2.0) as u32;
    for turn in 1..turns {
        tokio::time::sleep_until(until - cfg.duration + cfg.duration * turn / turns).await;
        let on = turn % 2 == 1;
        // A turn that begins while jobs still arrive is skipped: the ramp is neither.
        if *load.lock().unwrap() == Load::Ramp {
            println!(
                "t={:>5.0}s  jobs still arriving: this turn is skipped",
                started.elapsed().as_secs_f64()
            );
            continue;
        }
        match on {
            true => scheduler.start(&cfg.endpoints, cfg.scheduler_poll),
            false => scheduler.stop(&stats),
        }
        *load.lock().unwrap() = if on { Load::Observed } else { Load::All };
        println!(
            "t={:>5.0}s  scheduler watching every job: {}",
            started.elapsed().as_secs_f64(),
            if on { "on" } else { "off" }
        );
    }
    for s in slots {
        let _ = s.await;
    }
    scheduler.stop(&stats);
    let (requests_after, proposals_after) = cluster_requests(&endpoints).await;
    println!(
        "t={:>5.0}s  every job ended",
        started.elapsed().as_secs_f64()
    );
    sampling.store(true, Relaxed);
    let db = sampler.await.unwrap();
    let largest = db.largest;

    // The keys left, once the leases of killed nodes (and of runs whose last node was killed)
    // have run out.
    let wait = Duration::from_secs(cfg.lease_ttl + 5);
    println!("waiting lease_ttl + 5 s = {wait:?} for the leases of killed nodes to run out");
    tokio::time::sleep(wait).await;
    let mut client = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let prefix = format!("{}/", cfg.prefix);
    let left = client
        .get(
            prefix.clone(),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<String> = left
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    let (closed, other): (Vec<&String>, Vec<&String>) =
        keys.iter().partition(|k| k.ends_with("/closed"));

    println!("--- results");
    let rounds = stats.rounds.lock().unwrap().clone();
    let of = |load: Load| -> Vec<Duration> {
        rounds.iter().filter(|r| r.0 == load).map(|r| r.3).collect()
    };
    let alone = summarize("one job alone", &mut of(Load::Alone));
    summarize("jobs arriving (neither)", &mut of(Load::Ramp));
    summarize(&format!("{} jobs at once", cfg.runs), &mut of(Load::All));
    summarize(
        &format!("{} jobs at once, scheduler on", cfg.runs),
        &mut of(Load::Observed),
    );
    let ratio_all = ratios(
        &format!("{} jobs at once", cfg.runs),
        &rounds,
        Load::All,
        alone,
    );
    let ratio_observed = ratios(
        &format!("{} jobs at once, scheduler on", cfg.runs),
        &rounds,
        Load::Observed,
        alone,
    );
    // The goals on speed hold only where asked for (a quiet machine): a soak in the test
    // command shares its cores with other suites, and reports the figures alone.
    let mut speed_ok = true;
    if let (Some(max), Some(ratio)) = (cfg.max_ratio, ratio_all) {
        let met = ratio <= max;
        speed_ok &= met;
        println!(
            "goal: each job's median round at most {max}x alone: {ratio:.2}x ({})",
            if met { "met" } else { "NOT met" }
        );
    }
    if let (Some(all), Some(observed)) = (ratio_all, ratio_observed) {
        println!(
            "scheduler's cost, the medians of all jobs compared: {:+.1}%",
            (observed / all - 1.0) * 100.0
        );
    }
    let paired = paired_cost(&rounds);
    if let Some((cost, p10, p90, jobs)) = paired {
        println!(
            "scheduler's cost, each job against itself: {:+.1}% (median of {jobs} jobs; p10 {:+.1}%, p90 {:+.1}%)",
            cost * 100.0,
            p10 * 100.0,
            p90 * 100.0
        );
    }
    if let (Some(max), Some((cost, ..))) = (cfg.max_scheduler_cost, paired) {
        let met = cost <= max;
        speed_ok &= met;
        println!(
            "goal: the scheduler adds at most {:.0}% (each job against itself): {:+.1}% ({})",
            max * 100.0,
            cost * 100.0,
            if met { "met" } else { "NOT met" }
        );
    }
    println!("round time by what formed it, median (rounds): alone | all | all, scheduler on");
    let kinds: std::collections::BTreeSet<&str> = rounds.iter().map(|r| r.2).collect();
    for kind in kinds {
        let mut line = format!("  {kind:<20}");
        for load in [Load::Alone, Load::All, Load::Observed] {
            let mut t: Vec<Duration> = rounds
                .iter()
                .filter(|r| r.0 == load && r.2 == kind)
                .map(|r| r.3)
                .collect();
            t.sort();
            line += &format!("  {:>9} ({:>4})", ms(percentile(&t, 0.5), 1), t.len());
        }
        println!("{line}");
    }
    // What the load cost etcd, by request: what to cut first when rounds slow down.
    // Every round of that time, the arriving jobs' included, as the counts include them.
    let formed = rounds.iter().filter(|r| r.0 != Load::Alone).count().max(1) as f64;
    let seconds = cfg.duration.as_secs_f64();
    if let (Some(before), Some(after)) = (proposals_before, proposals_after) {
        println!(
            "raft proposals while all jobs ran: {:.0}/s, {:.1} per round formed",
            (after - before) / seconds,
            (after - before) / formed
        );
    }
    println!("etcd requests while all jobs ran, by method (every member's): per second | per round formed");
    let mut spent: Vec<(String, f64)> = requests_after
        .iter()
        .map(|(method, n)| {
            (
                method.clone(),
                n - requests_before.get(method).unwrap_or(&0.0),
            )
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    spent.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (method, n) in spent {
        println!("  {method:<22} {:>9.1} {:>9.2}", n / seconds, n / formed);
    }
    println!(
        "scheduler: {} statuses read or watched",
        stats.observed_statuses.load(Relaxed)
    );
    for (event, n) in stats.events.lock().unwrap().iter() {
        println!("{event:<34} {n:>6}");
    }
    println!("etcd's largest database: {}", mib(largest));
    let (bound_line, bounded) = db.bounded();
    println!("{bound_line}");
    let failures = stats.failures.lock().unwrap().clone();
    println!("failed calls: {}", failures.len());
    for f in failures.iter().take(20) {
        println!("  {f}");
    }
    println!(
        "keys left under {prefix}: {} ({} `closed` markers, {} others)",
        keys.len(),
        closed.len(),
        other.len()
    );
    let mut patterns: BTreeMap<String, usize> = BTreeMap::new();
    for k in &other {
        // The run id and round numbers replaced, to group them.
        let shape: Vec<String> = k
            .trim_start_matches(&prefix)
            .split('/')
            .enumerate()
            .map(|(i, part)| match i {
                0 => "RUN".to_string(),
                _ if part.chars().all(|c| c.is_ascii_digit()) => "N".to_string(),
                _ if part.len() == 16 && part.chars().all(|c| c.is_ascii_hexdigit()) => {
                    "NODE".to_string()
                }
                _ => part.to_string(),
            })
            .collect();
        *patterns.entry(shape.join("/")).or_default() += 1;
    }
    for (shape, n) in &patterns {
        println!("  {n:>5}  {shape}");
    }
    for k in other.iter().take(20) {
        println!("  {k}");
    }
    // A backup (`etcdctl snapshot save` makes the same call): its size and time.
    let started = Instant::now();
    let mut member = etcd_client::Client::connect([endpoints[0].as_str()], None)
        .await
        .unwrap();
    let mut saved = 0usize;
    let snapshot = async {
        let mut stream = member.snapshot().await?;
        while let Some(part) = stream.message().await? {
            saved += part.blob().len();
        }
        Ok::<(), etcd_client::Error>(())
    };
    match snapshot.await {
        Ok(()) => println!(
            "snapshot of {}: {} in {}",
            endpoints[0],
            mib(saved as f64),
            ms(started.elapsed(), 1)
        ),
        Err(e) => println!("snapshot failed: {e}"),
    }
    // What a defragmentation gives back and how long it holds each member (it blocks the
    // member's reads and writes meanwhile), one member after another as OPERATIONS.md says.
    for e in &endpoints {
        let before = member_metric(e, "etcd_mvcc_db_total_size_in_bytes").await;
        let started = Instant::now();
        let mut member = etcd_client::Client::connect([e.as_str()], None)
            .await
            .unwrap();
        match member.defragment().await {
            Ok(_) => {
                let took = started.elapsed();
                let after = member_metric(e, "etcd_mvcc_db_total_size_in_bytes").await;
                println!(
                    "defragmented {e}: {} -> {} in {}",
                    mib(before.unwrap_or(0.0)),
                    mib(after.unwrap_or(0.0)),
                    ms(took, 1)
                );
            }
            Err(e) => println!("defragment failed: {e}"),
        }
    }
    println!(
        "verdict: failed calls {}, keys other than `closed` {}, database {}, speed goals {}",
        failures.len(),
        other.len(),
        if bounded { "bounded" } else { "NOT bounded" },
        match (cfg.max_ratio.or(cfg.max_scheduler_cost), speed_ok) {
            (None, _) => "not asked for",
            (Some(_), true) => "met",
            (Some(_), false) => "NOT met",
        }
    );
    failures.is_empty() && other.is_empty() && bounded && speed_ok
}

fn main() {
    if std::env::args().nth(2).as_deref() == Some("--scheduler") {
        return scheduler_main();
    }
    let cfg = config();
    // The library's warnings (a lease lost, etcd failing for long) on stderr, as a launcher's.
    rdzv::log::install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let passed = rt.block_on(soak(cfg));
    println!("{}", if passed { "PASSED" } else { "FAILED" });
    std::process::exit(if passed { 0 } else { 1 });
}
