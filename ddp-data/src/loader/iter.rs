//! The iterator over one epoch's batches.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::backend::Backend;

use super::DistributedDataLoader;
use super::parallel::{Parallel, Received};
use super::worker::{Job, Reply};
use crate::DataError;

/// Yields the batches of the current epoch in a fixed order, whatever the
/// number of workers: `Ok(batch)` for each batch, or one `Err` after which
/// the iteration ends.
///
/// With workers, up to `prefetch` batches are loaded ahead of the consumer;
/// results that finish early wait until their turn. Dropping the iterator
/// early stops queued batches from being loaded; it never waits for a batch
/// being loaded (so it returns at once even after a
/// [timeout](super::DistributedDataLoaderBuilder::timeout)).
///
/// The loader's [`state`](DistributedDataLoader::state) counts a batch as
/// consumed once it has been returned by [`next`](Iterator::next).
pub struct DistributedDataLoaderIter<'a, B: Backend, I, O> {
    loader: &'a DistributedDataLoader<B, I, O>,
    generation: u64,
    /// Position ranges of this iteration's batches.
    ranges: Vec<Range<usize>>,
    /// Number in the epoch of `ranges[0]`, for error messages.
    first_batch: usize,
    next_yield: usize,
    finished: bool,
    parallel: Option<Parallel<O>>,
}

/// `iter()` lives with the iterator it makes: the loader does not depend on its iterator.
impl<B, I, O> DistributedDataLoader<B, I, O>
where
    B: Backend,
    I: Send + 'static,
    O: Send + 'static,
{
    /// Iterates the batches of the current epoch (from the restored position
    /// if a state was just loaded, otherwise from the epoch's start).
    ///
    /// Only the newest iterator updates [`state`](Self::state); an older one
    /// still alive keeps working but no longer counts.
    pub fn iter(&self) -> DistributedDataLoaderIter<'_, B, I, O> {
        let (generation, start) = {
            let mut cursor = self.lock_cursor();
            cursor.generation += 1;
            if !cursor.resume {
                cursor.position = 0;
            }
            cursor.resume = false;
            (cursor.generation, cursor.position)
        };
        DistributedDataLoaderIter::new(self, generation, start)
    }
}

impl<'a, B, I, O> DistributedDataLoaderIter<'a, B, I, O>
where
    B: Backend,
    I: Send + 'static,
    O: Send + 'static,
{
    pub(super) fn new(
        loader: &'a DistributedDataLoader<B, I, O>,
        generation: u64,
        start: usize,
    ) -> Self {
        let batches = loader.batch_sampler();
        let ranges: Vec<Range<usize>> = batches.ranges_from(start).collect();
        let parallel = loader.pool().map(|_| Parallel::new());
        tracing::debug!(
            epoch = batches.sampler().epoch(),
            start,
            batches = ranges.len(),
            workers = loader.num_workers(),
            "starting data loader iteration"
        );
        Self {
            loader,
            generation,
            ranges,
            first_batch: start / batches.batch_size(),
            next_yield: 0,
            finished: false,
            parallel,
        }
    }

    /// Batches this iterator has yet to yield (fewer if an error ends it).
    pub fn remaining(&self) -> usize {
        if self.finished {
            0
        } else {
            self.ranges.len() - self.next_yield
        }
    }

    /// The position at the end of the epoch: every sample of this rank's, including a tail
    /// that `drop_last` leaves out of the batches.
    fn epoch_end(&self) -> usize {
        self.loader.batch_sampler().sampler().num_samples()
    }

    /// Queues batches on the pool until `prefetch` are ahead of the consumer.
    fn fill_window(&mut self) {
        let (Some(parallel), Some(pool)) = (self.parallel.as_mut(), self.loader.pool()) else {
            return;
        };
        let limit = self
            .ranges
            .len()
            .min(self.next_yield.saturating_add(self.loader.prefetch()));
        while parallel.next_submit < limit {
            let seq = parallel.next_submit;
            let job = Job {
                source: Arc::clone(self.loader.source()),
                indices: self
                    .loader
                    .batch_sampler()
                    .indices_in(self.ranges[seq].clone()),
                reply: Reply {
                    tx: Some(parallel.tx.clone()),
                    seq,
                    batch: self.first_batch + seq,
                },
                cancelled: Arc::clone(&parallel.cancelled),
            };
            pool.spawn(move || job.run());
            parallel.next_submit += 1;
        }
    }

    /// The result of batch `seq`, loaded inline or awaited from the pool.
    fn take(&mut self, seq: usize) -> Result<O, DataError> {
        self.fill_window();
        let batch = self.first_batch + seq;
        let Some(parallel) = self.parallel.as_mut() else {
            let indices = self
                .loader
                .batch_sampler()
                .indices_in(self.ranges[seq].clone());
            return self.loader.source().load(&indices, batch);
        };
        match parallel.wait_for(seq, self.loader.timeout()) {
            Received::Batch(result) => result,
            Received::Disconnected => Err(DataError::WorkerPanicked {
                batch,
                message: "the worker pool shut down".to_owned(),
            }),
            Received::TimedOut => Err(self.timed_out(seq)),
        }
    }

    /// The error for batch `seq` not arriving in time, logged with its context.
    fn timed_out(&self, seq: usize) -> DataError {
        let batches = self.loader.batch_sampler();
        let error = DataError::Timeout {
            timeout: self.loader.timeout().unwrap_or_default(),
            epoch: batches.sampler().epoch(),
            batch: self.first_batch + seq,
            indices: batches.indices_in(self.ranges[seq].clone()),
        };
        tracing::error!(%error, "data loader timed out; its worker is left blocked");
        error
    }
}

impl<B, I, O> Iterator for DistributedDataLoaderIter<'_, B, I, O>
where
    B: Backend,
    I: Send + 'static,
    O: Send + 'static,
{
    type Item = Result<O, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished || self.next_yield >= self.ranges.len() {
            if !self.finished {
                // Every batch was yielded: the epoch is complete, even where `drop_last`
                // left a tail that no batch covers.
                self.loader
                    .record_progress(self.generation, self.epoch_end());
            }
            self.finished = true;
            return None;
        }
        let seq = self.next_yield;
        let result = self.take(seq);
        self.next_yield += 1;
        match &result {
            // The last batch completes the epoch, so that a state saved right after it counts
            // as an epoch boundary (it resumes at any world size).
            Ok(_) if self.next_yield == self.ranges.len() => self
                .loader
                .record_progress(self.generation, self.epoch_end()),
            Ok(_) => self
                .loader
                .record_progress(self.generation, self.ranges[seq].end),
            // Not recorded: the failed (or timed-out) batch is not consumed.
            Err(_) => {
                self.finished = true;
                if let Some(parallel) = &self.parallel {
                    parallel.cancel();
                }
            }
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.remaining();
        (remaining.min(1), Some(remaining))
    }
}

impl<B: Backend, I, O> Drop for DistributedDataLoaderIter<'_, B, I, O> {
    /// Cancels queued batches, without waiting for one being loaded.
    fn drop(&mut self) {
        // Never joins: a worker stuck after a timeout would make this hang.
        if let Some(parallel) = &self.parallel {
            parallel.cancel();
        }
    }
}

impl<B: Backend, I, O> fmt::Debug for DistributedDataLoaderIter<'_, B, I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedDataLoaderIter")
            .field("batches", &self.ranges.len())
            .field("yielded", &self.next_yield)
            .field("first_batch", &self.first_batch)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}
