//! The flags that name a run as torchrun names it, declared once: `rdzv run` joins the run
//! they name, and the operator commands (`status`, `close`, `purge`, `drain`) take the same
//! flags instead of a URL, so an operator can copy them from the job's command line.

use crate::exit::{usage, Usage};
use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct RdzvFlags {
    /// etcd endpoints: HOST:PORT[,HOST:PORT...].
    #[arg(
        long,
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        value_name = "HOST:PORT"
    )]
    pub rdzv_endpoint: Option<String>,
    /// The job's id: every node of one job passes the same.
    #[arg(
        long,
        alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none",
        value_name = "ID"
    )]
    pub rdzv_id: String,
    /// Rendezvous options, KEY=VALUE,... (join_timeout, last_call_timeout, lease_ttl, ...: any
    /// option of an rdzv URL).
    #[arg(
        long,
        alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        hide_env_values = true,
        value_name = "K=V,...",
        value_parser = rdzv_conf
    )]
    pub rdzv_conf: Option<RdzvConf>,
}

/// `--rdzv-conf`: KEY=VALUE pairs in the order given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdzvConf(pub Vec<(String, String)>);

/// `key=value,key=value` (torchrun's --rdzv-conf).
pub fn rdzv_conf(s: &str) -> Result<RdzvConf, Usage> {
    s.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| usage(format!("--rdzv-conf: expected KEY=VALUE,..., got {item:?}")))
        })
        .collect::<Result<_, _>>()
        .map(RdzvConf)
}

impl RdzvFlags {
    /// The pairs of `--rdzv-conf`, none when it was not given.
    pub fn conf(&self) -> &[(String, String)] {
        self.rdzv_conf.as_ref().map_or(&[], |c| &c.0)
    }

    /// The run these flags name, as an rdzv URL (what the operator commands connect with).
    pub fn url(&self) -> Result<String, Usage> {
        let endpoint = self.rdzv_endpoint.as_deref().unwrap_or_default();
        if endpoint.is_empty() || endpoint.contains('/') || endpoint.contains('?') {
            return Err(usage(format!(
                "--rdzv-endpoint: expected HOST:PORT[,HOST:PORT...], got {endpoint:?}"
            )));
        }
        if self.rdzv_id.is_empty() || self.rdzv_id.contains(['/', '?', '&', '#']) {
            return Err(usage(format!(
                "--rdzv-id: expected a run id, got {:?}",
                self.rdzv_id
            )));
        }
        let query: Vec<String> = self
            .conf()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Ok(match query.is_empty() {
            true => format!("etcd://{endpoint}/{}", self.rdzv_id),
            false => format!("etcd://{endpoint}/{}?{}", self.rdzv_id, query.join("&")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf() {
        assert_eq!(
            rdzv_conf("join_timeout=5, lease_ttl=2").unwrap().0,
            vec![
                ("join_timeout".into(), "5".into()),
                ("lease_ttl".into(), "2".into())
            ]
        );
        assert!(rdzv_conf("oops").is_err());
    }

    #[test]
    fn flags_name_a_run_as_a_url() {
        let flags = |endpoint: Option<&str>, id: &str, conf: &str| RdzvFlags {
            rdzv_endpoint: endpoint.map(str::to_string),
            rdzv_id: id.into(),
            rdzv_conf: Some(rdzv_conf(conf).unwrap()),
        };
        assert_eq!(
            flags(Some("h:1,g:2"), "job", "").url().unwrap(),
            "etcd://h:1,g:2/job"
        );
        assert_eq!(
            flags(Some("h:1"), "job", "key_prefix=/x,lease_ttl=2")
                .url()
                .unwrap(),
            "etcd://h:1/job?key_prefix=/x&lease_ttl=2"
        );
        assert!(flags(None, "job", "")
            .url()
            .unwrap_err()
            .0
            .starts_with("--rdzv-endpoint"));
        assert!(flags(Some("h:1"), "a/b", "")
            .url()
            .unwrap_err()
            .0
            .starts_with("--rdzv-id"));
    }
}
