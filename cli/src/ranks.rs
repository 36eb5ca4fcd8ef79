//! Worker ranks from a round, as torchelastic's agent assigns them: every node publishes
//! (role, node rank, local world size) in the round's store and reads everyone's; then
//!
//! - global ranks: a node's workers get `[offset, offset + local_world_size)`, where offset is
//!   the sum of the local world sizes of the nodes ranked before it (so nodes may run
//!   different numbers of workers);
//! - role ranks: the same, counted only over nodes of the same role, ordered by node rank.
//!
//! With `--framework=jax`, node rank 0 also publishes a port for JAX's coordinator service, picked
//! free on that node for this round; every worker learns it with its ranks.
//!
//! Node ranks come from the rendezvous, which keeps them stable across rounds, so global
//! rank 0 stays on the same node while it lives.

use serde_json::json;

/// One node's entry in the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub role: String,
    pub group_rank: u32,
    pub local_world_size: u32,
    /// A framework coordinator's port on this node (published by node rank 0 only, and only
    /// when the framework needs one): absent from the entry when `None`, so entries read the
    /// same as before to launchers that know nothing of it.
    pub coordinator_port: Option<u16>,
    /// The restarts the job had spent when this node read them, just before the exchange
    /// (absent when it could not read them): every node of a round takes the least of these,
    /// so that all its workers get the same `TORCHELASTIC_RESTART_COUNT` (`job_restarts`).
    pub restarts: Option<u32>,
}

impl NodeInfo {
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = json!({"role": self.role, "rank": self.group_rank, "local_world_size": self.local_world_size});
        if let Some(port) = self.coordinator_port {
            v["coordinator_port"] = json!(port);
        }
        if let Some(n) = self.restarts {
            v["restarts"] = json!(n);
        }
        v.to_string().into_bytes()
    }

    pub fn parse(bytes: &[u8]) -> Option<NodeInfo> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        Some(NodeInfo {
            role: v.get("role")?.as_str()?.to_string(),
            group_rank: u32::try_from(v.get("rank")?.as_u64()?).ok()?,
            local_world_size: u32::try_from(v.get("local_world_size")?.as_u64()?).ok()?,
            coordinator_port: match v.get("coordinator_port") {
                None => None,
                Some(p) => Some(u16::try_from(p.as_u64()?).ok()?),
            },
            restarts: v
                .get("restarts")
                .and_then(|n| u32::try_from(n.as_u64()?).ok()),
        })
    }
}

/// The store key under which node `group_rank` publishes its entry (torchelastic's prefix).
pub fn key(group_rank: u32) -> String {
    format!("torchelastic/role_info/{group_rank}")
}

/// One worker's ranks and world sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRanks {
    pub local_rank: u32,
    pub local_world_size: u32,
    pub global_rank: u32,
    pub role_rank: u32,
    pub world_size: u32,
    pub role_world_size: u32,
    /// The port node rank 0 published for a framework's coordinator, if it did.
    pub coordinator_port: Option<u16>,
}

/// The restarts the job had spent as the round's nodes read them before the exchange: the
/// least (a node that read before another's refund read one too many; no node of the round can
/// have charged a restart yet, since none has started its workers). None when no node could
/// read them.
pub fn job_restarts(infos: &[NodeInfo]) -> Option<u32> {
    infos.iter().filter_map(|i| i.restarts).min()
}

/// The ranks of node `me`'s workers, given every node's entry indexed by node rank.
pub fn assign(infos: &[NodeInfo], me: u32) -> Vec<WorkerRanks> {
    let mine = &infos[me as usize];
    let world_size: u32 = infos.iter().map(|i| i.local_world_size).sum();
    let offset: u32 = infos[..me as usize]
        .iter()
        .map(|i| i.local_world_size)
        .sum();
    let same_role = || infos.iter().filter(|i| i.role == mine.role);
    let role_world_size: u32 = same_role().map(|i| i.local_world_size).sum();
    let role_offset: u32 = same_role()
        .filter(|i| i.group_rank < mine.group_rank)
        .map(|i| i.local_world_size)
        .sum();
    let coordinator_port = infos[0].coordinator_port;
    (0..mine.local_world_size)
        .map(|local_rank| WorkerRanks {
            local_rank,
            local_world_size: mine.local_world_size,
            global_rank: offset + local_rank,
            role_rank: role_offset + local_rank,
            world_size,
            role_world_size,
            coordinator_port,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(role: &str, rank: u32, n: u32) -> NodeInfo {
        NodeInfo {
            role: role.into(),
            group_rank: rank,
            local_world_size: n,
            coordinator_port: None,
            restarts: None,
        }
    }

    #[test]
    fn nodes_with_different_worker_counts() {
        let infos = [info("t", 0, 2), info("t", 1, 3), info("t", 2, 1)];
        let ranks: Vec<u32> = assign(&infos, 1).iter().map(|w| w.global_rank).collect();
        assert_eq!(ranks, [2, 3, 4]);
        assert!(assign(&infos, 2).iter().all(|w| w.world_size == 6));
        assert_eq!(assign(&infos, 2)[0].global_rank, 5);
    }

    #[test]
    fn role_ranks_count_only_the_same_role() {
        let infos = [
            info("trainer", 0, 2),
            info("ps", 1, 1),
            info("trainer", 2, 2),
        ];
        let w = assign(&infos, 2);
        assert_eq!(w.iter().map(|w| w.global_rank).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(w.iter().map(|w| w.role_rank).collect::<Vec<_>>(), [2, 3]);
        assert!(w
            .iter()
            .all(|w| w.role_world_size == 4 && w.world_size == 5));
        let ps = assign(&infos, 1);
        assert_eq!((ps[0].role_rank, ps[0].role_world_size), (0, 1));
    }

    #[test]
    fn entries_round_trip() {
        let i = info("x", 3, 4);
        assert_eq!(NodeInfo::parse(&i.to_json()), Some(i.clone()));
        assert!(!String::from_utf8(i.to_json())
            .unwrap()
            .contains("coordinator_port"));
        let with_port = NodeInfo {
            coordinator_port: Some(40123),
            ..i
        };
        assert_eq!(NodeInfo::parse(&with_port.to_json()), Some(with_port));
        assert_eq!(NodeInfo::parse(b"junk"), None);
        assert_eq!(
            NodeInfo::parse(
                br#"{"role":"x","rank":0,"local_world_size":1,"coordinator_port":70000}"#
            ),
            None
        );
    }

    #[test]
    fn every_worker_learns_node_rank_0s_coordinator_port() {
        let mut infos = [info("t", 0, 1), info("t", 1, 2)];
        assert!(assign(&infos, 1)
            .iter()
            .all(|w| w.coordinator_port.is_none()));
        infos[0].coordinator_port = Some(41000);
        for me in [0, 1] {
            assert!(assign(&infos, me)
                .iter()
                .all(|w| w.coordinator_port == Some(41000)));
        }
    }
}
