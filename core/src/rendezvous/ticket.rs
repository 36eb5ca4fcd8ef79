//! A release ticket: what another process needs to end this node's membership at once, when
//! this process cannot (it was SIGKILLed or OOM-killed). It names the node and the lease its
//! keys are bound to. `Admin::release` revokes that lease, which deletes the node's `alive`
//! key, its join keys and any leadership it held, so the other members' watches see the loss
//! within a round trip instead of when the lease would have expired (`lease_ttl`).
//!
//! A ticket carries no credentials: whoever uses it needs its own connection to the run's etcd
//! (an `Admin`). It is only ever used to revoke the lease the node's `alive` key is still bound
//! to, so a stale ticket (the node has taken a new lease since) or a wrong one does nothing,
//! and no ticket can revoke the run's lease or another node's.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// A node and its lease, as `Rendezvous::release_ticket` hands it out. Written and parsed as
/// `NODE_ID:LEASE_HEX` (a line a launcher can pass to a helper process).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReleaseTicket {
    /// The node's id, as `Rendezvous::node_id` gives it.
    pub node: String,
    /// The id of the lease the node's keys are bound to.
    pub lease: i64,
}

impl fmt::Display for ReleaseTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:x}", self.node, self.lease)
    }
}

impl FromStr for ReleaseTicket {
    type Err = Error;

    fn from_str(s: &str) -> Result<ReleaseTicket> {
        let bad = || {
            Error::invalid(format!(
                "release ticket: expected NODE_ID:LEASE_HEX (as Rendezvous::release_ticket \
                 writes it), got {s:?}"
            ))
        };
        let (node, lease) = s.trim().split_once(':').ok_or_else(bad)?;
        let valid_node =
            !node.is_empty() && node.len() <= 64 && node.bytes().all(|b| b.is_ascii_hexdigit());
        let lease = i64::from_str_radix(lease, 16).map_err(|_| bad())?;
        if !valid_node || lease <= 0 {
            return Err(bad());
        }
        Ok(ReleaseTicket {
            node: node.to_string(),
            lease,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_reads_back_as_written() {
        let t = ReleaseTicket {
            node: "0123456789abcdef".into(),
            lease: 0x694d_8a1b_22c4_07f1,
        };
        assert_eq!(t.to_string().parse::<ReleaseTicket>().unwrap(), t);
    }

    #[test]
    fn malformed_tickets_are_refused() {
        for bad in [
            "", "abc", "abc:", ":12", "xyz:12", "ab/cd:12", "ab:-1", "ab:0", "ab:zz",
        ] {
            let e = bad.parse::<ReleaseTicket>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{bad:?}");
        }
    }
}
