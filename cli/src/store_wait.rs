//! A wait on the round's store that stands for "until it happens": the launchers' protocols
//! (a failure verdict, a hang announcement) wait for a key another node may set at any time
//! in the round, or never.

use rdzv::{ErrorKind, Store};
use std::time::Duration;

/// Each store wait's bound; the wait is renewed when it ends by its timeout.
const LONG_WAIT: Duration = Duration::from_secs(3600);

/// The value of `key` once some node sets it. Any error but a timeout (the round's store gone
/// with the round, this node shut down) never resolves: whatever ends the round ends this too.
pub async fn until_set(store: &Store, key: &str) -> Vec<u8> {
    loop {
        match store.get(key, Some(LONG_WAIT)).await {
            Ok(value) => return value,
            Err(e) if e.kind() == ErrorKind::Timeout => continue,
            Err(_) => return std::future::pending().await,
        }
    }
}
