//! Every run on one etcd, for a scheduler's view of all its jobs (`rdzv exporter`): the runs
//! under an admin's key prefix, each read as `Admin::status` reads one, on one connection.

use super::Admin;
use crate::backend::keys::{unescape_run_id, Keys};
use crate::error::Result;
use etcd_client::{GetOptions, SortOrder, SortTarget};

impl Admin {
    /// The ids of the runs that have keys on this etcd under this admin's key prefix (its own
    /// run among them if it has any), in key order, at most `limit`. One keys-only read of
    /// one key per run: the read after a run starts past that run's keys.
    pub async fn runs(&self, limit: usize) -> Result<Vec<String>> {
        let root = format!("{}/", self.params.key_prefix().trim_end_matches('/'));
        let end = prefix_end(&root);
        let mut from = root.clone();
        let mut runs = Vec::new();
        while runs.len() < limit {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(1)
                .with_sort(SortTarget::Key, SortOrder::Ascend);
            let got = self
                .etcd
                .get(self.deadline(), "runs", from.clone(), options)
                .await?;
            let Some(kv) = got.kvs().first() else { break };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some(escaped) = key[root.len()..].split('/').next() else {
                break;
            };
            // Past every key of this run: its directory ends with '/', whose successor is '0'.
            from = format!("{root}{escaped}0");
            if let Some(run) = unescape_run_id(escaped) {
                runs.push(run);
            }
        }
        Ok(runs)
    }

    /// An admin of run `run_id` on the same etcd, connection and key prefix.
    pub fn for_run(&self, run_id: &str) -> Result<Admin> {
        let params = self.params.with_run_id(run_id)?;
        let keys = Keys::new(params.key_prefix(), run_id);
        Ok(Admin {
            params,
            etcd: self.etcd.clone(),
            keys,
        })
    }
}

/// The end of the range of every key that starts with `prefix` (ASCII here).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}
