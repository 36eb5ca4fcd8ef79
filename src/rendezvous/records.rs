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
}

/// The value of `r/{round}/final`: member node ids in rank order, and rank 0's bootstrap
/// address. Written once, never changed. Kept compact (ids only) because every member receives
/// it by watch: at 1024 nodes it is about 20 KB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalRecord {
    pub round: u64,
    /// Shared, not copied, by the round's info, the node's state and its lost-member tracker.
    pub members: std::sync::Arc<[String]>,
    pub master_addr: String,
    pub master_port: u16,
}

impl JoinRecord {
    pub fn to_json(&self) -> String {
        let mut v = json!({ "addr": self.addr, "port": self.port });
        if let Some((round, rank)) = self.last {
            v["last_round"] = json!(round);
            v["last_rank"] = json!(rank);
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
        Ok(JoinRecord {
            addr: str_field(key, &v, "addr")?,
            port: port_field(key, &v)?,
            last,
        })
    }
}

impl FinalRecord {
    pub fn to_json(&self) -> String {
        json!({
            "round": self.round,
            "members": &*self.members,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
        })
        .to_string()
    }

    pub fn parse(key: &[u8], value: &[u8]) -> Result<FinalRecord> {
        let mut v = parse_object(key, value)?;
        let round = v
            .get("round")
            .and_then(Value::as_u64)
            .ok_or_else(|| corrupt(key, "round is missing or not a number"))?;
        // Moved out of the parsed value, not copied: every member parses this list, whose
        // length is the round's size.
        let Some(Value::Array(items)) = v.get_mut("members").map(Value::take) else {
            return Err(corrupt(key, "members is missing or not a list"));
        };
        let members = items
            .into_iter()
            .map(|m| match m {
                Value::String(id) => Some(id),
                _ => None,
            })
            .collect::<Option<std::sync::Arc<[String]>>>()
            .ok_or_else(|| corrupt(key, "members holds something other than node ids"))?;
        if members.is_empty() {
            return Err(corrupt(key, "a sealed round has no members"));
        }
        let port = v.get("master_port").cloned().unwrap_or(Value::Null);
        Ok(FinalRecord {
            round,
            members,
            master_addr: str_field(key, &v, "master_addr")?,
            master_port: port
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| corrupt(key, "master_port is missing or out of range"))?,
        })
    }

    pub fn rank_of(&self, node: &str) -> Option<u32> {
        self.members
            .iter()
            .position(|m| m == node)
            .map(|i| i as u32)
    }
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

/// Parses the decimal round number stored at `current`.
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
        };
        assert_eq!(JoinRecord::parse(b"k", j.to_json().as_bytes()).unwrap(), j);
        let f = FinalRecord {
            round: 4,
            members: vec!["a".into()].into(),
            master_addr: "h".into(),
            master_port: 1,
        };
        assert_eq!(FinalRecord::parse(b"k", f.to_json().as_bytes()).unwrap(), f);
        assert_eq!(f.rank_of("a"), Some(0));
        assert_eq!(f.rank_of("b"), None);
    }

    #[test]
    fn foreign_data_is_a_state_error() {
        for bad in [
            &b"garbage"[..],
            b"[1,2]",
            b"{\"round\":1}",
            b"{\"round\":1,\"members\":[]}",
        ] {
            let err = FinalRecord::parse(b"/rdzv/x/r/1/final", bad).unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::State, "{bad:?}");
            assert!(err.message().contains("/rdzv/x/r/1/final"));
        }
        assert!(parse_round(b"current", b"12").is_ok());
        assert!(parse_round(b"current", b"-1").is_err());
    }
}
