//! The key layout of one run in etcd. Everything of a run lives under
//! `{key_prefix}/{escaped run id}/`, so runs sharing an etcd cannot see each other's keys:
//!
//! ```text
//! closed                       present once the run is closed (bound to a retention lease)
//! lease                        the id of the run's lease, bound to that lease
//! current                      the number of the round open for joining; absent means 0
//! alive/{node}                 one per live node, bound to the node's lease
//! drain/{node}                 the node is leaving (planned): bound to the node's lease
//! suspect/{node}               a peer cannot reach the node: the node deletes it if it can
//!                              (rendezvous/peers.rs); bound to the suspecting node's lease
//! r/{round:020}/join/{node}    a node's request to join the round, bound to its lease
//! r/{round:020}/gone/{node}    a node that withdrew its join request (cancel, timeout)
//! r/{round:020}/seal/leader    the node that seals the round, bound to its lease
//! r/{round:020}/seal/lanes     how many lanes the leader uses, written and bound with `leader`
//! r/{round:020}/seal/final     the sealed round: its size, rank 0's address, its lane count
//! r/{round:020}/lane/{k:04}/sealed  `final` plus the ranks of the members of lane k
//! r/{round:020}/lane/{k:04}/closed  written with `closed` while this round was open
//! r/{round:020}/lane/{k:04}/drain/{node}  written with `drain/{node}` while this round was open
//! r/{round:020}/store/{key}    the round's key-value store
//! store/{key}                  the run's key-value store (across rounds), bound to the run's lease
//! store/notes/{name}           the run's notes: keys of the run's store that `Admin::status` shows
//! ```
//!
//! Round numbers are zero-padded so a range over `r/` lists rounds in order. A node's lane is
//! a hash of its id (`records::chunk_of`); everything a joiner waits for, but its leader, is
//! under its lane, so it waits with two watchers (`leader`, and its lane) that see only its own
//! lane's seal: the seal reaches each node with its own rank, and no node receives the others'
//! ranks.

/// Bytes that stay as they are in an escaped run id; everything else becomes `%XX`, so a run
/// id with `/`, `%` or control bytes cannot reach outside its own directory.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

pub fn escape_run_id(run_id: &str) -> String {
    let mut out = String::with_capacity(run_id.len());
    for &b in run_id.as_bytes() {
        if is_plain(b) && !(out.is_empty() && b == b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The run id `escape_run_id` made `escaped` from; None if `escaped` is not one it makes.
pub fn unescape_run_id(escaped: &str) -> Option<String> {
    let mut out = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b if is_plain(b) => out.push(b),
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// Where the run's notes are in the run's store (a key of that store, as its user writes it).
pub const RUN_NOTES: &str = "notes/";

#[derive(Clone, Debug)]
pub struct Keys {
    namespace: String,
}

impl Keys {
    pub fn new(key_prefix: &str, run_id: &str) -> Keys {
        let prefix = key_prefix.trim_end_matches('/');
        Keys {
            namespace: format!("{prefix}/{}/", escape_run_id(run_id)),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    pub fn closed(&self) -> String {
        format!("{}closed", self.namespace)
    }
    pub fn current(&self) -> String {
        format!("{}current", self.namespace)
    }
    /// The run's lease: every key of the run that no single node owns is bound to it, and
    /// every live node refreshes it, so those keys expire once no node is left to refresh it.
    pub fn run_lease(&self) -> String {
        format!("{}lease", self.namespace)
    }
    pub fn alive_prefix(&self) -> String {
        format!("{}alive/", self.namespace)
    }
    pub fn alive(&self, node: &str) -> String {
        format!("{}alive/{node}", self.namespace)
    }
    pub fn drain_prefix(&self) -> String {
        format!("{}drain/", self.namespace)
    }
    pub fn drain(&self, node: &str) -> String {
        format!("{}drain/{node}", self.namespace)
    }
    pub fn suspect(&self, node: &str) -> String {
        format!("{}suspect/{node}", self.namespace)
    }
    /// The run's note of `node`'s eviction by the peer watch (`rendezvous::peers`).
    pub fn eviction_note(&self, node: &str) -> String {
        format!("{}evicted/{node}", self.run_notes_prefix())
    }
    pub fn rounds_prefix(&self) -> String {
        format!("{}r/", self.namespace)
    }
    pub fn round_prefix(&self, round: u64) -> String {
        format!("{}r/{round:020}/", self.namespace)
    }
    pub fn join_prefix(&self, round: u64) -> String {
        format!("{}join/", self.round_prefix(round))
    }
    pub fn join(&self, round: u64, node: &str) -> String {
        format!("{}join/{node}", self.round_prefix(round))
    }
    pub fn gone_prefix(&self, round: u64) -> String {
        format!("{}gone/", self.round_prefix(round))
    }
    pub fn gone(&self, round: u64, node: &str) -> String {
        format!("{}gone/{node}", self.round_prefix(round))
    }
    pub fn leader(&self, round: u64) -> String {
        format!("{}seal/leader", self.round_prefix(round))
    }
    /// The leader's lane count, so that joiners and closers write and watch the same lanes.
    pub fn lanes(&self, round: u64) -> String {
        format!("{}seal/lanes", self.round_prefix(round))
    }
    pub fn final_(&self, round: u64) -> String {
        format!("{}seal/final", self.round_prefix(round))
    }
    pub fn lanes_prefix(&self, round: u64) -> String {
        format!("{}lane/", self.round_prefix(round))
    }
    /// What the joiners of lane `lane` wait on, with `leader`: the keys below.
    pub fn lane_prefix(&self, round: u64, lane: u32) -> String {
        format!("{}lane/{lane:04}/", self.round_prefix(round))
    }
    /// The seal as the lane's joiners receive it: `final` and the lane's ranks.
    pub fn lane_sealed(&self, round: u64, lane: u32) -> String {
        format!("{}sealed", self.lane_prefix(round, lane))
    }
    /// Written in the same transaction as `closed`, in every lane of the round open then.
    pub fn lane_closed(&self, round: u64, lane: u32) -> String {
        format!("{}closed", self.lane_prefix(round, lane))
    }
    /// Written in the same transaction as `drain/{node}`, in the node's lane of the round
    /// open then.
    pub fn lane_drain(&self, round: u64, lane: u32, node: &str) -> String {
        format!("{}drain/{node}", self.lane_prefix(round, lane))
    }
    /// Whether `key` is a lane's `sealed` key (a read of `lane/` also returns the others,
    /// among them `drain/{node}` of a node that may be called `sealed`).
    pub fn is_lane_sealed(key: &[u8]) -> bool {
        let mut parts = key.rsplit(|&b| b == b'/');
        parts.next() == Some(b"sealed")
            && parts
                .next()
                .is_some_and(|lane| !lane.is_empty() && lane.iter().all(u8::is_ascii_digit))
    }
    pub fn store_prefix(&self, round: u64) -> String {
        format!("{}store/", self.round_prefix(round))
    }
    /// The run's store: it lives as long as the run (its values are bound to the run's lease,
    /// its writes guarded by `lease`), across rounds.
    pub fn run_store_prefix(&self) -> String {
        format!("{}store/", self.namespace)
    }
    /// The run's notes: the keys of the run's store under `notes/`, which operators see in
    /// the run's status.
    pub fn run_notes_prefix(&self) -> String {
        format!("{}{RUN_NOTES}", self.run_store_prefix())
    }

    /// The receipts of store adds (`Store::add`): a key per add, written with its sum in the
    /// add's own transaction, so that an add sent again after its answer was lost finds its
    /// write applied instead of adding twice. Deleted by the node's next add and with the run.
    pub fn add_receipts_prefix(&self) -> String {
        format!("{}adds/", self.namespace)
    }

    /// The node id at the end of a `join/`, `gone/`, `alive/` or `drain/` key.
    pub fn node_of(key: &[u8]) -> Option<&str> {
        let key = std::str::from_utf8(key).ok()?;
        key.rsplit_once('/').map(|(_, node)| node)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_escaped_run_id_is_read_back_as_it_was() {
        for run in ["job-42", "a/b", "100%", ".hidden", "ünï", "x y"] {
            assert_eq!(unescape_run_id(&escape_run_id(run)).as_deref(), Some(run));
        }
        assert_eq!(unescape_run_id("bad/slash"), None);
        assert_eq!(unescape_run_id("%G0"), None);
    }

    use super::*;

    #[test]
    fn run_ids_cannot_escape_their_namespace() {
        let keys = Keys::new("/rdzv", "../other/job");
        assert_eq!(keys.namespace(), "/rdzv/%2E.%2Fother%2Fjob/");
        assert!(!keys.namespace()["/rdzv/".len()..]
            .trim_end_matches('/')
            .contains('/'));
        let a = Keys::new("/rdzv", "a/b");
        let b = Keys::new("/rdzv", "a%2Fb");
        assert_ne!(a.namespace(), b.namespace(), "escaping must be injective");
    }

    #[test]
    fn rounds_sort_in_numeric_order() {
        let keys = Keys::new("/p/", "job");
        assert!(keys.round_prefix(9) < keys.round_prefix(10));
        assert_eq!(keys.join(3, "n1"), "/p/job/r/00000000000000000003/join/n1");
        // A joiner's watcher on its lane must see these and nothing else of the round.
        let lane = keys.lane_prefix(3, 1);
        for key in [
            keys.lane_sealed(3, 1),
            keys.lane_closed(3, 1),
            keys.lane_drain(3, 1, "n1"),
        ] {
            assert!(key.starts_with(&lane), "{key}");
        }
        for key in [
            keys.join(3, "n1"),
            keys.gone(3, "n1"),
            keys.leader(3),
            keys.final_(3),
            keys.lane_sealed(3, 0),
            keys.lane_sealed(3, 10),
            keys.store_prefix(3),
        ] {
            assert!(!key.starts_with(&lane), "{key}");
        }
        assert!(Keys::is_lane_sealed(keys.lane_sealed(3, 7).as_bytes()));
        assert!(!Keys::is_lane_sealed(keys.lane_closed(3, 7).as_bytes()));
        assert!(!Keys::is_lane_sealed(
            keys.lane_drain(3, 7, "sealed").as_bytes()
        ));
        assert_eq!(Keys::node_of(keys.alive("n7").as_bytes()), Some("n7"));
    }

    #[test]
    fn the_run_store_is_apart_from_the_rounds_and_the_run_s_own_keys() {
        let keys = Keys::new("/p", "job");
        let store = keys.run_store_prefix();
        assert_eq!(store, "/p/job/store/");
        assert!(keys.run_notes_prefix().starts_with(&store));
        for key in [
            keys.closed(),
            keys.current(),
            keys.run_lease(),
            keys.alive("n1"),
            keys.drain("n1"),
            keys.rounds_prefix(),
            keys.store_prefix(0),
        ] {
            assert!(!key.starts_with(&store), "{key}");
        }
    }
}
