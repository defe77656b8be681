//! Data-parallel input pipeline for [burn](https://burn.dev): the equivalent
//! of PyTorch's `DistributedSampler` + `DataLoader`, with exact mid-epoch
//! resume.
//!
//! * [`DistributedSamplerConfig`] / [`DistributedSampler`]: splits a dataset
//!   between `num_replicas` ranks with PyTorch's semantics (pad by repeating
//!   from the start, or drop the tail; rank `r` takes every
//!   `num_replicas`-th index from `r`), shuffled by a documented,
//!   platform-independent permutation of `seed + epoch` (see
//!   [`sampler::permutation`]).
//! * [`ExactShard`]: for evaluation, each index on exactly one rank (no
//!   padding, no duplicates), so metrics summed over ranks cover the dataset
//!   exactly once.
//! * [`BatchSampler`]: groups one rank's indices into batches.
//! * [`DistributedDataLoaderBuilder`] / [`DistributedDataLoader`]: loads the
//!   batches of a burn [`Dataset`](burn::data::dataset::Dataset) with a burn
//!   [`Batcher`](burn::data::dataloader::batcher::Batcher) on worker threads
//!   with bounded prefetch, in the same order for any worker count.
//! * [`SamplerState`]: epoch + position, serde-serializable; restoring it
//!   continues with exactly the next unseen batch (also on another world size
//!   when that can be done exactly). [`SamplerState::resharded_for`] continues
//!   any mid-epoch state on another world size with exactly the samples of the
//!   epoch not consumed yet (plus PyTorch-style padding of the remainder).
//!
//! Errors are reported as [`DataError`]; the library does not panic on bad
//! input, and a panicking dataset or batcher surfaces as an error item (a
//! stuck one too, with a
//! [`timeout`](DistributedDataLoaderBuilder::timeout)).
//!
//! # Example
//!
//! ```
//! use burn::backend::Flex;
//! use burn::backend::flex::FlexDevice;
//! use burn::data::{dataloader::batcher::Batcher, dataset::InMemDataset};
//! use burn::tensor::{Tensor, TensorData};
//! use ddp_data::{DistributedDataLoaderBuilder, DistributedSamplerConfig, SamplerState};
//!
//! /// Stacks `[f32; 2]` items into a `[batch, 2]` tensor.
//! #[derive(Clone)]
//! struct PairBatcher;
//!
//! impl Batcher<Flex, [f32; 2], Tensor<Flex, 2>> for PairBatcher {
//!     fn batch(&self, items: Vec<[f32; 2]>, device: &FlexDevice) -> Tensor<Flex, 2> {
//!         let rows = items.len();
//!         let flat: Vec<f32> = items.into_iter().flatten().collect();
//!         Tensor::from_data(TensorData::new(flat, [rows, 2]), device)
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (world_size, rank) = (2, 1); // from the launcher's environment
//! let items: Vec<[f32; 2]> = (0..10).map(|i| [i as f32, 0.5]).collect();
//!
//! // The sampler alone: which indices this rank sees in epoch 0.
//! let sampler_config = DistributedSamplerConfig::new(world_size, rank).with_seed(42);
//! let sampler = sampler_config.init(items.len())?;
//! assert_eq!(sampler.indices().len(), 5);
//!
//! // The loader: batches of this rank's share, loaded by 2 worker threads.
//! let mut loader = DistributedDataLoaderBuilder::new(PairBatcher)
//!     .batch_size(2)
//!     .num_workers(2)
//!     .build(InMemDataset::new(items.clone()), sampler_config.clone())?;
//! assert_eq!(loader.len(), 3); // 5 samples: 2 + 2 + 1
//!
//! let mut checkpoint: Option<SamplerState> = None;
//! for epoch in 0..2 {
//!     loader.set_epoch(epoch);
//!     for (step, batch) in loader.iter().enumerate() {
//!         let batch = batch?;
//!         assert_eq!(batch.dims()[1], 2);
//!         if epoch == 1 && step == 0 {
//!             checkpoint = Some(loader.state()); // save with the model
//!         }
//!     }
//! }
//!
//! // After a restart: continue with the second batch of epoch 1.
//! let state = checkpoint.expect("saved in epoch 1");
//! let resumed = DistributedDataLoaderBuilder::new(PairBatcher)
//!     .batch_size(2)
//!     .resume_from(state)
//!     .build(InMemDataset::new(items), sampler_config)?;
//! assert_eq!((resumed.epoch(), resumed.remaining()), (1, 2));
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod batch_sampler;
mod error;
mod loader;
pub mod sampler;

pub use batch_sampler::BatchSampler;
pub use error::DataError;
pub use loader::{DistributedDataLoader, DistributedDataLoaderBuilder, DistributedDataLoaderIter};
pub use sampler::config::DistributedSamplerConfig;
pub use sampler::distributed::DistributedSampler;
pub use sampler::exact_shard::ExactShard;
pub use sampler::state::SamplerState;
