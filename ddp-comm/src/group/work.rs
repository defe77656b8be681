//! [`Work`]: the handle of an asynchronous collective.

use crate::error::{CommError, Result};
use std::sync::mpsc::{Receiver, TryRecvError};

/// A collective running on the group's communication thread.
///
/// Collectives run in the order they were issued. The buffer given to an `*_async` call comes
/// back from [`Work::wait`] holding the result. Dropping a `Work` does not cancel the
/// collective: it still runs (every rank must take part) and its result is discarded.
#[derive(Debug)]
#[must_use = "a collective's result is only known after `wait`"]
pub struct Work<T> {
    rx: Option<Receiver<Result<T>>>,
    done: Option<Result<T>>,
}

impl<T> Work<T> {
    pub(crate) fn pending(rx: Receiver<Result<T>>) -> Self {
        Work {
            rx: Some(rx),
            done: None,
        }
    }

    pub(crate) fn failed(e: CommError) -> Self {
        Work {
            rx: None,
            done: Some(Err(e)),
        }
    }

    /// Blocks until the collective has finished and returns its output.
    ///
    /// # Errors
    /// The collective's error; [`CommError::Destroyed`] if the group went away first.
    pub fn wait(mut self) -> Result<T> {
        if let Some(r) = self.done.take() {
            return r;
        }
        match self.rx.take() {
            Some(rx) => rx.recv().unwrap_or(Err(CommError::Destroyed)),
            None => Err(CommError::Destroyed),
        }
    }

    /// Whether the collective has finished (successfully or not); never blocks.
    pub fn is_completed(&mut self) -> bool {
        if self.done.is_some() {
            return true;
        }
        let Some(rx) = &self.rx else { return true };
        match rx.try_recv() {
            Ok(r) => {
                self.done = Some(r);
                true
            }
            Err(TryRecvError::Empty) => false,
            Err(TryRecvError::Disconnected) => {
                self.done = Some(Err(CommError::Destroyed));
                true
            }
        }
    }
}
