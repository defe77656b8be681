//! [`DistributedDataLoaderBuilder`], in the style of burn's `DataLoaderBuilder`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;

use super::worker::{Source, panic_message};
use super::{Cursor, DistributedDataLoader};
use crate::{BatchSampler, DataError, DistributedSamplerConfig, SamplerState};

/// Builds a [`DistributedDataLoader`].
///
/// ```
/// # use burn::data::{dataloader::batcher::Batcher, dataset::InMemDataset};
/// # use burn::backend::Flex;
/// # use ddp_data::{DistributedDataLoaderBuilder, DistributedSamplerConfig};
/// # use std::time::Duration;
/// # #[derive(Clone)]
/// # struct Collect;
/// # impl Batcher<Flex, u32, Vec<u32>> for Collect {
/// #     fn batch(&self, items: Vec<u32>, _: &burn::backend::flex::FlexDevice) -> Vec<u32> { items }
/// # }
/// let dataset = InMemDataset::new((0..100u32).collect());
/// let loader = DistributedDataLoaderBuilder::new(Collect)
///     .batch_size(8)
///     .num_workers(2)
///     .prefetch(4)
///     .timeout(Duration::from_secs(120))
///     .drop_last(false)
///     .build(dataset, DistributedSamplerConfig::new(2, 0).with_seed(7))?;
/// assert_eq!(loader.len(), 7); // 50 samples on rank 0 -> 6 full batches + 1 short
/// # Ok::<(), ddp_data::DataError>(())
/// ```
pub struct DistributedDataLoaderBuilder<B: Backend, I, O> {
    batcher: Arc<dyn Batcher<B, I, O>>,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch: Option<usize>,
    timeout: Option<Duration>,
    device: Option<B::Device>,
    resume: Option<SamplerState>,
}

impl<B, I, O> DistributedDataLoaderBuilder<B, I, O>
where
    B: Backend,
    I: Send + 'static,
    O: Send + 'static,
{
    /// Starts a builder around `batcher`, with batch size 1, no workers, and
    /// no dropping of a short last batch.
    pub fn new<Bt>(batcher: Bt) -> Self
    where
        Bt: Batcher<B, I, O> + 'static,
    {
        Self {
            batcher: Arc::new(batcher),
            batch_size: 1,
            drop_last: false,
            num_workers: 0,
            prefetch: None,
            timeout: None,
            device: None,
            resume: None,
        }
    }

    /// Samples per batch (per rank). Must be at least 1.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Drops the last batch of an epoch when it is shorter than the batch
    /// size (PyTorch's `DataLoader(drop_last=...)`; the sampler's own
    /// `drop_last` is set on [`DistributedSamplerConfig`]).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Worker threads loading batches in parallel; 0 (the default) loads on
    /// the iterating thread. The batch order does not depend on it.
    pub fn num_workers(mut self, num_workers: usize) -> Self {
        self.num_workers = num_workers;
        self
    }

    /// Most batches loaded ahead of the consumer (in flight or waiting) when
    /// using workers. Defaults to `2 * num_workers`; ignored without workers.
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = Some(batches);
        self
    }

    /// Ends the iteration with [`DataError::Timeout`] when the next batch has
    /// not come from the workers after waiting this long (PyTorch's
    /// `DataLoader(timeout=...)`). Unset by default: then a dataset `get` or
    /// batcher that never returns blocks this rank, and with it every peer at
    /// the next collective, with no hint of the cause.
    ///
    /// The clock runs only while [`next`](Iterator::next) waits for a batch,
    /// so a long training step does not count. As in PyTorch it needs workers
    /// (a batch loaded on the iterating thread cannot be interrupted): `build`
    /// refuses it with `num_workers(0)`, and refuses a zero timeout.
    ///
    /// Rust cannot kill a thread: the worker stuck in the dataset stays blocked
    /// until it returns, and is never joined, so dropping the iterator or the
    /// loader does not wait for it. Until it returns the loader has one worker
    /// fewer (with all stuck, later iterations time out too). The timed-out
    /// batch is not counted as consumed by [`DistributedDataLoader::state`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The device batches are created on (default: `B::Device::default()`).
    pub fn set_device(mut self, device: B::Device) -> Self {
        self.device = Some(device);
        self
    }

    /// Restores a state saved by [`DistributedDataLoader::state`] when
    /// building, so the first iteration continues with the next unseen batch.
    pub fn resume_from(mut self, state: SamplerState) -> Self {
        self.resume = Some(state);
        self
    }

    /// Builds the loader for `dataset`, with this rank's sampler from `sampler`.
    ///
    /// # Errors
    ///
    /// Invalid sampler settings or an empty dataset (see
    /// [`DistributedSamplerConfig::validate`]), [`DataError::ZeroBatchSize`],
    /// [`DataError::ZeroPrefetch`], [`DataError::ZeroTimeout`],
    /// [`DataError::TimeoutWithoutWorkers`], [`DataError::ThreadPool`], and any error
    /// of [`DistributedDataLoader::load_state`] for a
    /// [`resume_from`](Self::resume_from) state.
    pub fn build<D>(
        self,
        dataset: D,
        sampler: DistributedSamplerConfig,
    ) -> Result<DistributedDataLoader<B, I, O>, DataError>
    where
        D: Dataset<I> + 'static,
    {
        let dataset_len = dataset.len();
        let batches =
            BatchSampler::new(sampler.init(dataset_len)?, self.batch_size, self.drop_last)?;
        let prefetch = self.prefetch.unwrap_or(self.num_workers.saturating_mul(2));
        if self.num_workers > 0 && prefetch == 0 {
            return Err(DataError::ZeroPrefetch {
                num_workers: self.num_workers,
            });
        }
        match self.timeout {
            Some(Duration::ZERO) => return Err(DataError::ZeroTimeout),
            Some(timeout) if self.num_workers == 0 => {
                return Err(DataError::TimeoutWithoutWorkers { timeout });
            }
            _ => {}
        }
        let pool = (self.num_workers > 0)
            .then(|| build_pool(self.num_workers))
            .transpose()?;
        let source = Source {
            dataset: Arc::new(dataset),
            batcher: self.batcher,
            device: self.device.unwrap_or_default(),
            dataset_len,
        };
        let mut loader = DistributedDataLoader {
            source: Arc::new(source),
            batches,
            num_workers: self.num_workers,
            prefetch,
            timeout: self.timeout,
            pool,
            cursor: Mutex::new(Cursor::default()),
        };
        if let Some(state) = &self.resume {
            loader.load_state(state)?;
        }
        tracing::debug!(
            rank = sampler.rank,
            num_replicas = sampler.num_replicas,
            dataset_len,
            batches = loader.len(),
            num_workers = loader.num_workers,
            prefetch,
            timeout = ?self.timeout,
            "built distributed data loader"
        );
        Ok(loader)
    }
}

fn build_pool(num_workers: usize) -> Result<rayon::ThreadPool, DataError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(num_workers)
        .thread_name(|i| format!("ddp-data-worker-{i}"))
        // Jobs catch their own panics; this only keeps rayon from aborting
        // the process should one ever escape.
        .panic_handler(|payload| {
            tracing::error!(message = %panic_message(payload.as_ref()), "data loader worker panicked");
        })
        .build()
        .map_err(|error| DataError::ThreadPool {
            num_workers,
            message: error.to_string(),
        })
}

impl<B: Backend, I, O> fmt::Debug for DistributedDataLoaderBuilder<B, I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedDataLoaderBuilder")
            .field("batch_size", &self.batch_size)
            .field("drop_last", &self.drop_last)
            .field("num_workers", &self.num_workers)
            .field("prefetch", &self.prefetch)
            .field("timeout", &self.timeout)
            .field("device", &self.device)
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}
