//! Peers watched directly, so that a machine that dies whole (power, kernel panic, every process
//! killed, its network cut) is out of the round in about a second instead of one `lease_ttl`.
//!
//! Each node listens on a TCP port of its own (`Listener`, published in its join records as
//! `probe`). While it runs in a round, each member connects to the next member in rank order
//! (the last to the first) every `peer_timeout / 5`: a ring, so each node sends and receives a
//! constant number of probes whatever the round's size, and none of them reaches etcd.
//!
//! The kernel answers a connection, not the process: a node whose processes are stopped
//! (SIGSTOP, a debugger, a long pause) or starved of CPU keeps answering and keeps its place.
//! A node is suspected when its port refuses (its processes are gone: a machine that is up
//! answers a closed port with a reset) or when nothing answered for `peer_timeout` (the machine
//! or its network is gone). Then, as SWIM's suspicion and Lifeguard's refutation do, the
//! suspicion is checked before anyone is evicted, through etcd: the prober writes
//! `suspect/{node}`; the suspect, if it still reaches etcd, deletes it (`answer_suspicions`) and
//! stays; if the key is still there after `ANSWER_WINDOW`, the prober revokes the suspect's
//! lease, which ends its membership exactly as an expired lease would (its join keys go, and
//! every member's `num_lost` sees it). A node cut off from its peers but not from etcd thus
//! keeps its place (its workers' own traffic then fails, which their monitors report); a node
//! cut off from etcd but not from its peers is dropped by its lease, as before.

use super::records::{parse_rank_chunk, JoinRecord};
use super::{FinalRecord, LOG_TARGET};
use crate::backend::keys::Keys;
use crate::backend::{backoff, ranges, Etcd, Target};
use etcd_client::{Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a suspect has to answer through etcd before it is evicted: a node that reaches
/// etcd sees its suspicion by watch in a round trip or two.
pub(crate) const ANSWER_WINDOW: Duration = Duration::from_millis(500);
/// After a suspect answered, how long before the same prober may suspect it again: a node its
/// peer cannot reach but etcd can stays, and is not asked again and again.
const AFTER_AN_ANSWER: Duration = Duration::from_secs(5);
/// Failed probes in a row, at the least, before a silent peer is suspected: one late wake-up
/// of this node (its own CPU saturated) is not its peer's silence.
const SILENT_PROBES: u32 = 3;

/// The port a node's peers probe: every connection is accepted and closed at once. Bound on
/// every address of the host, so the address the node publishes (`local_addr` or its host
/// name) reaches it.
pub(crate) struct Listener {
    port: u16,
    task: JoinHandle<()>,
}

impl Listener {
    /// Must be called inside the runtime.
    pub(crate) fn start() -> std::io::Result<Listener> {
        // IPv6's any address takes IPv4 too on Linux; a host without IPv6 takes IPv4's.
        let bound = std::net::TcpListener::bind(("::", 0))
            .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", 0)))?;
        bound.set_nonblocking(true)?;
        let listener = TcpListener::from_std(bound)?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            loop {
                if listener.accept().await.is_err() {
                    // Out of file descriptors, most likely: a probe missed is not fatal.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Ok(Listener { port, task })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a member's peer watch needs: its round, its place in it, and etcd.
pub(crate) struct Ring {
    pub run: String,
    pub etcd: Etcd,
    pub keys: Keys,
    pub sealed: FinalRecord,
    pub node: String,
    pub rank: u32,
    /// The run's lease, which a suspicion is bound to (it goes with the run).
    pub run_lease: i64,
    pub timeout: Duration,
}

/// A member's two tasks for one round: probing its successor, and answering suspicions of
/// itself. Both end when it is dropped (a new round, shutdown).
pub(crate) struct PeerWatch {
    probe: JoinHandle<()>,
    answer: JoinHandle<()>,
}

impl PeerWatch {
    /// Must be called inside the runtime.
    pub(crate) fn start(ring: Ring) -> PeerWatch {
        let answer = tokio::spawn(answer_suspicions(
            ring.etcd.clone(),
            ring.keys.clone(),
            ring.run.clone(),
            ring.node.clone(),
        ));
        let probe = tokio::spawn(probe_successor(ring));
        PeerWatch { probe, answer }
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        self.probe.abort();
        self.answer.abort();
    }
}

/// The other members in ring order, starting with the one after this one in rank order. In a
/// round of several lanes (over 64 members), the members of this node's lane: each node reads
/// its own lane's ranks only (about 64), never the whole member list, which would cost a round
/// of N nodes N² bytes. None when etcd does not say.
async fn members_after(ring: &Ring) -> Option<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let round = ring.sealed.round;
    let ranked: Vec<(String, u32)> = match &ring.sealed.members {
        Some(members) => members.iter().cloned().zip(0..).collect(),
        None => {
            let lane = ring
                .keys
                .lane_sealed(round, ring.sealed.chunk_of(&ring.node));
            let resp = ring
                .etcd
                .get(
                    deadline,
                    "peer watch: the lane's ranks",
                    lane,
                    GetOptions::new(),
                )
                .await
                .ok()?;
            let kv = resp.kvs().first()?;
            parse_rank_chunk(kv.key(), kv.value()).ok()?
        }
    };
    Some(ring_after(ranked, ring.rank))
}

/// The members but `rank` (each given with its rank) in ring order: those after it by rank,
/// then those before it.
fn ring_after(members: impl IntoIterator<Item = (String, u32)>, rank: u32) -> Vec<String> {
    let mut ranked: Vec<(u32, String)> = members
        .into_iter()
        .filter(|(_, r)| *r != rank)
        .map(|(m, r)| (r, m))
        .collect();
    ranked.sort();
    let after = ranked.partition_point(|(r, _)| *r < rank);
    ranked.rotate_left(after);
    ranked.into_iter().map(|(_, m)| m).collect()
}

/// Where a member listens for probes, as its join record of the round says.
enum Address {
    At(SocketAddr),
    /// Its join key is gone: it is out of the round already.
    Gone,
    /// It publishes no port (an older node, or `peer_timeout=0`), or etcd or the name's lookup
    /// did not answer.
    Unknown,
}

/// Where `peer` listens for probes: one read of its join record of the round.
async fn probe_address(ring: &Ring, peer: &str) -> Address {
    let read = ring
        .etcd
        .get(
            Instant::now() + Duration::from_secs(10),
            "peer watch: the next member's join record",
            ring.keys.join(ring.sealed.round, peer),
            GetOptions::new(),
        )
        .await;
    let Ok(resp) = read else {
        return Address::Unknown;
    };
    let Some(kv) = resp.kvs().first() else {
        return Address::Gone;
    };
    let Some((host, port)) = JoinRecord::parse(kv.key(), kv.value())
        .ok()
        .and_then(|r| r.probe.map(|p| (r.addr, p)))
    else {
        return Address::Unknown;
    };
    let found = tokio::net::lookup_host((host.as_str(), port)).await;
    let first = found.ok().and_then(|mut addrs| addrs.next());
    first.map_or(Address::Unknown, Address::At)
}

/// Probes the next member until it is evicted, then the one after it (a rack that fails
/// whole is found member by member, not left to its leases), until none is left or this
/// watch ends.
async fn probe_successor(ring: Ring) {
    let Some(after) = members_after(&ring).await else {
        return;
    };
    for peer in after {
        match probe_address(&ring, &peer).await {
            // Returns once the peer is out of the round: on to the next.
            Address::At(addr) => probe(&ring, &peer, addr).await,
            // Out already: the one after it is this node's to watch.
            Address::Gone => continue,
            Address::Unknown => return,
        }
    }
}

/// Probes `peer` at `addr` until it is evicted or found gone.
async fn probe(ring: &Ring, peer: &str, addr: SocketAddr) {
    let (run, round) = (&ring.run, ring.sealed.round);
    tracing::debug!(target: LOG_TARGET, run = %run, node = %ring.node, round, peer = %peer,
        addr = %addr, "peer watch: probing the next member");
    let every = (ring.timeout / 5).max(Duration::from_millis(10));
    let mut answered = Instant::now();
    let mut silent = 0u32;
    let mut quiet_until = None::<Instant>;
    loop {
        let started = Instant::now();
        // Polled before its deadline, so a connection made while this node was not running
        // counts as an answer.
        let why = match tokio::time::timeout(every, TcpStream::connect(addr)).await {
            Ok(Ok(_connected)) => {
                answered = Instant::now();
                silent = 0;
                None
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Some("its port refused: no process of it listens".to_string())
            }
            _ => {
                silent += 1;
                let quiet = answered.elapsed();
                (quiet >= ring.timeout && silent >= SILENT_PROBES)
                    .then(|| format!("no answer for {} ms", quiet.as_millis()))
            }
        };
        let held_off = quiet_until.is_some_and(|t| Instant::now() < t);
        if let (Some(why), false) = (why, held_off) {
            match suspect(ring, peer, &why, answered).await {
                Suspicion::Evicted | Suspicion::Gone => return,
                Suspicion::Answered => quiet_until = Some(Instant::now() + AFTER_AN_ANSWER),
                Suspicion::Unknown => {}
            }
        }
        tokio::time::sleep_until(started + every).await;
    }
}

enum Suspicion {
    /// Its lease was revoked: it is out of the round.
    Evicted,
    /// It answered through etcd: it stays.
    Answered,
    /// It was out of the round already.
    Gone,
    /// etcd did not answer this node: nothing was decided.
    Unknown,
}

/// Writes the suspicion, gives the suspect `ANSWER_WINDOW` to delete it, and evicts it if it
/// did not (`answered`: when it last answered a probe, for the eviction's note).
async fn suspect(ring: &Ring, peer: &str, why: &str, answered: Instant) -> Suspicion {
    let (etcd, keys) = (&ring.etcd, &ring.keys);
    let (run, round) = (&ring.run, ring.sealed.round);
    let join = keys.join(round, peer);
    let key = keys.suspect(peer);
    let deadline = Instant::now() + ANSWER_WINDOW;
    let asked = Instant::now();
    let txn = Txn::new()
        .when([Compare::version(join.clone(), CompareOp::Greater, 0)])
        .and_then([TxnOp::put(
            key.clone(),
            ring.node.clone(),
            Some(PutOptions::new().with_lease(ring.run_lease)),
        )]);
    match etcd.txn(deadline, "peer watch: suspect", txn).await {
        Ok(resp) if !resp.succeeded() => return Suspicion::Gone,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(target: LOG_TARGET, run = %run, node = %ring.node, round, peer,
                error = %e, "peer watch: the next member is unreachable ({why}), and so is etcd: nothing decided");
            return Suspicion::Unknown;
        }
    }
    tracing::info!(target: LOG_TARGET, run = %run, node = %ring.node, round, peer, why,
        "peer watch: the next member is unreachable: suspected, waiting for it to answer through etcd");
    // Its answer is the key's deletion. Read a few times rather than watched: this runs only
    // on a suspicion, and reads are simpler to bound.
    let answer_by = asked + ANSWER_WINDOW;
    loop {
        let left = answer_by.saturating_duration_since(Instant::now());
        tokio::time::sleep(left.min(ANSWER_WINDOW / 5)).await;
        let read = Txn::new().and_then([
            TxnOp::get(key.clone(), Some(GetOptions::new().with_count_only())),
            TxnOp::get(join.clone(), None),
        ]);
        let Ok(resp) = etcd
            .txn(
                Instant::now() + ANSWER_WINDOW,
                "peer watch: the answer",
                read,
            )
            .await
        else {
            return Suspicion::Unknown;
        };
        let got = ranges(&resp);
        let still_suspected = got.first().is_some_and(|g| g.count() > 0);
        let Some(lease) = got
            .get(1)
            .and_then(|g| g.kvs().first())
            .map(|kv| kv.lease())
        else {
            return Suspicion::Gone;
        };
        if !still_suspected {
            tracing::info!(target: LOG_TARGET, run = %run, node = %ring.node, round, peer,
                answered_ms = asked.elapsed().as_millis() as u64,
                "peer watch: the suspect answered through etcd: it keeps its place");
            return Suspicion::Answered;
        }
        if Instant::now() < answer_by {
            continue;
        }
        // The eviction's note goes first, with the suspicion's end: once the lease is revoked
        // the round re-forms at once, and this watch ends with it.
        let note = eviction_note(ring, why, [answered, asked, Instant::now()]);
        let lease_opt = PutOptions::new().with_lease(ring.run_lease);
        let done = [
            TxnOp::delete(key.clone(), None),
            TxnOp::put(keys.eviction_note(peer), note, Some(lease_opt)),
        ];
        let noted = etcd
            .txn(
                Instant::now() + Duration::from_secs(1),
                "peer watch: the suspicion done",
                Txn::new().and_then(done),
            )
            .await;
        let revoked =
            crate::backend::lease::revoke(etcd, lease, Instant::now() + Duration::from_secs(2))
                .await;
        let outcome = match revoked {
            // A death found and handled, as a lost member is: not a warning.
            Ok(()) => {
                tracing::info!(target: LOG_TARGET, run = %run, node = %ring.node, round, peer, why,
                    lease, "peer watch: evicted the next member (unreachable, and it did not answer through etcd): revoked its lease");
                Suspicion::Evicted
            }
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, run = %run, node = %ring.node, round, peer,
                    error = %e, "peer watch: could not revoke the suspect's lease");
                if noted.is_ok() {
                    let undo = Txn::new().and_then([TxnOp::delete(keys.eviction_note(peer), None)]);
                    let _ = etcd
                        .txn(
                            Instant::now() + Duration::from_secs(1),
                            "peer watch: no eviction",
                            undo,
                        )
                        .await;
                }
                Suspicion::Unknown
            }
        };
        return outcome;
    }
}

/// The run's note of an eviction (`notes/evicted/{node}`, `rdzv status` shows it, and the
/// launcher's incident records read it): who evicted it in which round and why, and the
/// wall-clock milliseconds of its last answer (the fault, as near as a prober can tell), of the
/// suspicion and of the eviction.
fn eviction_note(ring: &Ring, why: &str, [answered, suspected, evicted]: [Instant; 3]) -> String {
    let now = (Instant::now(), std::time::SystemTime::now());
    let wall = |at: Instant| {
        (now.1 - now.0.saturating_duration_since(at))
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    serde_json::json!({
        "by": ring.node,
        "round": ring.sealed.round,
        "why": why,
        "answered_ms": wall(answered),
        "suspected_ms": wall(suspected),
        "evicted_ms": wall(evicted),
    })
    .to_string()
}

/// Deletes every suspicion of this node as soon as it appears: a node that reaches etcd is
/// alive, whatever its peer could not reach. One watch, so it costs etcd nothing at rest.
async fn answer_suspicions(etcd: Etcd, keys: Keys, run: String, node: String) {
    let key = keys.suspect(&node);
    let mut attempt = 0u32;
    loop {
        let deadline = Instant::now() + Duration::from_secs(10);
        if let Ok(mut watch) = etcd.watch(&[Target::Key(key.clone())], deadline).await {
            attempt = 0;
            // Watched, then read: one written before the watch is answered too.
            let mut pending = etcd
                .get(
                    deadline,
                    "peer watch: suspicions",
                    key.clone(),
                    GetOptions::new(),
                )
                .await
                .map(|r| r.kvs().first().map(|kv| kv.value().to_vec()))
                .unwrap_or(None);
            loop {
                if let Some(by) = pending.take() {
                    let answered = etcd
                        .txn(
                            Instant::now() + ANSWER_WINDOW,
                            "peer watch: answer",
                            Txn::new().and_then([TxnOp::delete(key.clone(), None)]),
                        )
                        .await;
                    tracing::info!(target: LOG_TARGET, run = %run, node = %node,
                        by = %String::from_utf8_lossy(&by), answered = answered.is_ok(),
                        "peer watch: a peer could not reach this node; answered through etcd");
                }
                let Some(events) = watch.events().await else {
                    break;
                };
                pending = events
                    .iter()
                    .rev()
                    .filter(|ev| ev.event_type() == EventType::Put)
                    .find_map(|ev| ev.kv())
                    .map(|kv| kv.value().to_vec());
            }
        }
        backoff(&mut attempt, Instant::now() + Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::ring_after;

    fn ranked(ranks: &[u32]) -> Vec<(String, u32)> {
        ranks.iter().map(|r| (format!("n{r}"), *r)).collect()
    }

    #[test]
    fn each_member_probes_the_next_in_rank_order_and_the_last_the_first() {
        let ring = ranked(&[0, 1, 2, 3]);
        assert_eq!(ring_after(ring.clone(), 0), ["n1", "n2", "n3"]);
        assert_eq!(ring_after(ring.clone(), 2), ["n3", "n0", "n1"]);
        assert_eq!(ring_after(ring, 3), ["n0", "n1", "n2"]);
        // A lane holds some ranks of the round, in any order: the ring is over those.
        let lane = ranked(&[17, 3, 40]);
        assert_eq!(ring_after(lane.clone(), 3), ["n17", "n40"]);
        assert_eq!(ring_after(lane.clone(), 17), ["n40", "n3"]);
        assert_eq!(ring_after(lane, 40), ["n3", "n17"]);
    }

    #[test]
    fn a_member_alone_probes_no_one() {
        assert!(ring_after(ranked(&[5]), 5).is_empty());
        assert!(ring_after(ranked(&[]), 0).is_empty());
    }
}
