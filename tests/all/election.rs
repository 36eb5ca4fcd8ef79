//! `rdzv::election` against a real etcd: one leader at a time, the next one wins when it
//! resigns, is evicted or its lease expires, and the record is written only by the current
//! leader on top of what it last saw.

use crate::common::Etcd;
use rdzv::election::Election;
use rdzv::{ErrorKind, Params};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

#[test]
fn one_leader_at_a_time_and_only_the_leader_writes_the_record() {
    let etcd = Etcd::start();
    let params = Params::from_url(&etcd.url("election", "lease_ttl=2")).unwrap();
    runtime().block_on(async {
        let a = Election::connect(&params, "svc").await.unwrap();
        let b = Election::connect(&params, "svc").await.unwrap();
        let first = a.campaign("addr-a").await.unwrap();
        assert_eq!(a.leader().await.unwrap().as_deref(), Some("addr-a"));
        assert!(first.is_current());
        // b waits while a leads.
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.campaign("addr-b").await }
        });
        let (record, rev) = first.record().await.unwrap();
        assert_eq!(record, None);
        let rev = first.store(b"1", rev, "a leads").await.unwrap();
        // A write on top of a record it did not see is refused, and ends its leadership.
        let refused = first.store(b"2", rev - 1, "stale").await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::LeaseLost);
        assert!(!waiting.is_finished(), "b won while a led");
        first.resign().await.unwrap();
        let second = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("b wins once a resigns")
            .unwrap()
            .unwrap();
        assert_eq!(b.leader().await.unwrap().as_deref(), Some("addr-b"));
        let (record, rev) = second.record().await.unwrap();
        assert_eq!(
            record.as_deref(),
            Some(&b"1"[..]),
            "the record outlives its leader"
        );
        // The old leader's writes are refused, whatever revision it names.
        assert!(first.store(b"9", rev, "old").await.is_err());
        let rev = second.store(b"2", rev, "b leads").await.unwrap();

        // Evicted (its lease revoked by a candidate that knows it is gone): a leads again at
        // once, and b can no longer write.
        let again = tokio::spawn({
            let a = a.clone();
            async move { a.campaign("addr-a2").await }
        });
        assert!(!a.evict("not-the-leader").await.unwrap());
        assert!(a.evict("addr-b").await.unwrap());
        let third = tokio::time::timeout(Duration::from_secs(10), again)
            .await
            .expect("a wins once b is evicted")
            .unwrap()
            .unwrap();
        assert!(second.store(b"3", rev, "evicted").await.is_err());
        let (record, rev) = third.record().await.unwrap();
        assert_eq!(record.as_deref(), Some(&b"2"[..]));
        third.store(b"3", rev, "a again").await.unwrap();
        // Its lost leadership shows to the evicted leader.
        let mut lost = second.lost();
        tokio::time::timeout(Duration::from_secs(5), lost.wait_for(|l| *l))
            .await
            .expect("the evicted leader learns it lost its lease")
            .unwrap();
    });
}
