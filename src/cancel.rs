//! A cancel token: made by the caller, handed to the calls that wait (`next`, the store's
//! `get`/`wait`/`multi_get`, the admin watch), cancelled from any thread. Once cancelled it
//! stays cancelled, so a cancel is never lost to timing: a call made with a token that is
//! already cancelled returns `Cancelled` at once, and one that is waiting returns as soon as
//! the token is cancelled. This is the shape of a Go `context` (etcd's client takes one in
//! every call) and of wasmtime's engine interrupt. The handles' own `cancel` calls, which
//! reach only calls already running, stay for the callers that use them.

use std::sync::Arc;
use tokio::sync::watch;

/// Cheap to clone: clones are the same token. `cancel` needs no runtime and never blocks.
#[derive(Clone, Debug)]
pub struct CancelToken {
    cancelled: Arc<watch::Sender<bool>>,
}

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> CancelToken {
        CancelToken {
            cancelled: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Cancels the token, for good: every call waiting with it returns, and every later one
    /// returns at once. Idempotent.
    pub fn cancel(&self) {
        self.cancelled.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Completes once the token is cancelled (at once if it already is).
    pub async fn cancelled(&self) {
        let mut seen = self.cancelled.subscribe();
        // The sender lives as long as `self`, so this ends only by a cancel.
        let _ = seen.wait_for(|cancelled| *cancelled).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_cancel_made_before_the_wait_is_kept() {
        let token = CancelToken::new();
        assert!(!token.is_cancelled());
        token.clone().cancel();
        assert!(token.is_cancelled());
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .expect("an already cancelled token completes at once");
    }

    #[tokio::test]
    async fn a_cancel_from_another_thread_wakes_a_waiter() {
        let token = CancelToken::new();
        let waiter = tokio::spawn({
            let token = token.clone();
            async move { token.cancelled().await }
        });
        // A plain thread, outside any runtime, as a C caller's would be.
        std::thread::spawn(move || token.cancel()).join().unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter wakes")
            .unwrap();
    }

    #[tokio::test]
    async fn an_uncancelled_token_keeps_waiting() {
        let token = CancelToken::new();
        let waited = tokio::time::timeout(Duration::from_millis(50), token.cancelled()).await;
        assert!(waited.is_err());
    }
}
