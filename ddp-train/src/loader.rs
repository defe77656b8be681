//! burn's [`DataLoader`] trait over ddp-data's distributed loader, so burn-train's loop can be
//! handed this rank's shard.
//!
//! burn's trait iterates through `&self` and has no epoch argument, while the distributed
//! sampler needs `set_epoch` (a `&mut` call) to reshuffle. So each [`iter`](DataLoader::iter)
//! counts as the next epoch (burn-train calls it once per epoch), builds ddp-data's loader for
//! that epoch on a thread of its own, and hands the batches over a small channel (which also
//! overlaps loading with the training step).
//!
//! A data error cannot travel through burn's iterator either: the loader thread records it
//! and closes the channel, and the iterator then hands it to
//! [`DdpStrategy`](crate::DdpStrategy) when the strategy pulls the batch (`next_batch`), or
//! panics, as burn's own loaders do, when anything else iterates. Either way an epoch never just ends
//! short.

use crate::error::{DdpTrainError, Result};
use crate::mid_epoch::ResumePoint;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use ddp_core::{
    comm::ProcessGroup,
    data::{
        DataError, DistributedDataLoaderBuilder, DistributedSamplerConfig, ExactShard, SamplerState,
    },
};
use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

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

/// This rank's shard of a data set, as a burn [`DataLoader`] for burn-train's
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
    /// After [`slice`](DataLoader::slice): the indices of `dataset` this loader covers.
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
    /// [`DdpStrategy::with_resume`](crate::DdpStrategy::with_resume) the same point. Only
    /// for training loaders (an evaluation loader always starts at the epoch's start).
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
    /// either one advances both (the copy [`to_device`](DataLoader::to_device) returns is the
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

    /// Loads one epoch on the calling (loader) thread, after its first `skip` batches,
    /// sending each batch to `tx`. Errors name the data set's own indices and length.
    fn load_epoch(
        &self,
        epoch: u64,
        skip: usize,
        tx: &mpsc::SyncSender<O>,
    ) -> Result<(), DataError> {
        // What ddp-data's loader indexes: the data set, or a view of it (a slice, or this
        // rank's evaluation shard).
        let (indices, sampler): (Option<Arc<[usize]>>, _) = match &self.split {
            Split::Train(sampler) => (self.view.clone(), sampler.clone()),
            Split::Eval { world, rank } => {
                let shard = ExactShard::new(self.covered(), *world, *rank)?;
                if shard.is_empty() {
                    // An evaluation set smaller than the world (or an empty slice of one):
                    // this rank has no batches. (`eval` refuses an empty data set.)
                    return Ok(());
                }
                let indices = shard.indices().map(|i| self.dataset_index(i)).collect();
                let single = DistributedSamplerConfig::new(1, 0).with_shuffle(false);
                (Some(indices), single)
            }
        };
        let dataset: Arc<dyn Dataset<I>> = match &indices {
            Some(indices) => Arc::new(ShardView {
                inner: self.dataset.clone(),
                indices: indices.clone(),
            }),
            None => self.dataset.clone(),
        };
        self.load_view(epoch, skip, dataset, sampler, tx)
            .map_err(|e| self.in_dataset_terms(e, indices.as_deref()))
    }

    /// ddp-data's error about a view's sample `i` (of `indices`), about the data set's.
    fn in_dataset_terms(&self, error: DataError, indices: Option<&[usize]>) -> DataError {
        let Some(indices) = indices else {
            return error;
        };
        let original = |i: usize| indices.get(i).copied().unwrap_or(i);
        match error {
            DataError::MissingItem { index, .. } => DataError::MissingItem {
                index: original(index),
                dataset_len: self.dataset.len(),
            },
            DataError::Timeout {
                timeout,
                epoch,
                batch,
                indices: batch_indices,
            } => DataError::Timeout {
                timeout,
                epoch,
                batch,
                indices: batch_indices.into_iter().map(original).collect(),
            },
            other => other,
        }
    }

    /// [`load_epoch`](Self::load_epoch) over `dataset` (the data set or a view of it).
    fn load_view(
        &self,
        epoch: u64,
        skip: usize,
        dataset: Arc<dyn Dataset<I>>,
        sampler: DistributedSamplerConfig,
        tx: &mpsc::SyncSender<O>,
    ) -> Result<(), DataError> {
        let mut builder = DistributedDataLoaderBuilder::new(SharedBatcher(self.batcher.clone()))
            .batch_size(self.batch_size)
            .num_workers(self.num_workers)
            .set_device(self.device.clone());
        if skip > 0 {
            // ddp-data's resumable state: the sampler continues at this rank's position.
            let state = SamplerState {
                epoch,
                position: skip.saturating_mul(self.batch_size).min(self.per_rank),
                ..sampler.init(dataset.len())?.state()
            };
            builder = builder.resume_from(state);
        }
        let mut loader = builder.build(SharedDataset(dataset), sampler)?;
        loader.set_epoch(epoch); // the same epoch keeps a restored position
        for batch in loader.iter() {
            if tx.send(batch?).is_err() {
                break; // the consumer stopped early (interrupted or dropped)
            }
        }
        Ok(())
    }
}

impl<B, I, O> DataLoader<B, O> for DistributedLoader<B, I, O>
where
    B: Backend,
    I: Send + Sync + 'static,
    O: Send + 'static,
{
    /// The next epoch's batches; a data error ends them with the error (see
    /// [`DistributedLoader`]).
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
        let skip = {
            let mut resume = lock(&self.resume_steps);
            match *resume {
                Some((at, steps)) if at == epoch => {
                    *resume = None;
                    steps
                }
                _ => 0,
            }
        };
        let (tx, rx) = mpsc::sync_channel(2);
        let failure: Arc<Mutex<Option<LoadFailure>>> = Arc::default();
        let what = match self.split {
            Split::Train(_) => "training",
            Split::Eval { .. } => "validation",
        };
        let this = self.on_device(self.device.clone());
        let slot = failure.clone();
        let handle = std::thread::Builder::new()
            .name(format!("ddp-train-loader-e{epoch}"))
            .spawn(move || {
                let loaded = catch_unwind(AssertUnwindSafe(|| this.load_epoch(epoch, skip, &tx)))
                    .unwrap_or_else(|payload| {
                        Err(DataError::WorkerPanicked {
                            batch: skip,
                            message: ddp_core::comm::panic_message(payload.as_ref()),
                        })
                    });
                if let Err(error) = loaded {
                    let failure = LoadFailure {
                        what,
                        sampler_epoch: epoch,
                        error,
                    };
                    let reason = failure.to_string();
                    tracing::error!(error = %reason, "loading failed; ending the epoch with the error");
                    // Peers first: they fail at once, quoting this rank's reason.
                    if let Some(pg) = &this.abort {
                        pg.abort(&reason);
                    }
                    // Recorded before the channel closes, so the iterator finds it.
                    *lock(&slot) = Some(failure);
                }
                drop(tx);
            });
        let handle = match handle {
            Ok(h) => Some(h),
            Err(e) => {
                // The closure (and the sender with it) is gone: the channel is closed.
                let lost = LoadFailure {
                    what,
                    sampler_epoch: epoch,
                    error: DataError::ThreadPool {
                        num_workers: 1,
                        message: format!("the loader thread: {e}"),
                    },
                };
                tracing::error!(error = %lost, "could not start the loader thread");
                if let Some(pg) = &self.abort {
                    pg.abort(&lost.to_string());
                }
                *lock(&failure) = Some(lost);
                None
            }
        };
        Box::new(ThreadIter {
            rx,
            failure,
            handle,
            // Progress counts the skipped batches, as if they had been taken.
            batches: skip,
            batch_size: self.batch_size,
            per_rank: self.per_rank,
            world: self.world,
            total: self.total,
        })
    }

    fn num_items(&self) -> usize {
        self.total
    }

    /// This loader, creating its batches on `device`. The copy shares the epoch counter and
    /// the resume point: it continues where this loader is, and iterating it advances this one.
    fn to_device(&self, device: &B::Device) -> Arc<dyn DataLoader<B, O>> {
        Arc::new(self.on_device(device.clone()))
    }

    /// Samples `start..end` of what this loader covers, as a loader of its own (its own epoch
    /// counter, starting at this loader's next epoch). Errors still name the data set's
    /// indices.
    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<B, O>> {
        let end = end.min(self.covered());
        let start = start.min(end);
        let indices: Arc<[usize]> = (start..end).map(|i| self.dataset_index(i)).collect();
        let per_rank = (end - start).div_ceil(self.world.max(1));
        let total = match self.split {
            Split::Train(_) => per_rank * self.world,
            Split::Eval { .. } => end - start,
        };
        let mut sliced = self.on_device(self.device.clone());
        sliced.view = Some(indices);
        sliced.per_rank = per_rank;
        sliced.total = total;
        sliced.next_epoch = Arc::new(AtomicU64::new(self.next_epoch()));
        sliced.resume_steps = Arc::new(Mutex::new(*lock(&self.resume_steps)));
        Arc::new(sliced)
    }
}

/// A data error that ended one epoch of a [`DistributedLoader`].
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

thread_local! {
    /// Set while [`next_batch`] pulls a batch on this thread: a [`ThreadIter`] leaves its
    /// epoch's error in [`FAILED`] for it instead of panicking.
    static RETURN_ERRORS: Cell<bool> = const { Cell::new(false) };
    static FAILED: RefCell<Option<LoadFailure>> = const { RefCell::new(None) };
}

/// `iter.next()`, with the data error a [`DistributedLoader`]'s epoch ended with returned
/// instead of panicking (other iterators are just advanced).
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Receives one epoch's batches from the loader thread.
struct ThreadIter<O> {
    rx: mpsc::Receiver<O>,
    /// The error the loader thread ended the epoch with (set before the channel closes).
    failure: Arc<Mutex<Option<LoadFailure>>>,
    handle: Option<JoinHandle<()>>,
    batches: usize,
    batch_size: usize,
    per_rank: usize,
    world: usize,
    total: usize,
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

/// A data set behind an `Arc`, for ddp-data's builder (which takes it by value).
struct SharedDataset<I>(Arc<dyn Dataset<I>>);

impl<I> Dataset<I> for SharedDataset<I> {
    fn get(&self, index: usize) -> Option<I> {
        self.0.get(index)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Some indices of a data set, in the given order.
struct ShardView<I> {
    inner: Arc<dyn Dataset<I>>,
    indices: Arc<[usize]>,
}

impl<I> Dataset<I> for ShardView<I> {
    fn get(&self, index: usize) -> Option<I> {
        self.indices.get(index).and_then(|&i| self.inner.get(i))
    }
    fn len(&self) -> usize {
        self.indices.len()
    }
}

/// A batcher behind an `Arc`, so one batcher serves every epoch's loader.
struct SharedBatcher<B: Backend, I, O>(Arc<dyn Batcher<B, I, O>>);

impl<B: Backend, I, O> Batcher<B, I, O> for SharedBatcher<B, I, O> {
    fn batch(&self, items: Vec<I>, device: &B::Device) -> O {
        self.0.batch(items, device)
    }
}
