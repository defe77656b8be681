//! The DDP wrapper.
//!
//! - [`DistributedDataParallel`]: construction sync, taps, buckets, `backward`, `no_sync`.
//! - [`DdpConfig`]: bucket caps, buffer broadcast, compression, timeline.
//! - `buffers`: rank 0's running statistics reach every rank every step.

mod buffers;
mod config;
mod wrapper;

pub use config::{DdpConfig, GradientCompression, HostStaging};
pub use wrapper::DistributedDataParallel;
