//! The key layout of one run in etcd. Everything of a run lives under
//! `{key_prefix}/{escaped run id}/`, so runs sharing an etcd cannot see each other's keys:
//!
//! ```text
//! closed                       present once the run is closed (bound to a retention lease)
//! current                      the number of the round open for joining; absent means 0
//! alive/{node}                 one per live node, bound to the node's lease
//! drain/{node}                 the node is leaving (planned): bound to the node's lease
//! r/{round:020}/join/{node}    a node's request to join the round, bound to its lease
//! r/{round:020}/gone/{node}    a node that withdrew its join request (cancel, timeout)
//! r/{round:020}/seal/leader    the node that seals the round, bound to its lease
//! r/{round:020}/seal/final     the sealed round: its size, rank 0's address, its chunk count
//! r/{round:020}/seal/closed    written with `closed` while this round was open: wakes its joiners
//! r/{round:020}/seal/drain/{node}  written with `drain/{node}` while this round was open
//! r/{round:020}/ranks/{chunk}  the members whose id hashes to the chunk, with their ranks
//! r/{round:020}/store/{key}    the round's key-value store
//! ```
//!
//! Round numbers are zero-padded so a range over `r/` lists rounds in order. Everything a
//! joiner waits for lives under its round's `seal/`, so it waits with one watcher.

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
    /// What a joiner of the round waits on: its leader, its seal, and the wake-ups below.
    pub fn seal_prefix(&self, round: u64) -> String {
        format!("{}seal/", self.round_prefix(round))
    }
    pub fn leader(&self, round: u64) -> String {
        format!("{}leader", self.seal_prefix(round))
    }
    pub fn final_(&self, round: u64) -> String {
        format!("{}final", self.seal_prefix(round))
    }
    /// Written in the same transaction as `closed`, in the round open at that moment.
    pub fn closed_wake(&self, round: u64) -> String {
        format!("{}closed", self.seal_prefix(round))
    }
    /// Written in the same transaction as `drain/{node}`, in the round open at that moment.
    pub fn drain_wake(&self, round: u64, node: &str) -> String {
        format!("{}drain/{node}", self.seal_prefix(round))
    }
    pub fn ranks_prefix(&self, round: u64) -> String {
        format!("{}ranks/", self.round_prefix(round))
    }
    pub fn ranks(&self, round: u64, chunk: u32) -> String {
        format!("{}ranks/{chunk:04}", self.round_prefix(round))
    }
    pub fn store_prefix(&self, round: u64) -> String {
        format!("{}store/", self.round_prefix(round))
    }

    /// The node id at the end of a `join/`, `gone/`, `alive/` or `drain/` key.
    pub fn node_of(key: &[u8]) -> Option<&str> {
        let key = std::str::from_utf8(key).ok()?;
        key.rsplit_once('/').map(|(_, node)| node)
    }
}

#[cfg(test)]
mod tests {
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
        // A joiner's one watcher on seal/ must see these and nothing else of the round.
        let seal = keys.seal_prefix(3);
        for key in [
            keys.leader(3),
            keys.final_(3),
            keys.closed_wake(3),
            keys.drain_wake(3, "n1"),
        ] {
            assert!(key.starts_with(&seal), "{key}");
        }
        for key in [
            keys.join(3, "n1"),
            keys.gone(3, "n1"),
            keys.ranks(3, 0),
            keys.store_prefix(3),
        ] {
            assert!(!key.starts_with(&seal), "{key}");
        }
        assert_eq!(Keys::node_of(keys.alive("n7").as_bytes()), Some("n7"));
    }
}
