//! The store traffic of a torch job's agents in one round, as torchelastic's agent makes it
//! through the rendezvous store: rank 0 publishes MASTER_ADDR and MASTER_PORT, every rank
//! publishes its role info and counts its restarts, and reads back what it needs; rank 0
//! gathers every rank's info (`_share_and_gather`) and releases the others. At the end of the
//! job, the exit barrier: every rank says it is done and waits for all. Shared by the bench's
//! `--history` and the soak.
//!
//! The count is one counter per rank: a counter shared by a whole round of 1024 would time
//! the optimistic `add`'s contention (every loser retries, DESIGN's known limits), not what
//! the traffic leaves in etcd's history, which is one revision per `add` either way.

use rdzv::{Result, Store};

/// The most keys one `multi_get` reads: each is one operation of a transaction, and etcd
/// takes at most 128 per transaction by default.
const GATHER_CHUNK: usize = 100;

/// One round's bootstrap for `rank` of `world`.
pub async fn bootstrap(store: &Store, rank: u32, world: u32) -> Result<()> {
    if rank == 0 {
        store.set("MASTER_ADDR", b"10.0.0.1").await?;
        store.set("MASTER_PORT", b"29500").await?;
    }
    let info = format!("{{\"role\":\"default\",\"rank\":{rank},\"local_world_size\":8}}");
    store
        .set(&format!("role_info/{rank}"), info.as_bytes())
        .await?;
    store.add(&format!("restarts/{rank}"), 1).await?;
    store.get("MASTER_ADDR", None).await?;
    store.get("MASTER_PORT", None).await?;
    if rank == 0 {
        let keys: Vec<String> = (0..world).map(|r| format!("role_info/{r}")).collect();
        for chunk in keys.chunks(GATHER_CHUNK) {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            store.multi_get(&chunk, None).await?;
        }
        store.set("role_info/gathered", b"1").await?;
    } else {
        store.get("role_info/gathered", None).await?;
    }
    Ok(())
}

/// The exit barrier: every rank marks itself done; rank 0 waits for all and releases them.
pub async fn exit_barrier(store: &Store, rank: u32, world: u32) -> Result<()> {
    store.set(&format!("exit/{rank}"), b"1").await?;
    if rank == 0 {
        let keys: Vec<String> = (0..world).map(|r| format!("exit/{r}")).collect();
        for chunk in keys.chunks(GATHER_CHUNK) {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            store.wait(&chunk, None).await?;
        }
        store.set("exit/all", b"1").await?;
    } else {
        store.get("exit/all", None).await?;
    }
    Ok(())
}
