//! burn's [`DataLoader`] trait over ddp-data's distributed loader, so burn-train's loop can be
//! handed this rank's shard.
//!
//! burn's trait iterates through `&self` and has no epoch argument, while the distributed
//! sampler needs `set_epoch` (a `&mut` call) to reshuffle. So each [`iter`](DataLoader::iter)
//! counts as the next epoch (burn-train calls it once per epoch), builds ddp-data's loader for
//! that epoch on a thread of its own, and hands the batches over a small channel (which also
//! overlaps loading with the training step).

use crate::error::Result;
use crate::mid_epoch::ResumePoint;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use ddp_core::{
    comm::ProcessGroup,
    data::{DistributedDataLoaderBuilder, DistributedSamplerConfig, ExactShard, SamplerState},
};
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
/// A data error (a panicking dataset or batcher) cannot be returned through burn's trait: it
/// is logged, aborts the process group given with [`with_abort_group`](Self::with_abort_group)
/// (so every rank fails at once, quoting it) and ends this rank's iteration; the strategy then
/// fails with an error rather than hanging.
pub struct DistributedLoader<B: Backend, I, O> {
    dataset: Arc<dyn Dataset<I>>,
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
    /// Invalid sampler settings or an empty data set ([`DataError`](ddp_core::data::DataError)).
    pub fn train(
        dataset: impl Dataset<I> + 'static,
        batcher: impl Batcher<B, I, O> + 'static,
        batch_size: usize,
        sampler: DistributedSamplerConfig,
    ) -> Result<Self> {
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
    /// `rank >= world` or an empty data set ([`DataError`](ddp_core::data::DataError)).
    pub fn eval(
        dataset: impl Dataset<I> + 'static,
        batcher: impl Batcher<B, I, O> + 'static,
        batch_size: usize,
        world: usize,
        rank: usize,
    ) -> Result<Self> {
        let per_rank = ExactShard::new(dataset.len(), world, rank)?.len();
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
            batcher,
            split,
            batch_size: batch_size.max(1),
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

    fn clone_with(
        &self,
        dataset: Arc<dyn Dataset<I>>,
        device: B::Device,
        per_rank: usize,
        total: usize,
    ) -> Self {
        DistributedLoader {
            dataset,
            batcher: self.batcher.clone(),
            split: self.split.clone(),
            batch_size: self.batch_size,
            num_workers: self.num_workers,
            device,
            next_epoch: Arc::new(AtomicU64::new(self.next_epoch())),
            resume_steps: Arc::new(Mutex::new(*lock(&self.resume_steps))),
            per_rank,
            world: self.world,
            total,
            abort: self.abort.clone(),
        }
    }

    /// Loads one epoch on the calling (loader) thread, after its first `skip` batches,
    /// sending each batch to `tx`.
    fn load_epoch(&self, epoch: u64, skip: usize, tx: &mpsc::SyncSender<O>) -> Result<()> {
        let (dataset, sampler): (Arc<dyn Dataset<I>>, _) = match &self.split {
            Split::Train(sampler) => (self.dataset.clone(), sampler.clone()),
            Split::Eval { world, rank } => {
                let shard = ExactShard::new(self.dataset.len(), *world, *rank)?;
                if shard.is_empty() && !self.dataset.is_empty() {
                    // An evaluation set smaller than the world: this rank has no batches. (An
                    // empty set is still the loader's error below, on every rank.)
                    return Ok(());
                }
                let view = ShardView {
                    inner: self.dataset.clone(),
                    indices: shard.indices().collect(),
                };
                let single = DistributedSamplerConfig::new(1, 0).with_shuffle(false);
                (Arc::new(view), single)
            }
        };
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
        let this = self.clone_with(
            self.dataset.clone(),
            self.device.clone(),
            self.per_rank,
            self.total,
        );
        let handle = std::thread::Builder::new()
            .name(format!("ddp-train-loader-e{epoch}"))
            .spawn(move || {
                if let Err(e) = this.load_epoch(epoch, skip, &tx) {
                    let reason = format!("data loader, epoch {epoch}: {e}");
                    tracing::error!(error = %reason, "loading failed; aborting the process group");
                    if let Some(pg) = &this.abort {
                        pg.abort(&reason);
                    }
                }
            });
        let handle = match handle {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(error = %e, "could not start the loader thread; this epoch has no batches");
                None
            }
        };
        Box::new(ThreadIter {
            rx,
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

    fn to_device(&self, device: &B::Device) -> Arc<dyn DataLoader<B, O>> {
        Arc::new(self.clone_with(
            self.dataset.clone(),
            device.clone(),
            self.per_rank,
            self.total,
        ))
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<B, O>> {
        let end = end.min(self.dataset.len());
        let start = start.min(end);
        let view = ShardView {
            inner: self.dataset.clone(),
            indices: (start..end).collect(),
        };
        let per_rank = (end - start).div_ceil(self.world.max(1));
        let total = match self.split {
            Split::Train(_) => per_rank * self.world,
            Split::Eval { .. } => end - start,
        };
        Arc::new(self.clone_with(Arc::new(view), self.device.clone(), per_rank, total))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Receives one epoch's batches from the loader thread.
struct ThreadIter<O> {
    rx: mpsc::Receiver<O>,
    handle: Option<JoinHandle<()>>,
    batches: usize,
    batch_size: usize,
    per_rank: usize,
    world: usize,
    total: usize,
}

impl<O> Iterator for ThreadIter<O> {
    type Item = O;

    fn next(&mut self) -> Option<O> {
        let batch = self.rx.recv().ok()?;
        self.batches += 1;
        Some(batch)
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
    indices: Vec<usize>,
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
