//! The iterator over one epoch's batches.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use burn::tensor::backend::Backend;

use super::DistributedDataLoader;
use super::worker::{Finished, Job, Reply};
use crate::DataError;

/// Yields the batches of the current epoch in a fixed order, whatever the
/// number of workers: `Ok(batch)` for each batch, or one `Err` after which
/// the iteration ends.
///
/// With workers, up to `prefetch` batches are loaded ahead of the consumer;
/// results that finish early wait until their turn. Dropping the iterator
/// early stops queued batches from being loaded.
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

/// Bookkeeping of the worker pipeline.
struct Parallel<O> {
    tx: mpsc::Sender<Finished<O>>,
    rx: mpsc::Receiver<Finished<O>>,
    /// Results that arrived before their turn.
    early: HashMap<usize, Result<O, DataError>>,
    next_submit: usize,
    cancelled: Arc<AtomicBool>,
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
        let parallel = loader.pool().map(|_| {
            let (tx, rx) = mpsc::channel();
            Parallel {
                tx,
                rx,
                early: HashMap::new(),
                next_submit: 0,
                cancelled: Arc::new(AtomicBool::new(false)),
            }
        });
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
        let Some(parallel) = self.parallel.as_mut() else {
            let indices = self
                .loader
                .batch_sampler()
                .indices_in(self.ranges[seq].clone());
            return self.loader.source().load(&indices, self.first_batch + seq);
        };
        loop {
            if let Some(result) = parallel.early.remove(&seq) {
                return result;
            }
            // Every queued job sends exactly one result (see `Reply`), and we
            // hold a sender, so this only fails if the pool is gone.
            match parallel.rx.recv() {
                Ok((done, result)) => {
                    parallel.early.insert(done, result);
                }
                Err(_) => {
                    return Err(DataError::WorkerPanicked {
                        batch: self.first_batch + seq,
                        message: "the worker pool shut down".to_owned(),
                    });
                }
            }
        }
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
            Err(_) => {
                self.finished = true;
                if let Some(parallel) = &self.parallel {
                    parallel.cancelled.store(true, Ordering::Relaxed);
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
    fn drop(&mut self) {
        if let Some(parallel) = &self.parallel {
            parallel.cancelled.store(true, Ordering::Relaxed);
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
