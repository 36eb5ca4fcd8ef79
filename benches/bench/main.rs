//! Benchmark: prints rendezvous latency for N nodes, etcd writes, CPU and allocations per
//! round (beside three floors: raw etcd-client doing the design's etcd work), and the store's
//! set/get latency and throughput next to raw etcd-client put/get measured in the same run.
//! Run with `scripts/bench.sh` (starts a local etcd) or `cargo run --release -p rdzv-bench --bin
//! bench -- HOST:PORT [N ...]`. Numbers are medians; the machine is shared, so compare ratios.

mod cluster;
mod history;
mod runs_watched;
mod watched;

use rdzv::{Params, Rendezvous};
use rdzv_bench::stats::{median, ms};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The system allocator, counting: allocations per node in a round are a measure of the
/// library's own work that does not move with the machine's load, as its times and CPU do.
/// A reallocation counts as one allocation of its new size.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to the system allocator with the caller's arguments unchanged.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        ALLOCATED_BYTES.fetch_add(layout.size() as u64, Relaxed);
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        ALLOCATED_BYTES.fetch_add(size as u64, Relaxed);
        std::alloc::System.realloc(ptr, layout, size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

async fn revision(client: &mut etcd_client::Client) -> i64 {
    client
        .get("/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

/// What one round of `n` nodes measured.
struct Round {
    /// From the last node's call of next to the last return.
    took: Duration,
    /// etcd writes for the round (change of its revision).
    writes: i64,
    /// CPU time spent during the round by this process (the nodes) and by etcd.
    cpu: Cpu,
    /// Resident memory grown by creating the handles, and by forming the round, per node.
    bytes_per_handle: i64,
    bytes_per_member: i64,
    /// The same, after the allocator returned its free pages: what the nodes still hold.
    bytes_held_per_member: i64,
    /// Shutting the nodes down one after another, after each polled num_lost (as supervisors
    /// do, so each has its watch on the live nodes): time, and watch events etcd sent meanwhile.
    shutdown: Duration,
    shutdown_events: i64,
}

/// One round of `n` nodes: handles are created first (not timed), then all call next at once.
/// With `measure_memory`, the allocator's free pages are returned before and after it, so
/// resident memory shows what the handles and the round hold; only the memory round does that.
/// A trimmed heap makes the round fault its memory in again (page faults were 12% of the nodes'
/// CPU samples at 4096), a cost the floors' rounds, never trimmed, do not pay, and neither does
/// a node's process in a job, which reuses its heap round after round.
async fn one_round(endpoint: &str, n: usize, run: &str, measure_memory: bool) -> Round {
    let url = format!("etcd://{endpoint}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=120");
    let params = Params::from_url(&url).unwrap();
    let trim = || {
        if measure_memory {
            // SAFETY: malloc_trim only releases free memory of glibc's allocator.
            unsafe { libc::malloc_trim(0) };
        }
    };
    // The baseline then holds no free pages either.
    trim();
    let rss_before = resident_bytes();
    let mut nodes = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(64) {
        let batch =
            (chunk * 64..((chunk + 1) * 64).min(n)).map(|_| Rendezvous::new(params.clone()));
        for node in futures_lite(batch).await {
            nodes.push(Arc::new(node.unwrap()));
        }
    }
    let rss_handles = resident_bytes();
    let mut client = etcd_client::Client::connect(endpoint.split(',').collect::<Vec<_>>(), None)
        .await
        .unwrap();
    let before = revision(&mut client).await;
    let watchers = metric(endpoint, "etcd_debugging_mvcc_watcher_total").await;
    let cpu = Cpu::start(endpoint, n).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, barrier) = (node.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let called = Instant::now();
                node.next().await.unwrap();
                (called, Instant::now())
            })
        })
        .collect();
    let took = span(tasks).await;
    let cpu = cpu.stop(endpoint).await;
    let writes = revision(&mut client).await - before;
    let rss_round = resident_bytes();
    // Resident memory keeps the round's peak (freed memory stays with the allocator); what
    // the nodes still hold is what is left once the allocator returns its free pages.
    trim();
    let rss_held = resident_bytes();
    // Every node polls num_lost once, which starts its watch on the live nodes. Wait until
    // etcd has dropped the round's own watches and holds one per node before shutting down.
    let watching = |want: i64, what: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        while metric(endpoint, "etcd_debugging_mvcc_watcher_total").await != want {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    watching(watchers, "the round's watches were never cancelled").await;
    for node in &nodes {
        assert_eq!(node.num_lost().await.unwrap(), 0);
    }
    // Each tracker watches four targets: the round's members and drains (num_lost), the next
    // round's joins (num_waiting) and the closed marker (is_closed).
    watching(watchers + 4 * n as i64, "num_lost watches never started").await;
    let events = metric(endpoint, "etcd_debugging_mvcc_events_total").await;
    // One after another, as the nodes of a job finish at slightly different times: every node
    // still running sees each one leave.
    let started = Instant::now();
    for node in &nodes {
        node.shutdown().await.unwrap();
    }
    let shutdown = started.elapsed();
    let shutdown_events = metric(endpoint, "etcd_debugging_mvcc_events_total").await - events;
    Round {
        took,
        writes,
        cpu,
        bytes_per_handle: (rss_handles - rss_before) / n as i64,
        bytes_per_member: (rss_round - rss_before) / n as i64,
        bytes_held_per_member: (rss_held - rss_before) / n as i64,
        shutdown,
        shutdown_events,
    }
}

/// This process's resident memory, from /proc/self/statm (Linux).
fn resident_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// CPU time (user and system) this process has used, from getrusage.
fn own_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time used over an interval by this process and by etcd (its members summed; etcd
/// reports it in steps of 10 ms, so read it over several rounds), and this process's
/// allocations over it, for a round of `nodes` nodes.
#[derive(Clone, Copy, Default)]
struct Cpu {
    client: Duration,
    etcd: Duration,
    allocations: u64,
    allocated_bytes: u64,
    nodes: u64,
    /// etcd's requests by kind (`REQUEST_KINDS`), summed over the members.
    requests: [f64; REQUEST_KINDS.len()],
}

/// What `--phases` counts of etcd's requests: a unary method's calls handled, or a stream's
/// messages received (a watch stream's creates and cancels; a lease stream's refreshes).
const REQUEST_KINDS: [(&str, &str); 8] = [
    ("Txn", "grpc_server_handled_total"),
    ("Range", "grpc_server_handled_total"),
    ("Put", "grpc_server_handled_total"),
    ("DeleteRange", "grpc_server_handled_total"),
    ("LeaseGrant", "grpc_server_handled_total"),
    ("Watch", "grpc_server_started_total"),
    ("Watch", "grpc_server_msg_received_total"),
    ("LeaseKeepAlive", "grpc_server_msg_received_total"),
];

/// The label `--phases` prints for each of `REQUEST_KINDS`.
const REQUEST_LABELS: [&str; 8] = [
    "txn",
    "range",
    "put",
    "delete",
    "lease grant",
    "watch streams",
    "watch creates+cancels",
    "lease refreshes",
];

async fn requests(endpoints: &str) -> [f64; REQUEST_KINDS.len()] {
    let mut counts = [0.0; REQUEST_KINDS.len()];
    for endpoint in endpoints.split(',') {
        let body = metrics_text(endpoint).await;
        for line in body.lines() {
            for (i, (method, metric)) in REQUEST_KINDS.iter().enumerate() {
                let method = format!("grpc_method=\"{method}\"");
                if line.starts_with(&format!("{metric}{{")) && line.contains(&method) {
                    counts[i] += line
                        .rsplit(' ')
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0.0);
                }
            }
        }
    }
    counts
}

impl Cpu {
    // This process's CPU and allocations are read inside the scrapes of etcd's metrics, so
    // that reading and parsing those is not counted as the round's.
    async fn start(endpoint: &str, nodes: usize) -> Cpu {
        let requests = requests(endpoint).await;
        let etcd = metric_f64(endpoint, "process_cpu_seconds_total").await;
        Cpu {
            client: own_cpu(),
            etcd: Duration::from_secs_f64(etcd),
            allocations: ALLOCATIONS.load(Relaxed),
            allocated_bytes: ALLOCATED_BYTES.load(Relaxed),
            nodes: nodes as u64,
            requests,
        }
    }
    async fn stop(self, endpoint: &str) -> Cpu {
        let (client, allocations, allocated_bytes) = (
            own_cpu() - self.client,
            ALLOCATIONS.load(Relaxed) - self.allocations,
            ALLOCATED_BYTES.load(Relaxed) - self.allocated_bytes,
        );
        let etcd = Duration::from_secs_f64(metric_f64(endpoint, "process_cpu_seconds_total").await);
        let mut requests = requests(endpoint).await;
        for (now, before) in requests.iter_mut().zip(self.requests) {
            *now -= before;
        }
        Cpu {
            client,
            etcd: etcd.saturating_sub(self.etcd),
            allocations,
            allocated_bytes,
            nodes: self.nodes,
            requests,
        }
    }

    /// etcd's requests over the round, by kind (the metrics' own requests left out: they are
    /// HTTP, not gRPC).
    fn requests(&self) -> String {
        REQUEST_LABELS
            .iter()
            .zip(self.requests)
            .filter(|(_, n)| *n > 0.0)
            .map(|(label, n)| format!("{label} {n:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
    /// Mean client and etcd CPU per round over `rounds`, and this process's allocations per
    /// node (the nodes', and in `--phases` also the observer's).
    fn mean(rounds: &[Cpu]) -> String {
        let n = rounds.len().max(1) as u32;
        let client: Duration = rounds.iter().map(|c| c.client).sum();
        let etcd: Duration = rounds.iter().map(|c| c.etcd).sum();
        let nodes: u64 = rounds.iter().map(|c| c.nodes).sum::<u64>().max(1);
        let allocations: u64 = rounds.iter().map(|c| c.allocations).sum();
        let kib = rounds.iter().map(|c| c.allocated_bytes).sum::<u64>() as f64 / 1024.0;
        format!(
            "cpu/round: nodes {} etcd {}, allocations/node {} ({:.1} KiB)",
            ms(client / n, 2),
            ms(etcd / n, 2),
            allocations / nodes,
            kib / nodes as f64
        )
    }
}

/// One value of etcd's Prometheus metrics (served on its client URL), summed over the members
/// when `endpoints` lists several (watchers and events are counted by the member serving them).
async fn metric(endpoints: &str, name: &str) -> i64 {
    metric_f64(endpoints, name).await as i64
}

async fn metric_f64(endpoints: &str, name: &str) -> f64 {
    let mut sum = 0.0;
    for endpoint in endpoints.split(',') {
        sum += member_metric(endpoint, name).await;
    }
    sum
}

async fn member_metric(endpoint: &str, name: &str) -> f64 {
    metrics_text(endpoint)
        .await
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("etcd reports no metric {name}"))
}

/// One member's Prometheus metrics, as the text etcd serves on its client URL.
async fn metrics_text(endpoint: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(endpoint).await.unwrap();
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body
}

/// The floor for a round of `n` nodes: raw etcd-client doing the minimal etcd work of one
/// round over one shared connection, as rdzv's in-process nodes do. Each node opens a watch on
/// its lane (a hash of its id) and sends one join transaction; a leader, watching the join
/// prefix, writes `final` and every lane's seal in one transaction once all have joined (as
/// rdzv's seal: each lane's value is `final` with the ranks of that lane's members); each node
/// finds its rank in the event its watch delivers. `Floor::Live` adds what a design that
/// notices dead nodes and a dead leader cannot do without (see `Floor`). Returns the time from
/// the last call to the last node that knows its rank.
async fn floor_round(endpoint: &str, n: usize, run: &str, floor: Floor) -> (Duration, Cpu) {
    let phases = floor_phases(endpoint, n, run, floor).await;
    (phases.total(), phases.cpu)
}

/// Which floor: the bare one, one that also does what the design needs to notice deaths, or
/// one that also sends the design's own transactions.
#[derive(Clone, Copy, PartialEq)]
enum Floor {
    Bare,
    /// Each node also holds a lease with its keep-alive stream open (granted before the round,
    /// as rdzv's handles do), binds its join key to it, and watches the round's leader key
    /// beside its lane: what lets a round drop a dead node and followers replace a dead leader.
    Live,
    /// `Live`, with the join and the seal sent as rdzv's transactions are, guards and all: the
    /// join checks that the round is open, the run not closed and the node not drained, and
    /// the first joiner claims the lead in it (the others read who leads); the seal checks
    /// that the round is unsealed, the run open, the leader's claim and join there, and that
    /// no member left and no node was drained since the leader's view, and moves `current`.
    /// The difference from `Live` is what the guarantees cost in etcd; from this to rdzv, what
    /// the library adds.
    Guarded,
}

impl Floor {
    const ALL: [Floor; 3] = [Floor::Bare, Floor::Live, Floor::Guarded];

    /// Its name in the benchmark's lines.
    fn name(self) -> &'static str {
        match self {
            Floor::Bare => "floor",
            Floor::Live => "floor with liveness",
            Floor::Guarded => "with the design's transactions",
        }
    }

    /// Its name in `--phases`' rows.
    fn short_name(self) -> &'static str {
        match self {
            Floor::Bare => "floor",
            Floor::Live => "live",
            Floor::Guarded => "design",
        }
    }

    /// The start of its run ids.
    fn run_prefix(self) -> &'static str {
        match self {
            Floor::Bare => "floor",
            Floor::Live => "live-floor",
            Floor::Guarded => "design-floor",
        }
    }
}

/// Where a round's time goes, from the last call of next: until etcd reported the last join,
/// then until it reported the seal, then until the last node returned.
#[derive(Clone, Copy)]
struct Phases {
    last_call: Instant,
    last_joined: Instant,
    sealed: Instant,
    last_return: Instant,
    cpu: Cpu,
}

impl Phases {
    fn total(&self) -> Duration {
        self.last_return - self.last_call
    }
    fn print(&self, what: &str) {
        let since = |a: Instant, b: Instant| ms(b.saturating_duration_since(a), 2);
        println!(
            "{what:<6} every node joined {:>10}  then sealed {:>10}  then every node returned {:>10}  (total {}; {})",
            since(self.last_call, self.last_joined),
            since(self.last_joined, self.sealed),
            since(self.sealed, self.last_return),
            ms(self.total(), 2),
            Cpu::mean(&[self.cpu])
        );
        println!("       etcd requests: {}", self.cpu.requests());
    }
}

/// A join as rdzv sends it (round 0): guarded by the round being open, the run not closed and
/// the node not drained; the first joiner claims the lead (and the lane count) with its lease,
/// the others read both.
fn guarded_join(
    prefix: &str,
    id: &str,
    put_join: etcd_client::TxnOp,
    bound: Option<etcd_client::PutOptions>,
) -> etcd_client::Txn {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let (leader, lanes) = (format!("{prefix}leader"), format!("{prefix}lanes"));
    let claim = Txn::new()
        .when([Compare::create_revision(
            leader.clone(),
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(leader.clone(), id, bound.clone()),
            TxnOp::put(lanes.clone(), "1", bound),
        ])
        .or_else([TxnOp::get(leader, None), TxnOp::get(lanes, None)]);
    Txn::new()
        .when([
            Compare::create_revision(format!("{prefix}current"), CompareOp::Equal, 0),
            Compare::create_revision(format!("{prefix}closed"), CompareOp::Equal, 0),
            Compare::create_revision(format!("{prefix}drain/{id}"), CompareOp::Equal, 0),
        ])
        .and_then([put_join, TxnOp::txn(claim)])
        .or_else([
            TxnOp::get(format!("{prefix}current"), None),
            TxnOp::get(format!("{prefix}closed"), None),
            TxnOp::get(format!("{prefix}final"), None),
            TxnOp::get(format!("{prefix}drain/{id}"), None),
        ])
}

async fn floor_phases(endpoint: &str, n: usize, run: &str, floor: Floor) -> Phases {
    let client = etcd_client::Client::connect(endpoint.split(',').collect::<Vec<_>>(), None)
        .await
        .unwrap();
    let prefix = format!("/floor/{run}/");
    let observer = observe(endpoint, prefix.clone()).await;
    let final_key = format!("{prefix}final");
    let mut leader = client.clone();
    let mut joins = leader
        .watch(
            format!("{prefix}join/"),
            Some(etcd_client::WatchOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("{:016x}", i * 7919 + 1)).collect();
    // As many lanes as rdzv's nodes use with max_nodes = n.
    let chunks = rdzv::test_support::chunk_count(n);
    let sealed = rdzv::test_support::FinalRecord {
        round: 0,
        world_size: n as u32,
        master_addr: "localhost".into(),
        master_port: 29500,
        chunks,
        members: rdzv::test_support::inline_members(&ids, chunks),
        lane: None,
    };
    let mut writes = vec![etcd_client::TxnOp::put(
        final_key.clone(),
        sealed.to_json(),
        None,
    )];
    if floor == Floor::Guarded {
        writes.push(etcd_client::TxnOp::put(
            format!("{prefix}current"),
            "1",
            None,
        ));
    }
    for (k, value) in rdzv::test_support::lane_values(&sealed, &ids)
        .into_iter()
        .enumerate()
    {
        writes.push(etcd_client::TxnOp::put(
            format!("{prefix}lane/{k:04}/sealed"),
            value,
            None,
        ));
    }
    // Granted before the round, as rdzv's handles hold theirs; kept alive through it.
    type Held = (
        i64,
        etcd_client::LeaseKeeper,
        etcd_client::LeaseKeepAliveStream,
    );
    let leases: Vec<Option<Held>> = match floor {
        Floor::Bare => (0..n).map(|_| None).collect(),
        Floor::Live | Floor::Guarded => {
            let grants = (0..n).map(|_| {
                let mut c = client.clone();
                async move {
                    let id = c.lease_grant(10, None).await.unwrap().id();
                    let (keeper, stream) = c.lease_keep_alive(id).await.unwrap();
                    Some((id, keeper, stream))
                }
            });
            futures_lite(grants).await
        }
    };
    let lease_ids: Vec<Option<i64>> = leases.iter().map(|l| l.as_ref().map(|l| l.0)).collect();
    let cpu = Cpu::start(endpoint, n).await;
    let guarded_seal = {
        let prefix = prefix.clone();
        move |first: &str, seen_at: i64| {
            use etcd_client::{Compare, CompareOp};
            vec![
                Compare::create_revision(final_key.clone(), CompareOp::Equal, 0),
                Compare::create_revision(format!("{prefix}closed"), CompareOp::Equal, 0),
                Compare::version(format!("{prefix}join/{first}"), CompareOp::Greater, 0),
                Compare::value(format!("{prefix}leader"), CompareOp::Equal, first),
                Compare::mod_revision(format!("{prefix}gone/"), CompareOp::Less, seen_at + 1)
                    .with_prefix(),
                Compare::mod_revision(format!("{prefix}drain/"), CompareOp::Less, seen_at + 1)
                    .with_prefix(),
            ]
        }
    };
    let seal = tokio::spawn(async move {
        let (mut seen, mut first, mut seen_at) = (0, None, 0);
        while seen < n {
            let resp = joins.message().await.unwrap().unwrap();
            seen += resp.events().len();
            seen_at = resp.header().map_or(0, |h| h.revision());
            if first.is_none() {
                let key = resp
                    .events()
                    .first()
                    .and_then(|e| e.kv())
                    .map(|kv| kv.key());
                first = key.map(|k| {
                    String::from_utf8_lossy(k)
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .to_string()
                });
            }
        }
        let txn = match floor {
            Floor::Guarded => etcd_client::Txn::new()
                .when(guarded_seal(first.as_deref().unwrap(), seen_at))
                .and_then(writes),
            _ => etcd_client::Txn::new().and_then(writes),
        };
        let resp = leader.txn(txn).await.unwrap();
        assert!(resp.succeeded(), "the floor's seal was refused");
    });
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = ids
        .into_iter()
        .zip(lease_ids)
        .map(|(id, lease)| {
            let (mut c, barrier, prefix) = (client.clone(), barrier.clone(), prefix.clone());
            let lane = format!("{prefix}lane/{:04}/", sealed.chunk_of(&id));
            let guarded = floor == Floor::Guarded;
            tokio::spawn(async move {
                barrier.wait().await;
                let called = Instant::now();
                let prefixed = etcd_client::WatchOptions::new().with_prefix();
                let mut watch = c.watch(lane, Some(prefixed)).await.unwrap();
                if lease.is_some() {
                    // The leader key on the same stream, confirmed before the join (as rdzv).
                    watch.watch(format!("{prefix}leader"), None).await.unwrap();
                    let mut created = 0;
                    while created < 2 {
                        created += usize::from(watch.message().await.unwrap().unwrap().created());
                    }
                }
                let bound = || lease.map(|l| etcd_client::PutOptions::new().with_lease(l));
                let put_join = etcd_client::TxnOp::put(
                    format!("{prefix}join/{id}"),
                    "{\"addr\":\"localhost\",\"port\":29500}",
                    bound(),
                );
                let join = match guarded {
                    false => etcd_client::Txn::new()
                        .when([etcd_client::Compare::create_revision(
                            format!("{prefix}final"),
                            etcd_client::CompareOp::Equal,
                            0,
                        )])
                        .and_then([put_join]),
                    true => guarded_join(&prefix, &id, put_join, bound()),
                };
                let resp = c.txn(join).await.unwrap();
                assert!(resp.succeeded(), "a floor's join was refused");
                let sealed = 'sealed: loop {
                    let resp = watch.message().await.unwrap().unwrap();
                    // The lane's seal; the leader key's claim (`Guarded`) is not waited for.
                    for kv in resp.events().iter().filter_map(|e| e.kv()) {
                        if !kv.key().ends_with(b"leader") {
                            let parsed =
                                rdzv::test_support::FinalRecord::parse(kv.key(), kv.value());
                            break 'sealed parsed.unwrap();
                        }
                    }
                };
                assert!(matches!(sealed.inline_rank(&id), Some(Some(_))));
                (called, Instant::now())
            })
        })
        .collect();
    let mut times = Vec::with_capacity(n);
    for t in tasks {
        times.push(t.await.unwrap());
    }
    seal.await.unwrap();
    let cpu = cpu.stop(endpoint).await;
    let (last_joined, sealed) = observer.await.unwrap();
    // Revoked now rather than left to expire during a later round's measurement.
    let revokes = leases.into_iter().flatten().map(|(id, keeper, stream)| {
        let mut c = client.clone();
        async move {
            drop((keeper, stream));
            c.lease_revoke(id).await.unwrap();
        }
    });
    futures_lite(revokes).await;
    Phases {
        last_call: times.iter().map(|t| t.0).max().unwrap(),
        last_joined,
        sealed,
        last_return: times.iter().map(|t| t.1).max().unwrap(),
        cpu,
    }
}

/// Watches a run's keys from a client of its own and notes when etcd reported the last join
/// and the seal (a key ending in `final`): the same clock for rdzv and the floor, at the cost
/// of one more watcher (the leader's share).
async fn observe(endpoint: &str, prefix: String) -> tokio::task::JoinHandle<(Instant, Instant)> {
    let mut client = etcd_client::Client::connect(endpoint.split(',').collect::<Vec<_>>(), None)
        .await
        .unwrap();
    let options = etcd_client::WatchOptions::new().with_prefix();
    let mut watch = client.watch(prefix, Some(options)).await.unwrap();
    tokio::spawn(async move {
        let _client = client;
        let mut last_join = None;
        loop {
            let resp = watch.message().await.unwrap().expect("watch ended");
            let now = Instant::now();
            for ev in resp.events() {
                let key = ev.kv().unwrap().key();
                if key.ends_with(b"final") {
                    return (last_join.expect("sealed before any join"), now);
                }
                if key.windows(6).any(|w| w == b"/join/") {
                    last_join = Some(now);
                }
            }
        }
    })
}

/// One rdzv round of `n` nodes, timed in phases by an observer's watch.
async fn rdzv_phases(endpoint: &str, n: usize, run: &str) -> Phases {
    let url = format!("etcd://{endpoint}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=120");
    let params = Params::from_url(&url).unwrap();
    let handles = (0..n).map(|_| Rendezvous::new(params.clone()));
    let nodes: Vec<_> = futures_lite(handles)
        .await
        .into_iter()
        .map(|node| Arc::new(node.unwrap()))
        .collect();
    let observer = observe(endpoint, format!("/rdzv/{run}/r/")).await;
    let cpu = Cpu::start(endpoint, n).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks = nodes.iter().map(|node| {
        let (node, barrier) = (node.clone(), barrier.clone());
        async move {
            barrier.wait().await;
            let called = Instant::now();
            node.next().await.unwrap();
            (called, Instant::now())
        }
    });
    let times = futures_lite(tasks).await;
    let cpu = cpu.stop(endpoint).await;
    let (last_joined, sealed) = observer.await.unwrap();
    for node in &nodes {
        node.shutdown().await.unwrap();
    }
    Phases {
        last_call: times.iter().map(|t| t.0).max().unwrap(),
        last_joined,
        sealed,
        last_return: times.iter().map(|t| t.1).max().unwrap(),
        cpu,
    }
}

/// The time from the last node's call to the last node's return, over nodes that report
/// (called, returned).
async fn span(nodes: Vec<tokio::task::JoinHandle<(Instant, Instant)>>) -> Duration {
    let (mut last_call, mut last_return) = (None::<Instant>, None::<Instant>);
    for node in nodes {
        let (called, returned) = node.await.unwrap();
        last_call = Some(last_call.map_or(called, |c| c.max(called)));
        last_return = Some(last_return.map_or(returned, |r| r.max(returned)));
    }
    last_return.unwrap() - last_call.unwrap()
}

/// Awaits a batch of futures concurrently (no extra dependency for join_all).
async fn futures_lite<F: std::future::Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

async fn store_bench(endpoint: &str) {
    let url = format!("etcd://{endpoint}/bench-store?min_nodes=1&max_nodes=1");
    let node = Rendezvous::new(Params::from_url(&url).unwrap())
        .await
        .unwrap();
    let (_, store) = node.next().await.unwrap();
    let mut raw = etcd_client::Client::connect(endpoint.split(',').collect::<Vec<_>>(), None)
        .await
        .unwrap();
    let ops = 500;
    let value = vec![7u8; 64];
    // Sequential latency, interleaved so both see the same machine load.
    let (mut set, mut put, mut get, mut raw_get) = (vec![], vec![], vec![], vec![]);
    for i in 0..ops {
        let t = Instant::now();
        store.set(&format!("k{i}"), &value).await.unwrap();
        set.push(t.elapsed());
        let t = Instant::now();
        raw.put(format!("/raw/k{i}"), value.clone(), None)
            .await
            .unwrap();
        put.push(t.elapsed());
        let t = Instant::now();
        store.get(&format!("k{i}"), None).await.unwrap();
        get.push(t.elapsed());
        let t = Instant::now();
        raw.get(format!("/raw/k{i}"), None).await.unwrap();
        raw_get.push(t.elapsed());
    }
    let (set, put, get, raw_get) = (median(set), median(put), median(get), median(raw_get));
    println!(
        "store set  median {:>10}   raw etcd put median {:>10}   ratio {:.2}x",
        ms(set, 2),
        ms(put, 2),
        set.as_secs_f64() / put.as_secs_f64()
    );
    println!(
        "store get  median {:>10}   raw etcd get median {:>10}   ratio {:.2}x",
        ms(get, 2),
        ms(raw_get, 2),
        get.as_secs_f64() / raw_get.as_secs_f64()
    );

    // Throughput: 32 concurrent writers, 2000 operations in all.
    let writers = 32;
    let per = 2000 / writers;
    let t = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..per {
                    store.set(&format!("t{w}/{i}"), b"x").await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let store_rate = (writers * per) as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let mut raw = raw.clone();
            tokio::spawn(async move {
                for i in 0..per {
                    raw.put(format!("/raw/t{w}/{i}"), "x", None).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let raw_rate = (writers * per) as f64 / t.elapsed().as_secs_f64();
    // The floor of a guarded write: the same put inside a transaction that compares one key,
    // which is what `set` sends so that a store whose round is gone cannot write.
    let t = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let mut raw = raw.clone();
            tokio::spawn(async move {
                for i in 0..per {
                    let guard = etcd_client::Compare::create_revision(
                        "/raw/guard",
                        etcd_client::CompareOp::Equal,
                        0,
                    );
                    let txn = etcd_client::Txn::new()
                        .when([guard])
                        .and_then([etcd_client::TxnOp::put(format!("/raw/g{w}/{i}"), "x", None)]);
                    raw.txn(txn).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let txn_rate = (writers * per) as f64 / t.elapsed().as_secs_f64();
    println!(
        "store set throughput {store_rate:>8.0}/s   raw etcd put {raw_rate:>8.0}/s   ratio {:.2}x   raw guarded txn {txn_rate:>8.0}/s   ratio {:.2}x",
        raw_rate / store_rate,
        txn_rate / store_rate
    );
    node.shutdown().await.unwrap();
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    const USAGE: &str =
        "usage: bench HOST:PORT[,HOST:PORT...] [N ... | --phases N | --history [N ...] | --watched [W ...] | --runs-watched [R] | --leader-kill PID,... [N ...]]";
    let Some(endpoint) = args.next().filter(|e| !e.starts_with('-')) else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    if args.peek().map(String::as_str) == Some("--leader-kill") {
        let pids = args.nth(1).expect("--leader-kill PID,PID,... [N ...]");
        let sizes: Vec<usize> = args
            .map(|a| a.parse().expect("N must be a number"))
            .collect();
        let sizes = if sizes.is_empty() {
            vec![8, 64, 256]
        } else {
            sizes
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        return rt.block_on(cluster::leader_kill(&endpoint, &pids, &sizes));
    }
    if args.peek().map(String::as_str) == Some("--history") {
        let sizes: Vec<usize> = args
            .skip(1)
            .map(|a| a.parse().expect("N must be a number"))
            .collect();
        let sizes = if sizes.is_empty() {
            vec![8, 64, 256, 1024]
        } else {
            sizes
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        return rt.block_on(history::history(&endpoint, &sizes));
    }
    if args.peek().map(String::as_str) == Some("--runs-watched") {
        let runs = args
            .nth(1)
            .map_or(1000, |a| a.parse().expect("R must be a number"));
        let rt = tokio::runtime::Runtime::new().unwrap();
        return rt.block_on(runs_watched::runs_watched(&endpoint, runs));
    }
    if args.peek().map(String::as_str) == Some("--watched") {
        let observers: Vec<usize> = args
            .skip(1)
            .map(|a| a.parse().expect("W must be a number"))
            .collect();
        let observers = if observers.is_empty() {
            vec![1, 10]
        } else {
            observers
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        return rt.block_on(watched::watched(&endpoint, &observers));
    }
    if args.peek().map(String::as_str) == Some("--phases") {
        let n = args
            .nth(1)
            .and_then(|n| n.parse().ok())
            .expect("--phases N");
        rdzv::log::install_default();
        return phases(&endpoint, n);
    }
    // Records as C ABI users get them (stderr, RDZV_LOG), so the cost of logging is measured.
    rdzv::log::install_default();
    let sizes: Vec<usize> = {
        let given: Vec<usize> = args
            .map(|a| a.parse().expect("N must be a number"))
            .collect();
        if given.is_empty() {
            vec![2, 8, 64, 256, 1024]
        } else {
            given
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Run ids of their own, so that a second run against the same etcd starts afresh.
        let tag = std::process::id();
        println!("rendezvous: time from the last node's call of next to the last return");
        // Memory first, while the heap holds nothing freed by earlier rounds to reuse.
        let largest = *sizes.iter().max().unwrap();
        let fresh = one_round(&endpoint, largest, &format!("bench-memory-{tag}"), true).await;
        println!(
            "memory: N={largest}: {:.1} KiB per node handle, {:.1} KiB per node once the round formed \
             ({:.1} KiB still held once the allocator returned its free pages)",
            fresh.bytes_per_handle as f64 / 1024.0,
            fresh.bytes_per_member as f64 / 1024.0,
            fresh.bytes_held_per_member as f64 / 1024.0
        );
        let mut shutdowns = Vec::new();
        // A size given twice gets run ids of its own: the floor leaves its keys behind, and
        // its joins are refused in a run whose `final` exists.
        for (i, &n) in sizes.iter().enumerate() {
            let tag = format!("{tag}-{i}");
            let repeats = match n { 0..=64 => 7, 65..=256 => 3, _ => 3 };
            let mut rounds = Vec::new();
            for r in 0..repeats {
                rounds.push(one_round(&endpoint, n, &format!("bench-{n}-{r}-{tag}"), false).await);
            }
            let times: Vec<Duration> = rounds.iter().map(|r| r.took).collect();
            let min = *times.iter().min().unwrap();
            let max = *times.iter().max().unwrap();
            // Each floor's rounds and CPU, the floors alternating within each repetition.
            let mut floors = Floor::ALL.map(|floor| (floor, Vec::new(), Vec::new()));
            for r in 0..repeats {
                for (floor, took, cpu) in &mut floors {
                    let run = format!("{}-{n}-{r}-{tag}", floor.run_prefix());
                    let (t, c) = floor_round(&endpoint, n, &run, *floor).await;
                    took.push(t);
                    cpu.push(c);
                }
            }
            let rdzv = median(times);
            let mut line = format!(
                "N={n:>5}  median {:>10}  (min {}, max {}, {repeats} runs)  etcd writes/round {}",
                ms(rdzv, 2),
                ms(min, 2),
                ms(max, 2),
                rounds[0].writes
            );
            let rdzv_cpu: Vec<Cpu> = rounds.iter().map(|r| r.cpu).collect();
            let mut cpu_line = format!("         rdzv {}", Cpu::mean(&rdzv_cpu));
            for (floor, took, cpu) in floors {
                let took = median(took);
                let ratio = rdzv.as_secs_f64() / took.as_secs_f64();
                line += &format!("  {} {:>10}  ratio {ratio:.2}x", floor.name(), ms(took, 2));
                cpu_line += &format!("   {} {}", floor.name(), Cpu::mean(&cpu));
            }
            println!("{line}");
            println!("{cpu_line}");
            let per = |f: fn(&Round) -> i64| {
                let mut v: Vec<i64> = rounds.iter().map(f).collect();
                v.sort();
                v[v.len() / 2]
            };
            shutdowns.push((
                n,
                median(rounds.iter().map(|r| r.shutdown).collect()),
                per(|r| r.shutdown_events),
            ));
        }
        println!("shutdown of the N nodes one after another, after each polled num_lost");
        for (n, took, events) in shutdowns {
            println!(
                "N={n:>5}  shutdown {:>10}  watch events sent {events:>9} ({:.1} per node)",
                ms(took, 2),
                events as f64 / n as f64,
            );
        }
        store_bench(&endpoint).await;
    });
}

/// Where the time of a round of `n` goes, for rdzv, the floor, the floor with liveness ("live")
/// and that with the design's transactions ("design"); median of 5 of each by total.
fn phases(endpoint: &str, n: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tag = std::process::id();
        println!("phases of a round of N={n}, from the last call of next (median of 5 by total)");
        let mut rdzv = Vec::new();
        let mut floors = Floor::ALL.map(|floor| (floor, Vec::new()));
        for r in 0..5 {
            rdzv.push(rdzv_phases(endpoint, n, &format!("phases-{n}-{r}-{tag}")).await);
            for (floor, runs) in &mut floors {
                let run = format!("{}-phases-{n}-{r}-{tag}", floor.run_prefix());
                runs.push(floor_phases(endpoint, n, &run, *floor).await);
            }
        }
        let floors = floors.map(|(floor, runs)| (floor.short_name(), runs));
        for (what, mut runs) in std::iter::once(("rdzv", rdzv)).chain(floors) {
            runs.sort_by_key(Phases::total);
            runs[runs.len() / 2].print(what);
        }
    });
}
