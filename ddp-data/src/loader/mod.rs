//! [`DistributedDataLoader`]: batches of one rank's share of a burn
//! [`Dataset`](burn::data::dataset::Dataset), loaded in parallel, in a fixed
//! order, resumable mid-epoch.

mod builder;
mod iter;
mod parallel;
mod worker;

pub use builder::DistributedDataLoaderBuilder;
pub use iter::DistributedDataLoaderIter;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use burn::tensor::backend::Backend;

use crate::{BatchSampler, DataError, DistributedSamplerConfig, SamplerState};
use worker::Source;

/// Loads this rank's batches of a dataset, epoch by epoch.
///
/// Build it with [`DistributedDataLoaderBuilder`]. Each epoch, call
/// [`set_epoch`](Self::set_epoch) and iterate [`iter`](Self::iter); every item
/// is a `Result`, because a dataset can fail to produce an item and a
/// batcher can panic (both reported as [`DataError`], never a hang), and a
/// batch can take longer than the [`timeout`](DistributedDataLoaderBuilder::timeout).
///
/// Batches come in the same order, with the same contents, for any number
/// of workers. The order is fixed by the [`DistributedSampler`](crate::DistributedSampler)
/// (`seed + epoch`); batch `k` holds this rank's samples
/// `k * batch_size .. (k + 1) * batch_size`.
///
/// # Resuming
///
/// [`state`](Self::state) reports the epoch and the samples of it already
/// returned by the iterator. A loader restored from it (with
/// [`DistributedDataLoaderBuilder::resume_from`] or
/// [`load_state`](Self::load_state)) continues with exactly the next unseen
/// batch: the first [`iter`](Self::iter) after a restore starts at the saved
/// position. Every other `iter()` starts at the beginning of the current
/// epoch, as in PyTorch (so an evaluation loader can be iterated repeatedly).
/// See [`DistributedSampler::load_state`](crate::DistributedSampler::load_state)
/// for restoring onto a different world size, and
/// [`SamplerState::resharded_for`] for continuing any mid-epoch state there:
/// `loader.load_state(&state.resharded_for(world_size)?)`. (A second `iter()`
/// in such a resharded epoch restarts its layout, which begins after the
/// samples the old world size consumed; the next epoch is a whole one.)
pub struct DistributedDataLoader<B: Backend, I, O> {
    source: Arc<Source<B, I, O>>,
    batches: BatchSampler,
    num_workers: usize,
    prefetch: usize,
    timeout: Option<Duration>,
    /// Dropping a rayon pool does not join its threads, so a worker stuck
    /// after a timeout never blocks the loader's drop.
    pool: Option<rayon::ThreadPool>,
    cursor: Mutex<Cursor>,
}

/// Progress through the current epoch, shared with the live iterator.
#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    /// Incremented by every `iter()`; stale iterators stop reporting.
    generation: u64,
    /// Samples of the epoch consumed.
    position: usize,
    /// Whether the next `iter()` resumes at `position` (set by a restore).
    resume: bool,
}

impl<B: Backend, I, O> DistributedDataLoader<B, I, O> {
    fn lock_cursor(&self) -> std::sync::MutexGuard<'_, Cursor> {
        // The cursor is plain data; a poisoned lock still holds valid values.
        self.cursor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by the iterator of `generation` after yielding a batch ending
    /// at `position`.
    fn record_progress(&self, generation: u64, position: usize) {
        let mut cursor = self.lock_cursor();
        if cursor.generation == generation {
            cursor.position = position;
        }
    }

    pub(crate) fn source(&self) -> &Arc<Source<B, I, O>> {
        &self.source
    }

    pub(crate) fn batch_sampler(&self) -> &BatchSampler {
        &self.batches
    }

    pub(crate) fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
    }

    /// Moves to `epoch` (reshuffling). A different epoch starts from its
    /// beginning; setting the current epoch again keeps a restored position,
    /// so `loader.set_epoch(epoch)` at the top of a resumed training loop is
    /// safe.
    pub fn set_epoch(&mut self, epoch: u64) {
        if epoch != self.epoch() {
            self.batches.set_epoch(epoch);
            let mut cursor = self.lock_cursor();
            cursor.position = 0;
            cursor.resume = false;
        }
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.batches.sampler().epoch()
    }

    /// Batches this rank yields in a whole epoch (for progress bars).
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Batches the next [`iter`](Self::iter) will yield: [`len`](Self::len),
    /// or fewer right after a mid-epoch restore.
    pub fn remaining(&self) -> usize {
        let cursor = *self.lock_cursor();
        if cursor.resume {
            self.batches.len_from(cursor.position)
        } else {
            self.batches.len()
        }
    }

    /// The resumable state: the epoch and the samples of it this rank has
    /// consumed (after the epoch's last batch, all of them: a tail that
    /// `drop_last` leaves out counts as consumed). Can be called while
    /// iterating.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            position: self.lock_cursor().position,
            ..self.batches.state()
        }
    }

    /// Restores a state saved by [`state`](Self::state); the next
    /// [`iter`](Self::iter) continues with the first unseen batch.
    ///
    /// # Errors
    ///
    /// As [`DistributedSampler::load_state`](crate::DistributedSampler::load_state);
    /// on error the loader is unchanged.
    pub fn load_state(&mut self, state: &SamplerState) -> Result<(), DataError> {
        let mut batches = self.batches.clone();
        batches.load_state(state)?;
        let position = batches.sampler().position();
        // The loader tracks the position in its cursor; the sampler stays at 0.
        batches.sampler_mut().set_position(0)?;
        self.batches = batches;
        let mut cursor = self.lock_cursor();
        cursor.position = position;
        cursor.resume = true;
        Ok(())
    }

    /// Samples per batch.
    pub fn batch_size(&self) -> usize {
        self.batches.batch_size()
    }

    /// Whether a short final batch is dropped.
    pub fn drop_last(&self) -> bool {
        self.batches.drop_last()
    }

    /// Worker threads (0: batches are loaded on the iterating thread).
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// Most batches loaded ahead of the consumer when using workers.
    pub fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// How long the iterator waits for a batch from the workers
    /// (see [`DistributedDataLoaderBuilder::timeout`]); `None`: without limit.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Samples this rank yields per epoch.
    pub fn num_samples(&self) -> usize {
        self.batches.sampler().num_samples()
    }

    /// Length of the dataset.
    pub fn dataset_len(&self) -> usize {
        self.source.dataset_len
    }

    /// The sampler settings (world size, rank, shuffle, seed, drop_last).
    pub fn sampler_config(&self) -> &DistributedSamplerConfig {
        self.batches.sampler().config()
    }

    /// The device batches are created on.
    pub fn device(&self) -> &B::Device {
        &self.source.device
    }
}

impl<B: Backend, I, O> fmt::Debug for DistributedDataLoader<B, I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedDataLoader")
            .field("batches", &self.batches)
            .field("num_workers", &self.num_workers)
            .field("prefetch", &self.prefetch)
            .field("timeout", &self.timeout)
            .field("device", &self.source.device)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}
