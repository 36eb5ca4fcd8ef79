//! Cancels. A `CancelToken` is made by the caller, handed to any blocking call that talks to
//! etcd (`BlockingRendezvous::next_with`, the blocking store's `get_with`, `set_with`, ...; the
//! C ABI's `_with_cancel` calls) and cancelled from any thread. An async caller needs none: it
//! drops the call's future, or uses the handle's own cancel below. Once cancelled it stays cancelled, so a cancel is never lost to timing: a call
//! made with a token that is already cancelled returns `Cancelled` at once, and one that is
//! running returns as soon as the token is cancelled. This is the shape of a Go `context`
//! (etcd's client takes one in every call).
//!
//! A handle's own `cancel` (`Rendezvous::cancel`, `Store::cancel`, the admin's) is built on
//! tokens too (`HandleCancel`): it ends the calls of that handle in progress or, if none is,
//! the next one to start, as wasmtime's engine interrupt stays set until code runs into it.
//! Unlike a token it does not stay cancelled for good, since the handle must stay usable: the
//! cancel is used up once a call has ended with `Cancelled` because of it.

use crate::error::{Error, ErrorKind, Result};
use std::future::Future;
use std::sync::{Arc, Mutex};
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

    /// Runs `call` unless or until the token is cancelled: `Cancelled` at once, without
    /// starting it, if the token already is; else whichever comes first, `call`'s result (which
    /// wins a tie) or the cancel. A call abandoned this way is dropped where it stands, so it
    /// must be one that may be: a read leaves nothing behind, a write may or may not have been
    /// applied (as when it times out).
    pub(crate) async fn run<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if self.is_cancelled() {
            return Err(cancelled_by_token(what));
        }
        tokio::select! {
            biased;
            result = call => result,
            _ = self.cancelled() => Err(cancelled_by_token(what)),
        }
    }
}

/// The error of a call ended by its cancel token.
pub(crate) fn cancelled_by_token(what: &str) -> Error {
    Error::new(
        ErrorKind::Cancelled,
        format!("{what}: cancelled by its cancel token"),
    )
}

/// A handle's own cancel: what `Rendezvous::cancel`, `Store::cancel` and the admin handle's
/// `cancel` reach. Every call it covers holds the handle's current token while it runs
/// (`enter`); `cancel` cancels that token, making one if no call holds it, so the cancel ends
/// the calls in progress and, if none is, the next one to start. The token is replaced by a
/// fresh one once a call has ended with `Cancelled` while holding it and no call holds it any
/// more: a cancel is used up by ending a call, never lost to timing (a call that returned its
/// result while the cancel came leaves it for the next call), and the handle stays usable.
///
/// That is wasmtime's engine interrupt (it stays set, and code entered after it traps at once)
/// with a Go context's rule that a cancel is final for the calls it reached, re-armed for the
/// handle once it has taken effect.
#[derive(Default)]
pub(crate) struct HandleCancel {
    state: Mutex<HandleState>,
}

#[derive(Default)]
struct HandleState {
    /// The token the calls in progress hold, and the next call will.
    token: Option<CancelToken>,
    /// Calls holding `token`.
    calls: usize,
    /// A call ended with `Cancelled` while `token` was cancelled: the cancel took effect.
    used: bool,
}

impl HandleCancel {
    fn state(&self) -> std::sync::MutexGuard<'_, HandleState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the calls in progress or, with none in progress, the next one to start. Never
    /// blocks for long and needs no runtime; not for signal handlers (it takes a lock).
    pub(crate) fn cancel(&self) {
        self.state()
            .token
            .get_or_insert_with(CancelToken::new)
            .cancel();
    }

    /// A call that starts now: it holds the handle's token until the returned value is dropped.
    pub(crate) fn enter(&self) -> HandleCall<'_> {
        let mut state = self.state();
        state.calls += 1;
        let token = state.token.get_or_insert_with(CancelToken::new).clone();
        HandleCall { owner: self, token }
    }
}

/// One call's hold on its handle's token (see `HandleCancel`).
pub(crate) struct HandleCall<'a> {
    owner: &'a HandleCancel,
    token: CancelToken,
}

impl HandleCall<'_> {
    pub(crate) fn token(&self) -> &CancelToken {
        &self.token
    }

    /// Records how the call ended: `Cancelled` while the handle's token is cancelled uses the
    /// cancel up. Any other outcome leaves it for the next call.
    pub(crate) fn ended<T>(&self, result: &Result<T>) {
        if matches!(result, Err(e) if e.kind() == ErrorKind::Cancelled) && self.token.is_cancelled()
        {
            self.owner.state().used = true;
        }
    }
}

impl Drop for HandleCall<'_> {
    fn drop(&mut self) {
        let mut state = self.owner.state();
        state.calls -= 1;
        if state.calls == 0 && state.used {
            state.token = None;
            state.used = false;
        }
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

    fn cancelled() -> Result<()> {
        Err(Error::new(ErrorKind::Cancelled, "cancelled"))
    }

    #[test]
    fn a_handle_cancel_made_before_any_call_ends_the_next_call_then_is_used_up() {
        let handle = HandleCancel::default();
        handle.cancel();
        {
            let call = handle.enter();
            assert!(
                call.token().is_cancelled(),
                "the pending cancel reaches the call"
            );
            call.ended(&cancelled());
        }
        let call = handle.enter();
        assert!(
            !call.token().is_cancelled(),
            "used up: the call after runs normally"
        );
    }

    #[test]
    fn a_handle_cancel_reaches_calls_in_progress_and_those_that_start_before_they_return() {
        let handle = HandleCancel::default();
        let first = handle.enter();
        handle.cancel();
        assert!(first.token().is_cancelled());
        first.ended(&cancelled());
        let second = handle.enter();
        assert!(
            second.token().is_cancelled(),
            "started while the first still held it"
        );
        drop(first);
        second.ended(&cancelled());
        drop(second);
        assert!(!handle.enter().token().is_cancelled());
    }

    #[test]
    fn a_handle_cancel_that_ended_no_call_stays_for_the_next() {
        let handle = HandleCancel::default();
        {
            let call = handle.enter();
            handle.cancel();
            // The call returned its result just as the cancel came.
            call.ended(&Ok(()));
        }
        {
            let dropped = handle.enter(); // a future dropped unpolled: no outcome
            assert!(dropped.token().is_cancelled());
        }
        let call = handle.enter();
        assert!(call.token().is_cancelled(), "the cancel was lost");
    }

    #[test]
    fn a_call_cancelled_by_its_own_token_leaves_the_handle_alone() {
        let handle = HandleCancel::default();
        {
            let call = handle.enter();
            call.ended(&cancelled()); // by a token of the caller's
        }
        assert!(!handle.enter().token().is_cancelled());
    }

    #[tokio::test]
    async fn run_ends_a_call_on_its_token_and_lets_a_finished_call_win() {
        let token = CancelToken::new();
        let result = token.run("probe", async { Ok(1) }).await;
        assert_eq!(result.unwrap(), 1);
        let pending = {
            let token = token.clone();
            tokio::spawn(async move {
                token
                    .run("probe", std::future::pending::<Result<()>>())
                    .await
            })
        };
        token.cancel();
        let err = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .expect("the call ends on its token")
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert!(
            err.to_string()
                .contains("probe: cancelled by its cancel token"),
            "{err}"
        );
        // Already cancelled: the call is not even started.
        let started = std::sync::atomic::AtomicBool::new(false);
        let err = token
            .run("probe", async {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_uncancelled_token_keeps_waiting() {
        let token = CancelToken::new();
        let waited = tokio::time::timeout(Duration::from_millis(50), token.cancelled()).await;
        assert!(waited.is_err());
    }
}
