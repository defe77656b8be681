//! Loading one epoch of a [`DistributedLoader`] on its loader
//! thread: ddp-data's distributed loader built over the data set (or over this rank's
//! evaluation shard, or a slice), resumed after the steps a checkpoint already took, each
//! batch sent to the iterator; its errors name the data set's own indices. Apart from the
//! `DataLoader` trait because this is what runs on the thread, not what starts it.

use super::{DistributedLoader, Split};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use ddp_core::data::{
    DataError, DistributedDataLoaderBuilder, DistributedSamplerConfig, ExactShard, SamplerState,
};
use std::sync::{Arc, mpsc};

impl<B, I, O> DistributedLoader<B, I, O>
where
    B: Backend,
    I: Send + Sync + 'static,
    O: Send + 'static,
{
    /// Loads one epoch on the calling (loader) thread, after its first `skip` batches,
    /// sending each batch to `tx`. Errors name the data set's own indices and length.
    pub(super) fn load_epoch(
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
