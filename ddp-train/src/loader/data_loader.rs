//! burn's `DataLoader` trait over a [`DistributedLoader`]: each
//! `iter()` is the next epoch, loaded on a thread of its own and handed over a small channel
//! (a data error aborts the group given with `with_abort_group` and is left for the
//! iterator); `to_device` shares the epoch counter and resume point; `slice` is a loader of
//! its own. Apart from the type because this is the trait burn-train drives.

use super::thread_iter::{LoadFailure, LoaderInfo, ThreadIter};
use super::{DistributedLoader, Split, lock};
use crate::mid_epoch::DataOrder;
use burn::data::dataloader::{DataLoader, DataLoaderIterator};
use burn::tensor::backend::Backend;
use ddp_core::data::DataError;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

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
            info: match &self.split {
                Split::Train(sampler) => Some(LoaderInfo {
                    sampler_epoch: epoch,
                    order: DataOrder {
                        dataset_len: self.covered(),
                        seed: sampler.seed,
                        shuffle: sampler.shuffle,
                        drop_last: sampler.drop_last,
                    },
                }),
                Split::Eval { .. } => None,
            },
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
    /// counter, starting at this loader's next epoch), split between the ranks as this loader
    /// splits the data set (the sampler's padding or `drop_last`). Errors still name the data
    /// set's indices.
    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<B, O>> {
        let end = end.min(self.covered());
        let start = start.min(end);
        let indices: Arc<[usize]> = (start..end).map(|i| self.dataset_index(i)).collect();
        let len = end - start;
        let (per_rank, total) = match &self.split {
            // The sampler's own count, so `drop_last` drops the tail here too. An empty
            // slice has no samples (its epoch fails with the sampler's error when iterated).
            Split::Train(sampler) => {
                let per_rank = sampler.init(len).map_or(0, |s| s.num_samples());
                (per_rank, per_rank * self.world)
            }
            Split::Eval { .. } => (len.div_ceil(self.world.max(1)), len),
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
