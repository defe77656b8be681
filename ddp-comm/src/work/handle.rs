//! [`Work`]: the handle of an asynchronous collective.

use crate::error::{CommError, Result};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

/// When an asynchronous collective was queued, started and finished on the communication
/// thread; for traces and overlap measurements.
#[derive(Debug, Clone, Copy)]
pub struct WorkTiming {
    /// When the call was made.
    pub queued: Instant,
    /// When the communication thread started it.
    pub started: Instant,
    /// When it finished.
    pub finished: Instant,
}

type Outcome<T> = (Result<T>, WorkTiming);

/// A collective running on the group's communication thread.
///
/// Collectives run in the order they were issued. The buffer given to an `*_async` call comes
/// back from [`Work::wait`] holding the result. Dropping a `Work` does not cancel the
/// collective: it still runs (every rank must take part) and its result is discarded.
#[derive(Debug)]
#[must_use = "a collective's result is only known after `wait`"]
pub struct Work<T> {
    rx: Option<Receiver<Outcome<T>>>,
    done: Option<(Result<T>, Option<WorkTiming>)>,
}

impl<T> Work<T> {
    pub(crate) fn pending(rx: Receiver<Outcome<T>>) -> Self {
        Work {
            rx: Some(rx),
            done: None,
        }
    }

    pub(crate) fn failed(e: CommError) -> Self {
        Work {
            rx: None,
            done: Some((Err(e), None)),
        }
    }

    /// Blocks until the collective has finished and returns its output.
    ///
    /// # Errors
    /// The collective's error; [`CommError::Destroyed`] if the group went away first.
    pub fn wait(self) -> Result<T> {
        self.wait_timed().0
    }

    /// Like [`Work::wait`], also returning when the collective ran (`None` if it never ran).
    pub fn wait_timed(mut self) -> (Result<T>, Option<WorkTiming>) {
        if let Some(done) = self.done.take() {
            return done;
        }
        match self.rx.take().map(|rx| rx.recv()) {
            Some(Ok((r, t))) => (r, Some(t)),
            _ => (Err(CommError::Destroyed), None),
        }
    }

    /// Whether the collective has finished (successfully or not); never blocks.
    pub fn is_completed(&mut self) -> bool {
        if self.done.is_some() {
            return true;
        }
        let Some(rx) = &self.rx else { return true };
        match rx.try_recv() {
            Ok((r, t)) => {
                self.done = Some((r, Some(t)));
                true
            }
            Err(TryRecvError::Empty) => false,
            Err(TryRecvError::Disconnected) => {
                self.done = Some((Err(CommError::Destroyed), None));
                true
            }
        }
    }
}
