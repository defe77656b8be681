//! Layers for data-parallel training, beside burn's `burn::nn`.
//!
//! Synchronised batch normalisation: [`SyncBatchNorm`] normalises with the mean and variance of
//! the global batch (every rank's batch together), which small per-rank batches need.
//!
//! - [`SyncBatchNorm`]: the layer (fields and record of burn's `BatchNorm`, converters both
//!   ways).
//! - [`SyncBatchNormGroup`]: the process group the statistics travel on, separate from DDP's
//!   (why: see its docs).
//! - [`SyncBatchNormBackend`]: the differentiable all-reduce the layer is built on, for any
//!   `Autodiff<B>` over `Flex` (or `Cuda`).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::BatchNormConfig;
//! use ddp_core::init_from_env;
//! use ddp_core::nn::{SyncBatchNorm, SyncBatchNormGroup};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pg = init_from_env()?;
//! let group = SyncBatchNormGroup::new(&pg)?; // once, shared by every layer
//! let device = Default::default();
//! let bn = SyncBatchNorm::<Autodiff<Flex>>::new(&BatchNormConfig::new(16), group, &device);
//! # Ok(()) }
//! ```

mod all_reduce;
mod error;
mod group;
mod sync_batch_norm;

pub use all_reduce::SyncBatchNormBackend;
pub use error::SyncBatchNormError;
pub use group::SyncBatchNormGroup;
pub use sync_batch_norm::SyncBatchNorm;
