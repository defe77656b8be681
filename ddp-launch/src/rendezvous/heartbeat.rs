//! A claim's heartbeat: while a launcher holds its `--node-rank`, a small thread adds 1 to the
//! claimant's own counter every [`BEAT`], so a launcher started again for the same node can tell a
//! live holder from a dead one (see [`node_claim`](super::node_claim)).
//!
//! The thread shares the launcher's connection to the store (a clone of its [`Store`]): every
//! call the launcher makes on it returns at once, so a beat waits at most for one of them, and
//! node 0 keeps counting one connection per launcher (it serves the others while they are
//! connected).

use ddp_comm::Store;
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the holder of a claim moves its counter.
pub(crate) const BEAT: Duration = Duration::from_secs(1);

/// The thread beating for this launcher's claim; it stops (and is joined) when dropped.
pub(super) struct Heartbeat {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts beating on `key` at once, then every [`BEAT`].
    pub(super) fn start(store: Store, key: String) -> std::io::Result<Heartbeat> {
        let (stop, stopped) = channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ddp-heartbeat".to_string())
            .spawn(move || {
                loop {
                    if let Err(e) = store.add(&key, 1) {
                        tracing::debug!(%e, %key, "cannot move this launcher's heartbeat");
                    }
                    match stopped.recv_timeout(BEAT) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Heartbeat {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread; it ends after its current beat, if any.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::debug!("the heartbeat thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{connect, loopback_store, wait_until};

    /// The counter moves while the heartbeat runs, and stays still once it is dropped.
    #[test]
    fn the_counter_moves_until_the_heartbeat_is_dropped() {
        let (server, config) = loopback_store();
        let store = connect(&server, config);
        let beat = Heartbeat::start(store.clone(), "node/1/alive".to_string()).expect("start");
        wait_until(
            Duration::from_secs(120),
            "the heartbeat never moved twice",
            || store.add("node/1/alive", 0).expect("read") >= 2,
        );
        drop(beat);
        let stopped = store.add("node/1/alive", 0).expect("read");
        std::thread::sleep(BEAT + BEAT / 2);
        assert_eq!(store.add("node/1/alive", 0).expect("read"), stopped);
    }
}
