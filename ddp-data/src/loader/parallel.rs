//! The consumer's side of the worker pipeline: results arrive on a channel in
//! any order and are handed out in sequence, waiting at most a deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::worker::Finished;
use crate::DataError;

/// Bookkeeping of the worker pipeline of one iteration.
pub(super) struct Parallel<O> {
    pub(super) tx: mpsc::Sender<Finished<O>>,
    rx: mpsc::Receiver<Finished<O>>,
    /// Results that arrived before their turn.
    early: HashMap<usize, Result<O, DataError>>,
    /// Sequence number of the next batch to queue on the pool.
    pub(super) next_submit: usize,
    /// Set when the iteration ends early: queued jobs then skip their work.
    pub(super) cancelled: Arc<AtomicBool>,
}

/// What waiting for one batch gave.
pub(super) enum Received<O> {
    /// The batch, or the error its worker reported.
    Batch(Result<O, DataError>),
    /// The channel closed: the pool is gone.
    Disconnected,
    /// The timeout passed first; the batch's worker may still be running.
    TimedOut,
}

impl<O> Parallel<O> {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            tx,
            rx,
            early: HashMap::new(),
            next_submit: 0,
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Waits for the result of batch `seq`, for at most `timeout` in all
    /// (results of other batches arriving meanwhile do not restart the clock).
    pub(super) fn wait_for(&mut self, seq: usize, timeout: Option<Duration>) -> Received<O> {
        // A timeout too large for an `Instant` is no limit at all.
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            if let Some(result) = self.early.remove(&seq) {
                return Received::Batch(result);
            }
            let received = match deadline {
                None => self
                    .rx
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(deadline) => self
                    .rx
                    .recv_timeout(deadline.saturating_duration_since(Instant::now())),
            };
            match received {
                Ok((done, result)) => {
                    self.early.insert(done, result);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => return Received::TimedOut,
                // Every queued job sends exactly one result (see `Reply`), and
                // we hold a sender, so this only happens if the pool is gone.
                Err(mpsc::RecvTimeoutError::Disconnected) => return Received::Disconnected,
            }
        }
    }

    /// Tells queued jobs to skip their work. Never waits for running ones: a
    /// worker stuck in the dataset cannot be stopped, and waiting for it
    /// would turn a timeout back into a hang.
    pub(super) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}
