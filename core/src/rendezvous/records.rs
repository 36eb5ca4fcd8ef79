//! The JSON values stored under a run's keys. Parsing is strict: anything that does not have
//! the expected shape is foreign or corrupt data and becomes a state error naming the key.

use crate::error::{Error, Result};
use serde_json::{json, Value};

/// The value of `r/{round}/join/{node}`: what a node brings to a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRecord {
    /// Address this node would publish as MASTER_ADDR if it became rank 0.
    pub addr: String,
    /// Port this node would publish as MASTER_PORT if it became rank 0.
    pub port: u16,
    /// The round this node last completed and its rank there, for stable ranks.
    pub last: Option<(u64, u32)>,
    /// The TCP port on `addr` its peers probe while it runs in a round (`peers.rs`); `None`
    /// from a node that watches no peer (older, or `peer_timeout=0`), which is then probed by
    /// no one.
    pub probe: Option<u16>,
}

/// The value of `r/{round}/seal/final`: the round's size, rank 0's bootstrap address and its
/// lane count. Written once, never changed. Its size does not grow with the round. The member
/// list is spread over the round's lanes by a hash of each id (`chunk_of`): the seal writes,
/// in the same transaction, one `lane/{k}/sealed` per lane holding this record and the ranks of
/// that lane's members, and each joiner watches only its own lane, so it receives its rank with
/// the seal and a round of N moves O(N) bytes, not O(N²). A round of one lane (`max_nodes` at
/// most 64) carries its member list in this record itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalRecord {
    pub round: u64,
    pub world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// How many lanes (chunks of the member list) the round has.
    pub chunks: u32,
    /// The member list in rank order, when the round has one chunk (`inline_members`).
    pub members: Option<std::sync::Arc<[String]>>,
    /// Read from a lane's `sealed` key: that lane's number and its members' ranks.
    pub lane: Option<(u32, LaneRanks)>,
}

/// The members of one lane with their ranks.
pub type LaneRanks = std::sync::Arc<[(String, u32)]>;

/// Members per lane the seal aims at.
const CHUNK_TARGET: usize = 64;
/// The most chunks a seal writes: the seal is one transaction, and etcd refuses one of more
/// than 128 operations by default (`--max-txn-ops`); the seal's other writes fit in the rest.
/// Beyond 6400 members the chunks grow instead (N/100 ids each).
pub(crate) const MAX_CHUNKS: usize = 100;

/// The member list `final` carries itself: a round's whole list when it has one lane.
pub fn inline_members(members: &[String], chunks: u32) -> Option<std::sync::Arc<[String]>> {
    (chunks == 1).then(|| members.into())
}

/// How many chunks (lanes) a round of up to `n` members is spread over: the leader's seal
/// uses `chunk_count(max_nodes)`, fixed before anyone joins, since a joiner must know its
/// lane before it joins.
pub fn chunk_count(n: usize) -> u32 {
    n.div_ceil(CHUNK_TARGET).clamp(1, MAX_CHUNKS) as u32
}

/// The chunk that holds `node`'s rank: a hash of its id (FNV-1a), so any node finds its own
/// chunk from the `final` record alone.
pub fn chunk_of(node: &str, chunks: u32) -> u32 {
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % u64::from(chunks.max(1))) as u32
}

/// The values of a round's `lane/{k}/sealed` keys, by lane: each `sealed` with its lane's
/// number and, unless `sealed` carries the whole list itself, a JSON object from node id to
/// rank holding the members whose id hashes to that lane.
pub fn lane_values(sealed: &FinalRecord, members: &[String]) -> Vec<String> {
    let mut ranks = vec![serde_json::Map::new(); sealed.chunks as usize];
    if sealed.members.is_none() {
        for (rank, node) in members.iter().enumerate() {
            ranks[chunk_of(node, sealed.chunks) as usize].insert(node.clone(), json!(rank));
        }
    }
    let base = sealed.to_value();
    ranks
        .into_iter()
        .enumerate()
        .map(|(lane, ranks)| {
            let mut v = base.clone();
            v["lane"] = json!(lane);
            if sealed.members.is_none() {
                v["ranks"] = Value::Object(ranks);
            }
            v.to_string()
        })
        .collect()
}

/// The ranks in one lane's `sealed` value: node ids with their ranks.
pub fn parse_rank_chunk(key: &[u8], value: &[u8]) -> Result<Vec<(String, u32)>> {
    rank_map(
        key,
        parse_object(key, value)?.get_mut("ranks").map(Value::take),
    )
}

fn rank_map(key: &[u8], ranks: Option<Value>) -> Result<Vec<(String, u32)>> {
    let Some(Value::Object(map)) = ranks else {
        return Err(corrupt(key, "ranks is missing or not an object"));
    };
    // Moved out, not cloned: a follower parses its lane's seal on the round's critical path.
    map.into_iter()
        .map(|(node, rank)| Ok((node, u32_field(key, &rank, "a rank")?)))
        .collect()
}

/// The member list in rank order: the one `sealed` carries, else from a read of the round's
/// `lane/` keys (the keys other than the lanes' `sealed` are skipped); a state error unless
/// the lanes hold each rank in 0..world_size exactly once.
pub fn members_from_chunks<'a>(
    sealed: &FinalRecord,
    lanes: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<std::sync::Arc<[String]>> {
    if let Some(members) = &sealed.members {
        return Ok(members.clone());
    }
    let mut members: Vec<Option<String>> = vec![None; sealed.world_size as usize];
    let mut seen = 0usize;
    let lanes = lanes
        .into_iter()
        .filter(|(key, _)| crate::backend::keys::Keys::is_lane_sealed(key));
    for (key, value) in lanes {
        for (node, rank) in parse_rank_chunk(key, value)? {
            let slot = members.get_mut(rank as usize).ok_or_else(|| {
                corrupt(
                    key,
                    &format!("rank {rank} of a round of {}", sealed.world_size),
                )
            })?;
            if slot.replace(node).is_some() {
                return Err(corrupt(key, &format!("rank {rank} given twice")));
            }
            seen += 1;
        }
    }
    if seen != members.len() {
        return Err(Error::state(format!(
            "round {}: its lanes hold {seen} of its {} members (rotated out, or foreign data)",
            sealed.round, sealed.world_size
        )));
    }
    Ok(members.into_iter().map(Option::unwrap_or_default).collect())
}

impl JoinRecord {
    pub fn to_json(&self) -> String {
        let mut v = json!({ "addr": self.addr, "port": self.port });
        if let Some((round, rank)) = self.last {
            v["last_round"] = json!(round);
            v["last_rank"] = json!(rank);
        }
        if let Some(probe) = self.probe {
            v["probe"] = json!(probe);
        }
        v.to_string()
    }

    pub fn parse(key: &[u8], value: &[u8]) -> Result<JoinRecord> {
        let v = parse_object(key, value)?;
        let last = match (v.get("last_round"), v.get("last_rank")) {
            (Some(round), Some(rank)) => Some((
                round
                    .as_u64()
                    .ok_or_else(|| corrupt(key, "last_round is not a number"))?,
                u32_field(key, rank, "last_rank")?,
            )),
            _ => None,
        };
        let probe = match v.get("probe") {
            None => None,
            Some(p) => Some(
                p.as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|&p| p > 0)
                    .ok_or_else(|| corrupt(key, "probe is not a port"))?,
            ),
        };
        Ok(JoinRecord {
            addr: str_field(key, &v, "addr")?,
            port: port_field(key, &v)?,
            last,
            probe,
        })
    }
}

impl FinalRecord {
    /// The value of `seal/final` (a lane's `sealed` adds its lane and ranks: `lane_values`).
    pub fn to_json(&self) -> String {
        self.to_value().to_string()
    }

    fn to_value(&self) -> Value {
        let mut v = json!({
            "round": self.round,
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "chunks": self.chunks,
        });
        if let Some(members) = &self.members {
            v["members"] = json!(members[..]);
        }
        v
    }

    pub fn parse(key: &[u8], value: &[u8]) -> Result<FinalRecord> {
        let mut v = parse_object(key, value)?;
        let round = v
            .get("round")
            .and_then(Value::as_u64)
            .ok_or_else(|| corrupt(key, "round is missing or not a number"))?;
        let positive = |name: &str| match v.get(name) {
            Some(n) => u32_field(key, n, name).and_then(|n| match n {
                0 => Err(corrupt(key, &format!("{name} is 0"))),
                n => Ok(n),
            }),
            None => Err(corrupt(key, &format!("{name} is missing"))),
        };
        let port = v.get("master_port").cloned().unwrap_or(Value::Null);
        let world_size = positive("world_size")?;
        let chunks = positive("chunks")?;
        let members = match v.get("members") {
            None => None,
            Some(list) => Some(inline_list(key, list, world_size, chunks)?),
        };
        let lane = match v.get("lane") {
            None => None,
            Some(lane) => {
                let lane = u32_field(key, lane, "lane")?;
                if lane >= chunks {
                    return Err(corrupt(key, &format!("lane {lane} of {chunks}")));
                }
                let ranks = match &members {
                    Some(_) => Vec::new(),
                    None => rank_map(key, v.get_mut("ranks").map(Value::take))?,
                };
                Some((lane, ranks.into()))
            }
        };
        Ok(FinalRecord {
            round,
            world_size,
            chunks,
            members,
            lane,
            master_addr: str_field(key, &v, "master_addr")?,
            master_port: port
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| corrupt(key, "master_port is missing or out of range"))?,
        })
    }

    /// The chunk that holds `node`'s rank in this round.
    pub fn chunk_of(&self, node: &str) -> u32 {
        chunk_of(node, self.chunks)
    }

    /// `node`'s rank from what this record carries (the whole list, or the ranks of `node`'s
    /// lane): `None` if it carries neither (read the node's lane), `Some(None)` if the node is
    /// not in the round.
    pub fn inline_rank(&self, node: &str) -> Option<Option<u32>> {
        if let Some(members) = &self.members {
            return Some(members.iter().position(|m| m == node).map(|r| r as u32));
        }
        // A lane answers only for the ids that hash to it.
        let (_, ranks) = self
            .lane
            .as_ref()
            .filter(|(lane, _)| *lane == self.chunk_of(node))?;
        Some(ranks.iter().find(|(m, _)| m == node).map(|(_, r)| *r))
    }
}

/// A `members` list in `final`: world_size distinct node ids, in a round of one chunk.
fn inline_list(
    key: &[u8],
    list: &Value,
    world_size: u32,
    chunks: u32,
) -> Result<std::sync::Arc<[String]>> {
    let ids = list
        .as_array()
        .ok_or_else(|| corrupt(key, "members is not a list"))?
        .iter()
        .map(|id| id.as_str().map(str::to_string))
        .collect::<Option<Vec<String>>>()
        .ok_or_else(|| corrupt(key, "members holds something other than node ids"))?;
    if chunks != 1 || ids.len() != world_size as usize {
        return Err(corrupt(
            key,
            &format!(
                "members lists {} nodes in a round of {world_size} in {chunks} chunks",
                ids.len()
            ),
        ));
    }
    let distinct: std::collections::HashSet<&String> = ids.iter().collect();
    if distinct.len() != ids.len() {
        return Err(corrupt(key, "members lists a node twice"));
    }
    Ok(ids.into())
}

fn corrupt(key: &[u8], what: &str) -> Error {
    Error::state(format!(
        "corrupt or foreign data at etcd key {:?}: {what}",
        String::from_utf8_lossy(key)
    ))
}

fn parse_object(key: &[u8], value: &[u8]) -> Result<Value> {
    let v: Value =
        serde_json::from_slice(value).map_err(|e| corrupt(key, &format!("not JSON ({e})")))?;
    if !v.is_object() {
        return Err(corrupt(key, "not a JSON object"));
    }
    Ok(v)
}

fn str_field(key: &[u8], v: &Value, name: &str) -> Result<String> {
    v.get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| corrupt(key, &format!("{name} is missing or not a string")))
}

fn u32_field(key: &[u8], v: &Value, name: &str) -> Result<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| corrupt(key, &format!("{name} is not a 32-bit number")))
}

fn port_field(key: &[u8], v: &Value) -> Result<u16> {
    v.get("port")
        .and_then(Value::as_u64)
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| corrupt(key, "port is missing or out of range"))
}

/// Parses the lane count stored at `seal/lanes` (1 to `MAX_CHUNKS`).
pub(crate) fn parse_lanes(kv: &etcd_client::KeyValue) -> Result<u32> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| (1..=MAX_CHUNKS as u32).contains(&n))
        .ok_or_else(|| corrupt(kv.key(), "not a lane count"))
}

/// Parses the decimal round number stored at `current`.
/// The id in the run's `lease` key.
pub fn parse_lease_id(key: &[u8], value: &[u8]) -> Result<i64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&id: &i64| id != 0)
        .ok_or_else(|| corrupt(key, "not a lease id"))
}

pub fn parse_round(key: &[u8], value: &[u8]) -> Result<u64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt(key, "not a round number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let j = JoinRecord {
            addr: "h1".into(),
            port: 29500,
            last: Some((3, 1)),
            probe: Some(40123),
        };
        assert_eq!(JoinRecord::parse(b"k", j.to_json().as_bytes()).unwrap(), j);
        let without = JoinRecord { probe: None, ..j };
        assert_eq!(
            JoinRecord::parse(b"k", without.to_json().as_bytes()).unwrap(),
            without
        );
        let bad = br#"{"addr":"h1","port":29500,"probe":70000}"#;
        assert!(JoinRecord::parse(b"k", bad).is_err());
        let f = FinalRecord {
            round: 4,
            world_size: 3,
            master_addr: "h".into(),
            master_port: 1,
            chunks: 2,
            members: None,
            lane: None,
        };
        assert_eq!(FinalRecord::parse(b"k", f.to_json().as_bytes()).unwrap(), f);
        let small = FinalRecord {
            chunks: 1,
            members: inline_members(&["b".into(), "a".into(), "c".into()], 1),
            ..f
        };
        let parsed = FinalRecord::parse(b"k", small.to_json().as_bytes()).unwrap();
        assert_eq!(parsed, small);
        assert_eq!(parsed.inline_rank("a"), Some(Some(1)));
        assert_eq!(parsed.inline_rank("z"), Some(None));
    }

    #[test]
    fn only_a_round_of_one_chunk_carries_its_members_in_final() {
        let ids = |n: usize| (0..n).map(|i| format!("{i:016x}")).collect::<Vec<_>>();
        assert_eq!(inline_members(&ids(64), 1).unwrap().len(), 64);
        assert!(inline_members(&ids(64), 2).is_none());
        let base = r#""round":1,"master_addr":"h","master_port":1"#;
        for bad in [
            r#""world_size":2,"chunks":1,"members":["a"]"#,
            r#""world_size":2,"chunks":1,"members":["a","a"]"#,
            r#""world_size":2,"chunks":2,"members":["a","b"]"#,
            r#""world_size":2,"chunks":1,"members":["a",2]"#,
            r#""world_size":2,"chunks":1,"members":{"a":0}"#,
        ] {
            let value = format!("{{{base},{bad}}}");
            let err = FinalRecord::parse(b"r/1/final", value.as_bytes()).unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::State, "{bad}");
        }
    }

    #[test]
    fn the_member_list_survives_its_lanes_and_each_node_finds_its_own_rank_in_its_lane() {
        // Rounds of every size up to max_nodes, including far smaller ones.
        for (n, max) in [
            (1usize, 1usize),
            (2, 64),
            (64, 64),
            (65, 65),
            (3, 1024),
            (1000, 1024),
            (7000, 7000),
        ] {
            let members: Vec<String> = (0..n).map(|i| format!("{i:016x}")).collect();
            let chunks = chunk_count(max);
            assert!(chunks as usize <= MAX_CHUNKS);
            let sealed = FinalRecord {
                round: 1,
                world_size: n as u32,
                master_addr: "h".into(),
                master_port: 1,
                chunks,
                members: inline_members(&members, chunks),
                lane: None,
            };
            let values = lane_values(&sealed, &members);
            assert_eq!(values.len(), chunks as usize);
            if chunks > 1 {
                let kvs = values
                    .iter()
                    .map(|v| (&b"r/1/lane/0000/sealed"[..], v.as_bytes()));
                assert_eq!(
                    &members_from_chunks(&sealed, kvs).unwrap()[..],
                    &members[..]
                );
            }
            // Every node finds its rank in the lane its id names, and no lane is far above
            // the target size while there are lanes to spare.
            for (rank, node) in members.iter().enumerate() {
                let mine = &values[sealed.chunk_of(node) as usize];
                let lane = FinalRecord::parse(b"k", mine.as_bytes()).unwrap();
                assert_eq!(lane.inline_rank(node), Some(Some(rank as u32)), "n={n}");
                assert_eq!((lane.world_size, lane.round), (n as u32, 1));
            }
            // A node that is not in the round learns so from its lane alone.
            let outsider = "not-a-member";
            let theirs = &values[sealed.chunk_of(outsider) as usize];
            let lane = FinalRecord::parse(b"k", theirs.as_bytes()).unwrap();
            assert_eq!(lane.inline_rank(outsider), Some(None));
            // Another lane's record answers nothing about a node.
            if chunks > 1 {
                let other = (sealed.chunk_of(outsider) + 1) % chunks;
                let lane = FinalRecord::parse(b"k", values[other as usize].as_bytes()).unwrap();
                assert_eq!(lane.inline_rank(outsider), None);
            }
            if n <= MAX_CHUNKS * CHUNK_TARGET && n == max {
                let largest = values
                    .iter()
                    .map(|v| parse_rank_chunk(b"k", v.as_bytes()).map_or(0, |r| r.len()))
                    .max()
                    .unwrap();
                assert!(largest <= 2 * CHUNK_TARGET, "n={n}: a lane of {largest}");
            }
        }
    }

    #[test]
    fn chunks_that_do_not_add_up_are_a_state_error() {
        let sealed = FinalRecord {
            round: 1,
            world_size: 2,
            master_addr: "h".into(),
            master_port: 1,
            chunks: 2,
            members: None,
            lane: None,
        };
        let key = &b"r/1/lane/0000/sealed"[..];
        for bad in [
            r#"{"ranks":{"a":0}}"#,
            r#"{"ranks":{"a":0,"b":2}}"#,
            r#"{"ranks":{"a":"x","b":1}}"#,
            r#"{"ranks":[]}"#,
            r#"{"a":0,"b":1}"#,
            "[]",
        ] {
            let err = members_from_chunks(&sealed, [(key, bad.as_bytes())]).unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::State, "{bad}");
        }
        let twice = [
            (key, &br#"{"ranks":{"a":0}}"#[..]),
            (
                &b"r/1/lane/0001/sealed"[..],
                &br#"{"ranks":{"b":0,"c":1}}"#[..],
            ),
        ];
        assert!(members_from_chunks(&sealed, twice).is_err());
        // The lanes' other keys are not ranks.
        let with_others = [
            (key, &br#"{"ranks":{"a":0}}"#[..]),
            (&b"r/1/lane/0000/closed"[..], &b"1"[..]),
            (&b"r/1/lane/0001/drain/sealed"[..], &b"preempted"[..]),
            (&b"r/1/lane/0001/sealed"[..], &br#"{"ranks":{"b":1}}"#[..]),
        ];
        assert_eq!(
            &members_from_chunks(&sealed, with_others).unwrap()[..],
            ["a", "b"]
        );
    }

    #[test]
    fn foreign_data_is_a_state_error() {
        for bad in [
            &b"garbage"[..],
            b"[1,2]",
            b"{\"round\":1}",
            b"{\"round\":1,\"world_size\":0,\"chunks\":1,\"master_addr\":\"h\",\"master_port\":1}",
            // A lane beyond the lane count, and a lane without its ranks.
            br#"{"round":1,"world_size":1,"chunks":2,"master_addr":"h","master_port":1,"lane":2,"ranks":{}}"#,
            br#"{"round":1,"world_size":1,"chunks":2,"master_addr":"h","master_port":1,"lane":0}"#,
        ] {
            let err = FinalRecord::parse(b"/rdzv/x/r/1/final", bad).unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::State, "{bad:?}");
            assert!(err.message().contains("/rdzv/x/r/1/final"));
        }
        assert!(parse_round(b"current", b"12").is_ok());
        assert!(parse_round(b"current", b"-1").is_err());
    }
}
