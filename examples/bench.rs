//! Benchmark: prints rendezvous latency for N nodes, etcd writes per round, and the store's
//! set/get latency and throughput next to raw etcd-client put/get measured in the same run.
//! Run with `scripts/bench.sh` (starts a local etcd) or `cargo run --release --example bench
//! -- HOST:PORT [N ...]`. Numbers are medians; the machine is shared, so compare ratios.

use rdzv::{Params, Rendezvous};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

async fn revision(client: &mut etcd_client::Client) -> i64 {
    client
        .get("/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

/// One round of `n` nodes: handles are created first (not timed), then all call next at once.
/// Returns (time from the last call of next to the last return, etcd writes for the round).
async fn one_round(endpoint: &str, n: usize, run: &str) -> (Duration, i64) {
    let url = format!("etcd://{endpoint}/{run}?min_nodes={n}&max_nodes={n}&join_timeout=120");
    let params = Params::from_url(&url).unwrap();
    let mut nodes = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(64) {
        let batch =
            (chunk * 64..((chunk + 1) * 64).min(n)).map(|_| Rendezvous::new(params.clone()));
        for node in futures_lite(batch).await {
            nodes.push(Arc::new(node.unwrap()));
        }
    }
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let before = revision(&mut client).await;
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
    let writes = revision(&mut client).await - before;
    for node in &nodes {
        node.shutdown().await.unwrap();
    }
    (took, writes)
}

/// The floor for a round of `n` nodes: raw etcd-client doing the minimal etcd work of one
/// round over one shared connection, as rdzv's in-process nodes do. Each node opens a watch on
/// `final` and sends one join transaction; a leader, watching the join prefix, puts `final`
/// (the same size as rdzv's: the member ids as JSON) once all have joined. Returns the time
/// from the last join to the last watcher notified.
async fn floor_round(endpoint: &str, n: usize, run: &str) -> Duration {
    let client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let prefix = format!("/floor/{run}/");
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
    let sealed = serde_json::json!({ "round": 0, "members": ids, "master_addr": "localhost", "master_port": 29500 }).to_string();
    let seal = tokio::spawn(async move {
        let mut seen = 0;
        while seen < n {
            let resp = joins.message().await.unwrap().unwrap();
            seen += resp.events().len();
        }
        leader.put(final_key, sealed, None).await.unwrap();
    });
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = ids
        .into_iter()
        .map(|id| {
            let (mut c, barrier, prefix) = (client.clone(), barrier.clone(), prefix.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let called = Instant::now();
                let mut watch = c.watch(format!("{prefix}final"), None).await.unwrap();
                let join = etcd_client::Txn::new()
                    .when([etcd_client::Compare::create_revision(
                        format!("{prefix}final"),
                        etcd_client::CompareOp::Equal,
                        0,
                    )])
                    .and_then([etcd_client::TxnOp::put(
                        format!("{prefix}join/{id}"),
                        "{\"addr\":\"localhost\",\"port\":29500}",
                        None,
                    )]);
                c.txn(join).await.unwrap();
                loop {
                    let resp = watch.message().await.unwrap().unwrap();
                    if let Some(ev) = resp.events().first() {
                        // Parse as a member would, to find its rank.
                        let v: serde_json::Value =
                            serde_json::from_slice(ev.kv().unwrap().value()).unwrap();
                        assert!(v["members"].as_array().unwrap().iter().any(|m| m == &id));
                        break;
                    }
                }
                (called, Instant::now())
            })
        })
        .collect();
    let took = span(tasks).await;
    seal.await.unwrap();
    took
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
    let mut raw = etcd_client::Client::connect([endpoint], None)
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
        ms(set),
        ms(put),
        set.as_secs_f64() / put.as_secs_f64()
    );
    println!(
        "store get  median {:>10}   raw etcd get median {:>10}   ratio {:.2}x",
        ms(get),
        ms(raw_get),
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
    // Records as C ABI users get them (stderr, RDZV_LOG), so the cost of logging is measured.
    rdzv::log::install_default();
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().expect("usage: bench HOST:PORT [N ...]");
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
        println!("rendezvous: time from the last node's call of next to the last return");
        for &n in &sizes {
            let repeats = match n { 0..=64 => 7, 65..=256 => 3, _ => 3 };
            let mut times = Vec::new();
            let mut writes = 0;
            for r in 0..repeats {
                let (t, w) = one_round(&endpoint, n, &format!("bench-{n}-{r}")).await;
                times.push(t);
                writes = w;
            }
            let min = *times.iter().min().unwrap();
            let max = *times.iter().max().unwrap();
            let mut floors = Vec::new();
            for r in 0..repeats {
                floors.push(floor_round(&endpoint, n, &format!("floor-{n}-{r}")).await);
            }
            let (rdzv, floor) = (median(times), median(floors));
            println!(
                "N={n:>5}  median {:>10}  (min {}, max {}, {repeats} runs)  etcd writes/round {writes}  floor {:>10}  ratio {:.2}x",
                ms(rdzv),
                ms(min),
                ms(max),
                ms(floor),
                rdzv.as_secs_f64() / floor.as_secs_f64()
            );
        }
        store_bench(&endpoint).await;
    });
}
