//! `--history`: what a job costs etcd's history, which a standalone etcd keeps until it is
//! compacted (auto-compaction is off by default) and which counts against its backend quota
//! (2 GiB by default; at the quota etcd raises NOSPACE and refuses every write).
//!
//! Jobs of N in-process nodes, each: the handles are created, round 0 forms, the agents make a
//! torch job's store traffic (`torch.rs`), the job restarts `RESTARTS` times (every node calls
//! next again and the traffic is made again in the new round), then the exit barrier and the
//! nodes shut down one after another. Each phase is measured by etcd itself: the revision (a
//! header's), the history entries (keys put or deleted: one revision may hold many, and every
//! one is kept), and the database size from its metrics (`etcd_mvcc_db_total_size_in_bytes`,
//! which the quota is checked against, and the part in use). From these, a job of any number
//! of restarts, and how long a busy platform has before the quota is reached.

use super::{futures_lite, metric_f64};
use rdzv::{Params, Rendezvous};
use rdzv_bench::torch;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The key each measurement writes, outside the runs' prefix, so that etcd commits its backend
/// with it and the sizes read after include everything before.
const MARK: &str = "/bench-history/mark";

/// Restarts per measured job. The projection scales the measured re-form to any count.
const RESTARTS: usize = 2;

/// The platform of the projection: jobs a day, and restarts per job.
const JOBS_A_DAY: f64 = 1000.0;
const PROJECTED_RESTARTS: f64 = 10.0;

/// etcd's default backend quota.
const DEFAULT_QUOTA: f64 = 2.0 * 1024.0 * 1024.0 * 1024.0;

/// etcd commits its backend every 100 ms (`--backend-batch-interval`) when writes are pending.
/// No commit within three of those means none was pending: the last one included the mark.
const COMMIT_WAIT: Duration = Duration::from_millis(300);

/// The phases of a job, in order.
const PHASES: [&str; 5] = ["handles", "form", "bootstrap", "re-form", "shutdown"];

/// etcd's state at one point: after a mark was written and committed.
#[derive(Clone, Copy)]
struct Mark {
    revision: i64,
    size: f64,
    in_use: f64,
}

/// What one phase cost, summed over jobs, with the node-rounds it covered.
#[derive(Clone, Copy, Default)]
struct Cost {
    revisions: f64,
    entries: f64,
    size: f64,
    in_use: f64,
    node_rounds: f64,
}

impl Cost {
    fn add(&mut self, other: Cost) {
        self.revisions += other.revisions;
        self.entries += other.entries;
        self.size += other.size;
        self.in_use += other.in_use;
        self.node_rounds += other.node_rounds;
    }
    /// Per node and round (or per node, for phases that happen once a job).
    fn per(&self) -> Cost {
        let n = self.node_rounds.max(1.0);
        Cost {
            revisions: self.revisions / n,
            entries: self.entries / n,
            size: self.size / n,
            in_use: self.in_use / n,
            node_rounds: 1.0,
        }
    }
}

struct Meter {
    endpoint: String,
    client: etcd_client::Client,
    /// What one mark itself adds to the database (measured first), taken off every phase.
    mark_size: f64,
    mark_in_use: f64,
}

impl Meter {
    async fn new(endpoint: &str) -> Meter {
        let client = etcd_client::Client::connect(endpoint.split(',').collect::<Vec<_>>(), None)
            .await
            .unwrap();
        let mut meter = Meter {
            endpoint: endpoint.to_string(),
            client,
            mark_size: 0.0,
            mark_in_use: 0.0,
        };
        let marks = 50;
        let first = meter.mark().await;
        let mut last = first;
        for _ in 0..marks {
            last = meter.mark().await;
        }
        meter.mark_size = (last.size - first.size) / marks as f64;
        meter.mark_in_use = (last.in_use - first.in_use) / marks as f64;
        meter
    }

    async fn metric(&self, name: &str) -> f64 {
        metric_f64(&self.endpoint, name).await
    }

    /// Writes the mark, waits until etcd's backend committed it, and reads the sizes.
    async fn mark(&mut self) -> Mark {
        let commits = "etcd_disk_backend_commit_duration_seconds_count";
        let put = self.client.put(MARK, "", None).await.unwrap();
        let revision = put.header().unwrap().revision();
        let before = self.metric(commits).await;
        let deadline = Instant::now() + COMMIT_WAIT;
        while self.metric(commits).await <= before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Mark {
            revision,
            size: self.metric("etcd_mvcc_db_total_size_in_bytes").await,
            in_use: self.metric("etcd_mvcc_db_total_size_in_use_in_bytes").await,
        }
    }

    /// The cost between two marks (the later mark's own share taken off).
    fn between(&self, a: Mark, b: Mark, entries: f64, node_rounds: usize) -> Cost {
        Cost {
            revisions: (b.revision - a.revision - 1) as f64,
            entries,
            size: b.size - a.size - self.mark_size,
            in_use: b.in_use - a.in_use - self.mark_in_use,
            node_rounds: node_rounds as f64,
        }
    }

    /// History entries (puts and deletes, marks aside) with revisions in (a, b], replayed by a
    /// watch from a's revision: etcd keeps them all, as nothing is compacted.
    async fn entries(&mut self, a: Mark, b: Mark) -> Vec<i64> {
        let options = etcd_client::WatchOptions::new()
            .with_all_keys()
            .with_start_revision(a.revision + 1);
        let mut stream = self.client.watch("\0", Some(options)).await.unwrap();
        let mut revisions = Vec::new();
        loop {
            let resp = stream.message().await.unwrap().expect("watch ended");
            for event in resp.events() {
                let kv = event.kv().unwrap();
                if kv.mod_revision() >= b.revision {
                    return revisions;
                }
                if kv.key() != MARK.as_bytes() {
                    revisions.push(kv.mod_revision());
                }
            }
        }
    }
}

/// Every node calls next at once; returns each one's rank, the world size and its store.
async fn round(nodes: &[Arc<Rendezvous>]) -> Vec<(u32, u32, rdzv::Store)> {
    let rounds = nodes.iter().map(|node| {
        let node = node.clone();
        async move {
            let (info, store) = node.next().await.unwrap();
            (info.rank, info.world_size, store)
        }
    });
    futures_lite(rounds).await
}

/// Every rank's share of a torch job's store traffic in its round.
async fn traffic(stores: &[(u32, u32, rdzv::Store)]) {
    let each = stores
        .iter()
        .cloned()
        .map(|(rank, world, store)| async move {
            torch::bootstrap(&store, rank, world).await.unwrap();
        });
    futures_lite(each).await;
}

/// One job of `n` nodes; returns what each phase of `PHASES` cost.
async fn job(meter: &mut Meter, n: usize, run: &str) -> [Cost; 5] {
    let url = format!(
        "etcd://{}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=300&store_timeout=300",
        meter.endpoint
    );
    let params = Params::from_url(&url).unwrap();
    // (phase, from, to): consecutive phases share the mark between them.
    let mut spans = Vec::new();
    let start = meter.mark().await;
    let mut nodes = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(64) {
        let batch =
            (chunk * 64..((chunk + 1) * 64).min(n)).map(|_| Rendezvous::new(params.clone()));
        for node in futures_lite(batch).await {
            nodes.push(Arc::new(node.unwrap()));
        }
    }
    let mut last = meter.mark().await;
    spans.push((0, start, last));
    // Round 0, then the restarts: every node joins again, as every agent of a torch job does
    // when a worker fails, and the traffic is made again in each new round.
    let mut stores = Vec::new();
    for restart in 0..=RESTARTS {
        stores = round(&nodes).await;
        let formed = meter.mark().await;
        spans.push((if restart == 0 { 1 } else { 3 }, last, formed));
        traffic(&stores).await;
        last = meter.mark().await;
        spans.push((2, formed, last));
    }
    // The exit barrier, then the nodes leave one after another; the last one out deletes
    // the run's keys.
    let barrier = stores.into_iter().map(|(rank, world, store)| async move {
        torch::exit_barrier(&store, rank, world).await.unwrap();
    });
    futures_lite(barrier).await;
    for node in &nodes {
        node.shutdown().await.unwrap();
    }
    let end = meter.mark().await;
    spans.push((4, last, end));
    let entries = meter.entries(start, end).await;
    let mut costs = [Cost::default(); 5];
    for (phase, from, to) in spans {
        let within = entries
            .iter()
            .filter(|r| **r > from.revision && **r <= to.revision)
            .count();
        costs[phase].add(meter.between(from, to, within as f64, n));
    }
    costs
}

fn kib(bytes: f64) -> String {
    format!("{:.2} KiB", bytes / 1024.0)
}

/// Runs jobs of each size and prints what they cost etcd, then the projection.
pub async fn history(endpoint: &str, sizes: &[usize]) {
    let mut meter = Meter::new(endpoint).await;
    let quota = meter.metric("etcd_server_quota_backend_bytes").await;
    let quota = if quota > 0.0 { quota } else { DEFAULT_QUOTA };
    println!(
        "etcd history: jobs of N nodes (round 0, a torch job's store traffic in every round, \
         {RESTARTS} restarts, exit barrier, shutdown); etcd's quota {:.2} GiB",
        quota / (1u64 << 30) as f64
    );
    println!(
        "per node and round (per node for handles and shutdown): revisions, history entries \
         (keys put or deleted), database bytes (in use)"
    );
    let tag = std::process::id();
    let mut per_job = Vec::new();
    for &n in sizes {
        let jobs = match n {
            0..=8 => 20,
            9..=64 => 6,
            65..=256 => 2,
            _ => 1,
        };
        let mut costs = [Cost::default(); 5];
        for j in 0..jobs {
            let run = format!("history-{n}-{j}-{tag}");
            for (total, cost) in costs.iter_mut().zip(job(&mut meter, n, &run).await) {
                total.add(cost);
            }
        }
        for (phase, cost) in PHASES.iter().zip(costs) {
            let c = cost.per();
            println!(
                "N={n:>5}  {phase:<9}  revisions {:>6.2}  entries {:>6.2}  db {:>10} ({:>10} in use)",
                c.revisions,
                c.entries,
                kib(c.size),
                kib(c.in_use)
            );
        }
        // A job with the projection's restarts: handles, form, a bootstrap in every round,
        // a re-form per restart, shutdown.
        let [handles, form, bootstrap, reform, shutdown] = costs.map(|c| c.per());
        let rounds = 1.0 + PROJECTED_RESTARTS;
        let job_of = |f: fn(&Cost) -> f64| {
            f(&handles)
                + f(&form)
                + rounds * f(&bootstrap)
                + PROJECTED_RESTARTS * f(&reform)
                + f(&shutdown)
        };
        let (revisions, size) = (job_of(|c| c.revisions), job_of(|c| c.size));
        println!(
            "N={n:>5}  a job restarting {PROJECTED_RESTARTS} times: per node {revisions:.1} revisions, {}; \
             the job {:.0} revisions, {:.2} MiB",
            kib(size),
            revisions * n as f64,
            size * n as f64 / (1 << 20) as f64
        );
        per_job.push((n, size));
    }
    // The platform: JOBS_A_DAY jobs of N nodes a day, each restarting PROJECTED_RESTARTS
    // times, every byte kept (compaction off).
    println!(
        "a platform of {JOBS_A_DAY} jobs a day, each restarting {PROJECTED_RESTARTS} times, on \
         one etcd (quota {:.2} GiB):",
        quota / (1u64 << 30) as f64
    );
    for (n, size) in per_job {
        let daily = JOBS_A_DAY * n as f64 * size;
        println!(
            "  jobs of {n:>5} nodes: {:.2} GiB of history a day: compaction off, NOSPACE after \
             {:.1} days ({:.0} hours); compacted every 5 minutes (periodic, 5m), at most \
             about {:.0} MiB of history held",
            daily / (1u64 << 30) as f64,
            quota / daily,
            24.0 * quota / daily,
            // Periodic compaction keeps between one and two retention periods.
            daily * 2.0 * 5.0 / (24.0 * 60.0) / (1 << 20) as f64
        );
    }
}
