//! The work under way that changes the node: Allocates and reclaim rounds,
//! including their halves on blocking threads, which aborting a task does
//! not stop. Each holds a [`Pass`] for as long as it may touch a link or the
//! record; an exit that cleans the node first closes the gate
//! ([`InFlight::close`]), which waits for every pass to be given back and
//! refuses new ones, so nothing is made after the clean-up listed the
//! node's links and nothing writes the record after it was removed.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// The gate every node-changing piece of work passes; cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<RwLock<bool>>);

/// Held by one piece of work under way; dropping it gives it back. It can
/// move to a blocking thread with the work.
#[derive(Debug)]
pub struct Pass {
    _guard: OwnedRwLockReadGuard<bool>,
}

/// What [`InFlight::close`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Everything under way had finished; nothing new starts.
    Settled,
    /// The bound passed with work still under way.
    TimedOut,
}

impl InFlight {
    /// A pass for one piece of work, or `None` once the gate is closed (the
    /// daemon is exiting). Waits only while a close is waiting.
    pub async fn enter(&self) -> Option<Pass> {
        let guard = self.0.clone().read_owned().await;
        (!*guard).then_some(Pass { _guard: guard })
    }

    /// Closes the gate: waits up to `bound` for every pass given out to come
    /// back, then refuses new ones.
    pub async fn close(&self, bound: Duration) -> Closed {
        match tokio::time::timeout(bound, self.0.clone().write_owned()).await {
            Ok(mut closed) => {
                *closed = true;
                Closed::Settled
            }
            Err(_) => Closed::TimedOut,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_close_waits_for_work_on_a_blocking_thread_then_refuses_more() {
        let gate = InFlight::default();
        let pass = gate.enter().await.expect("open");
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let work = tokio::task::spawn_blocking(move || {
            let _pass = pass;
            started_tx.send(()).unwrap();
            finish_rx.recv().unwrap();
        });
        started_rx.recv().unwrap();
        let closing = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.close(Duration::from_secs(600)).await })
        };
        // The work still holds its pass: the close cannot have finished.
        tokio::task::yield_now().await;
        assert!(!closing.is_finished(), "closed with work under way");
        finish_tx.send(()).unwrap();
        work.await.unwrap();
        assert_eq!(closing.await.unwrap(), Closed::Settled);
        assert!(gate.enter().await.is_none(), "a pass after the close");
    }

    #[tokio::test]
    async fn a_close_is_bounded() {
        let gate = InFlight::default();
        let _stuck = gate.enter().await.expect("open");
        assert_eq!(
            gate.close(Duration::from_millis(10)).await,
            Closed::TimedOut
        );
    }
}
