//! burn's [`DataLoader`](burn::data::dataloader::DataLoader) trait over ddp-data's distributed loader, so burn-train's loop can be
//! handed this rank's shard.
//!
//! burn's trait iterates through `&self` and has no epoch argument, while the distributed
//! sampler needs `set_epoch` (a `&mut` call) to reshuffle. So each [`iter`](burn::data::dataloader::DataLoader::iter)
//! counts as the next epoch (burn-train calls it once per epoch), builds ddp-data's loader for
//! that epoch on a thread of its own, and hands the batches over a small channel (which also
//! overlaps loading with the training step).
//!
//! A data error cannot travel through burn's iterator either: the loader thread records it
//! and closes the channel, and the iterator then hands it to
//! [`DdpStrategy`](crate::DdpStrategy) when the strategy pulls the batch (`next_batch`), or
//! panics, as burn's own loaders do, when anything else iterates. Either way an epoch never just ends
//! short.
//!
//! The files of this folder: the loader's type, its settings and how it splits the data set
//! (here), burn's `DataLoader` trait over it (`data_loader.rs`: one thread per epoch),
//! loading one epoch on that thread (`epoch.rs`), and the iterator that receives the batches
//! and hands a failed epoch's error on (`thread_iter.rs`).

mod data_loader;
mod epoch;
mod thread_iter;

pub(crate) use thread_iter::{LoaderInfo, loader_info, next_batch};

use crate::error::Result;
use crate::mid_epoch::ResumePoint;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use ddp_core::{
    comm::ProcessGroup,
    data::{DataError, DistributedSamplerConfig, ExactShard},
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// How a [`DistributedLoader`] splits the data set between ranks.
#[derive(Debug, Clone)]
enum Split {
    /// PyTorch's `DistributedSampler`: shuffled by `seed + epoch`, the last shard padded by
    /// repeating samples, so every rank has the same number of batches (training needs that:
    /// every step is an all-reduce).
    Train(DistributedSamplerConfig),
    /// Each sample on exactly one rank (`r, r + world, ...`), in order, no padding: metrics
    /// count every sample once. Shards differ by at most one sample, so ranks may differ by
    /// one batch; the strategy's evaluation loop allows for that.
    Eval { world: usize, rank: usize },
}

/// This rank's shard of a data set, as a burn [`DataLoader`](burn::data::dataloader::DataLoader) for burn-train's
/// `SupervisedTraining::new(dir, train_loader, valid_loader)`.
///
/// - [`DistributedLoader::train`]: reshuffled every epoch (the `n`-th call of `iter()` is
///   epoch `start_epoch + n`), the same global order for any world size, so N ranks with batch
///   `b` see the global batches one process with batch `N*b` sees.
/// - [`DistributedLoader::eval`]: every sample on exactly one rank.
///
/// A data error (a dataset returning `None` below its length, a panicking dataset or batcher)
/// cannot be returned through burn's trait. It is logged, aborts the process group given with
/// [`with_abort_group`](Self::with_abort_group) (so every other rank fails at once, quoting
/// it) and ends this rank's iteration with the error: [`DdpStrategy`](crate::DdpStrategy)
/// then fails the run, on every rank, and its [`finish`](crate::DdpStrategy::finish) returns
/// [`DdpTrainError::Loading`](crate::DdpTrainError::Loading) with the [`DataError`] on this rank (the others quote it);
/// anything else iterating the loader gets a panic with that error, as with burn's own
/// loaders. Errors name the data set's own index and length, also for an evaluation shard.
pub struct DistributedLoader<B: Backend, I, O> {
    /// The whole data set, as the user gave it.
    dataset: Arc<dyn Dataset<I>>,
    /// After [`slice`](burn::data::dataloader::DataLoader::slice): the indices of `dataset` this loader covers.
    view: Option<Arc<[usize]>>,
    batcher: Arc<dyn Batcher<B, I, O>>,
    split: Split,
    batch_size: usize,
    num_workers: usize,
    device: B::Device,
    next_epoch: Arc<AtomicU64>,
    /// A mid-epoch resume: the sampler epoch whose first `iter()` starts after this many
    /// batches (taken by that `iter()`).
    resume_steps: Arc<Mutex<Option<(u64, usize)>>>,
    /// Samples this rank sees per epoch, how many ranks there are, and the samples of an epoch
    /// over all ranks (padding included for training; exactly the data set for evaluation).
    per_rank: usize,
    world: usize,
    total: usize,
    abort: Option<ProcessGroup>,
}

impl<B: Backend, I, O> std::fmt::Debug for DistributedLoader<B, I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedLoader")
            .field("split", &self.split)
            .field("batch_size", &self.batch_size)
            .field("num_workers", &self.num_workers)
            .field("per_rank", &self.per_rank)
            .field("next_epoch", &self.next_epoch.load(Ordering::Relaxed))
            .finish()
    }
}

impl<B, I, O> DistributedLoader<B, I, O>
where
    B: Backend,
    I: Send + Sync + 'static,
    O: Send + 'static,
{
    /// A training loader: this rank's shard of `dataset` under `sampler` (for example
    /// `DistributedSamplerConfig::new(pg.world_size(), pg.rank()).with_seed(42)`), `batch_size`
    /// samples per rank and step.
    ///
    /// # Errors
    /// Invalid sampler settings, an empty data set or a `batch_size` of 0 ([`DataError`]).
    pub fn train(
        dataset: impl Dataset<I> + 'static,
        batcher: impl Batcher<B, I, O> + 'static,
        batch_size: usize,
        sampler: DistributedSamplerConfig,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(DataError::ZeroBatchSize.into());
        }
        let per_rank = sampler.init(dataset.len())?.num_samples();
        let world = sampler.num_replicas;
        Ok(Self::with_split(
            Arc::new(dataset),
            Arc::new(batcher),
            Split::Train(sampler),
            batch_size,
            per_rank,
            world,
            per_rank * world,
        ))
    }

    /// An evaluation loader: samples `rank, rank + world, ...` of `dataset` in order, so
    /// metrics gathered over the ranks count every sample exactly once.
    ///
    /// # Errors
    /// `rank >= world`, an empty data set or a `batch_size` of 0 ([`DataError`]). A data set
    /// smaller than the world is fine: the last ranks have no batches.
    pub fn eval(
        dataset: impl Dataset<I> + 'static,
        batcher: impl Batcher<B, I, O> + 'static,
        batch_size: usize,
        world: usize,
        rank: usize,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(DataError::ZeroBatchSize.into());
        }
        let per_rank = ExactShard::new(dataset.len(), world, rank)?.len();
        if dataset.is_empty() {
            return Err(DataError::EmptyDataset.into());
        }
        let total = dataset.len();
        Ok(Self::with_split(
            Arc::new(dataset),
            Arc::new(batcher),
            Split::Eval { world, rank },
            batch_size,
            per_rank,
            world,
            total,
        ))
    }

    fn with_split(
        dataset: Arc<dyn Dataset<I>>,
        batcher: Arc<dyn Batcher<B, I, O>>,
        split: Split,
        batch_size: usize,
        per_rank: usize,
        world: usize,
        total: usize,
    ) -> Self {
        DistributedLoader {
            dataset,
            view: None,
            batcher,
            split,
            batch_size,
            num_workers: 0,
            device: Default::default(),
            next_epoch: Arc::new(AtomicU64::new(0)),
            resume_steps: Arc::default(),
            per_rank,
            world,
            total,
            abort: None,
        }
    }

    /// Worker threads preparing batches (ddp-data's loader; the order does not depend on it).
    pub fn with_num_workers(mut self, num_workers: usize) -> Self {
        self.num_workers = num_workers;
        self
    }

    /// The device batches are created on.
    pub fn with_device(mut self, device: B::Device) -> Self {
        self.device = device;
        self
    }

    /// The epoch the first `iter()` shuffles for (0 by default; set it when resuming at a later
    /// epoch so the order continues the interrupted run's).
    pub fn with_start_epoch(self, epoch: u64) -> Self {
        self.next_epoch.store(epoch, Ordering::Relaxed);
        self
    }

    /// Resume at `point` (from [`resume_point`](crate::resume_point); `None`: from the
    /// start): the first `iter()` is epoch `epochs_done + 1`'s and, inside an epoch, starts
    /// after its first `steps_done` batches (ddp-data's sampler state, so the skipped samples
    /// are never loaded), exactly where the checkpointed run was. Give
    /// [`DdpStrategy::with_resume`](crate::DdpStrategy::with_resume) the same point: the
    /// strategy checks that this loader shuffles for the resumed epoch and, at a mid-epoch
    /// checkpoint, over the checkpoint's data set length and sampler settings. Only for
    /// training loaders (an evaluation loader always starts at the epoch's start).
    pub fn with_resume(self, point: Option<ResumePoint>) -> Self {
        let point = point.unwrap_or_default();
        let epoch = point.epochs_done as u64;
        if point.steps_done > 0 && matches!(self.split, Split::Train(_)) {
            *lock(&self.resume_steps) = Some((epoch, point.steps_done));
        }
        self.with_start_epoch(epoch)
    }

    /// On a data error, abort this group (every rank then fails at once with the reason).
    pub fn with_abort_group(mut self, pg: ProcessGroup) -> Self {
        self.abort = Some(pg);
        self
    }

    /// The epoch the next `iter()` will load.
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch.load(Ordering::Relaxed)
    }

    /// A copy on `device`. It shares this loader's epoch counter and resume point: iterating
    /// either one advances both (the copy [`to_device`](burn::data::dataloader::DataLoader::to_device) returns is the
    /// same loader, moved).
    fn on_device(&self, device: B::Device) -> Self {
        DistributedLoader {
            dataset: self.dataset.clone(),
            view: self.view.clone(),
            batcher: self.batcher.clone(),
            split: self.split.clone(),
            batch_size: self.batch_size,
            num_workers: self.num_workers,
            device,
            next_epoch: self.next_epoch.clone(),
            resume_steps: self.resume_steps.clone(),
            per_rank: self.per_rank,
            world: self.world,
            total: self.total,
            abort: self.abort.clone(),
        }
    }

    /// The number of samples this loader covers (the whole data set, or a slice of it).
    fn covered(&self) -> usize {
        self.view.as_ref().map_or(self.dataset.len(), |v| v.len())
    }

    /// The data set's own index of this loader's `index`-th sample.
    fn dataset_index(&self, index: usize) -> usize {
        self.view
            .as_ref()
            .map_or(Some(index), |v| v.get(index).copied())
            .unwrap_or(index)
    }
}

/// Locks `mutex`, also after a thread panicked while holding it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
