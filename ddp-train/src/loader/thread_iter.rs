//! The iterator of one epoch's batches, received from the loader thread, and the way a
//! data error gets out of burn's `Iterator` (which cannot return one): [`next_batch`] asks
//! for it on this thread and gets the [`LoadFailure`]; anything else iterating gets a panic
//! with it, as with burn's own loaders. Apart because it is the receiving end of the thread.

use super::lock;
use crate::error::DdpTrainError;
use crate::mid_epoch::DataOrder;
use burn::data::dataloader::{DataLoaderIterator, Progress};
use ddp_core::data::DataError;
use std::cell::{Cell, RefCell};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A data error that ended one epoch of a [`DistributedLoader`](crate::DistributedLoader).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} data loader, sampler epoch {sampler_epoch}: {error}")]
pub(crate) struct LoadFailure {
    /// `"training"` or `"validation"`.
    pub(crate) what: &'static str,
    /// The epoch the sampler shuffled for (from 0; burn-train counts epochs from 1).
    pub(crate) sampler_epoch: u64,
    /// ddp-data's error.
    pub(crate) error: DataError,
}

impl LoadFailure {
    /// The strategy's error for this failure in burn-train's `epoch`.
    pub(crate) fn in_epoch(self, epoch: usize) -> DdpTrainError {
        DdpTrainError::Loading {
            epoch,
            what: self.what,
            sampler_epoch: self.sampler_epoch,
            source: self.error,
        }
    }
}

/// What a training [`DistributedLoader`](crate::DistributedLoader)'s epoch iterator says about
/// itself ([`loader_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoaderInfo {
    /// The epoch the sampler shuffles for (from 0; burn-train counts epochs from 1).
    pub(crate) sampler_epoch: u64,
    pub(crate) order: DataOrder,
}

thread_local! {
    /// Set while [`loader_info`] asks an iterator for its progress: a training [`ThreadIter`]
    /// then leaves its [`LoaderInfo`] in [`INFO`] (burn's trait has no way to ask for it).
    static DESCRIBE: Cell<bool> = const { Cell::new(false) };
    static INFO: Cell<Option<LoaderInfo>> = const { Cell::new(None) };
    /// Set while [`next_batch`] pulls a batch on this thread: a [`ThreadIter`] leaves its
    /// epoch's error in [`FAILED`] for it instead of panicking.
    static RETURN_ERRORS: Cell<bool> = const { Cell::new(false) };
    static FAILED: RefCell<Option<LoadFailure>> = const { RefCell::new(None) };
}

/// `iter.next()`, with the data error a [`DistributedLoader`](crate::DistributedLoader)'s
/// epoch ended with returned instead of panicking (other iterators are just advanced).
pub(crate) fn next_batch<O>(
    iter: &mut dyn DataLoaderIterator<O>,
) -> std::result::Result<Option<O>, LoadFailure> {
    /// Restores the flag, also if `next` unwinds.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            RETURN_ERRORS.set(self.0);
        }
    }
    let _restore = Restore(RETURN_ERRORS.replace(true));
    let batch = iter.next();
    match FAILED.take() {
        Some(failure) => Err(failure),
        None => Ok(batch),
    }
}

/// The sampler epoch and data order of a training
/// [`DistributedLoader`](crate::DistributedLoader)'s epoch iterator; `None` for any other
/// iterator (which says nothing about its order).
pub(crate) fn loader_info<O>(iter: &dyn DataLoaderIterator<O>) -> Option<LoaderInfo> {
    /// Restores the flag, also if `progress` unwinds.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            DESCRIBE.set(self.0);
        }
    }
    let _restore = Restore(DESCRIBE.replace(true));
    INFO.set(None);
    let _ = iter.progress();
    INFO.take()
}

/// Receives one epoch's batches from the loader thread.
pub(super) struct ThreadIter<O> {
    pub(super) rx: mpsc::Receiver<O>,
    /// The error the loader thread ended the epoch with (set before the channel closes).
    pub(super) failure: Arc<Mutex<Option<LoadFailure>>>,
    pub(super) handle: Option<JoinHandle<()>>,
    pub(super) batches: usize,
    pub(super) batch_size: usize,
    pub(super) per_rank: usize,
    pub(super) world: usize,
    pub(super) total: usize,
    /// A training loader's epoch and order ([`loader_info`]); `None` for evaluation.
    pub(super) info: Option<LoaderInfo>,
}

impl<O> Iterator for ThreadIter<O> {
    type Item = O;

    /// The next batch; `None` at the end of the epoch. A failed epoch does not just end: its
    /// error goes to [`next_batch`] (the strategy), or, for any other caller, is a panic (as
    /// burn's own loaders fail).
    fn next(&mut self) -> Option<O> {
        if let Ok(batch) = self.rx.recv() {
            self.batches += 1;
            return Some(batch);
        }
        let failure = lock(&self.failure).take()?;
        if RETURN_ERRORS.get() {
            FAILED.set(Some(failure));
            return None;
        }
        panic!("{failure}");
    }
}

impl<O> DataLoaderIterator<O> for ThreadIter<O> {
    /// Progress over the whole world (this rank's count times the world size, at most the
    /// epoch's total), as rank 0 shows it for the global batch.
    fn progress(&self) -> Progress {
        if DESCRIBE.get() {
            INFO.set(self.info);
        }
        let done = (self.batches * self.batch_size).min(self.per_rank);
        Progress::new((done * self.world).min(self.total), self.total)
    }
}

impl<O> Drop for ThreadIter<O> {
    fn drop(&mut self) {
        // Closing the channel makes the loader thread stop at its next send.
        let (_, closed) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.rx, closed));
        if let Some(h) = self.handle.take()
            && h.join().is_err()
        {
            tracing::error!("the loader thread panicked");
        }
    }
}
