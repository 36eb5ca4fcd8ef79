//! The signals the launcher handles (torchrun's `--signals-to-handle`): received on the async
//! runtime, so every wait of the agent can give way to one, and forwarded to the workers.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The handled signals' streams.
pub struct Signals {
    streams: Vec<(i32, Signal)>,
}

impl Signals {
    /// Must be called inside the runtime, before anything that should be interruptible.
    pub fn install(which: &[i32]) -> std::io::Result<Signals> {
        let mut streams = Vec::new();
        for &sig in which {
            streams.push((sig, signal(SignalKind::from_raw(sig))?));
        }
        Ok(Signals { streams })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> i32 {
        let waits = self.streams.iter_mut().map(|(sig, s)| {
            let sig = *sig;
            Box::pin(async move {
                s.recv().await;
                sig
            })
        });
        first_of(waits).await
    }
}

/// The first of several futures to finish (a small `select_all`, to avoid a dependency).
async fn first_of<F: std::future::Future<Output = i32> + Unpin>(
    futures: impl IntoIterator<Item = F>,
) -> i32 {
    let mut futures: Vec<F> = futures.into_iter().collect();
    std::future::poll_fn(move |cx| {
        for f in futures.iter_mut() {
            if let std::task::Poll::Ready(v) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
