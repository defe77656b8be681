//! The stand-in's memory and done events: [`StandInBuffer`], [`StandInWork`].

use crate::error::Result;
use crate::watchdog::{CompletionProbe, WatchedWork};
use crate::work::WorkTiming;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Host memory that a [`StandInComm`](super::StandInComm) collective reduces in place: the
/// stand-in's device buffer. Cheap to clone (clones share the memory).
#[derive(Debug, Clone, Default)]
pub struct StandInBuffer<T>(Arc<Mutex<Vec<T>>>);

impl<T: Clone> StandInBuffer<T> {
    /// A buffer holding `values`.
    pub fn new(values: Vec<T>) -> Self {
        StandInBuffer(Arc::new(Mutex::new(values)))
    }

    /// Its number of elements.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The values, moved out when this is the last handle, copied otherwise.
    pub fn take(self) -> Vec<T> {
        match Arc::try_unwrap(self.0) {
            Ok(m) => m.into_inner().unwrap_or_else(PoisonError::into_inner),
            Err(shared) => shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<T>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// When a collective started and finished on the communication thread, and whether it
/// succeeded.
type Outcome = (Instant, Instant, std::result::Result<(), String>);

/// The done event of one stand-in collective, set by the communication thread.
#[derive(Debug, Default)]
pub(crate) struct DoneProbe(Mutex<Option<Outcome>>);

impl DoneProbe {
    pub(crate) fn set(&self, started: Instant, result: std::result::Result<(), String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((started, Instant::now(), result));
    }

    fn times(&self) -> Option<(Instant, Instant)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(s, f, _)| (*s, *f))
    }
}

impl CompletionProbe for DoneProbe {
    fn poll(&self) -> std::result::Result<bool, String> {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(false),
            Some((_, _, Ok(()))) => Ok(true),
            Some((_, _, Err(e))) => Err(e.clone()),
        }
    }
}

/// A queued stand-in collective, supervised by the communicator's watchdog, as
/// `NcclWork` is. `Send`: wait for it on any thread. Dropping it does not
/// cancel the collective.
#[derive(Debug)]
#[must_use = "a collective's completion is only known after `wait`"]
pub struct StandInWork {
    watched: WatchedWork,
    probe: Arc<DoneProbe>,
    queued: Instant,
}

impl StandInWork {
    pub(crate) fn new(watched: WatchedWork, probe: Arc<DoneProbe>, queued: Instant) -> Self {
        StandInWork {
            watched,
            probe,
            queued,
        }
    }

    /// Blocks until the collective is done (the buffer then holds the result), or the
    /// communicator's failure.
    ///
    /// # Errors
    /// [`CommError::Watchdog`](crate::CommError::Watchdog) when the collective failed, timed
    /// out or the communicator was aborted.
    pub fn wait(self) -> Result<WorkTiming> {
        // The done event first, as NCCL's work polls its end event: no wait for the
        // watchdog's next poll; its verdict still decides a failure.
        if matches!(self.probe.poll(), Ok(true)) {
            self.watched.finish_observed()?;
        } else {
            self.watched.wait()?;
        }
        let (started, finished) = self.probe.times().unwrap_or((self.queued, self.queued));
        Ok(WorkTiming {
            queued: self.queued,
            started: started.max(self.queued),
            finished,
        })
    }

    /// Whether the collective is done, or the communicator failed; never blocks.
    pub fn is_completed(&self) -> bool {
        self.watched.is_completed()
    }

    /// The collective's sequence number in the communicator (the first is 1).
    pub fn seq(&self) -> u64 {
        self.watched.seq()
    }
}
