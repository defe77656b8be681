//! The DDP wrapper.
//!
//! - [`DistributedDataParallel`]: construction sync, taps, buckets, `backward`, `no_sync`.
//! - [`DdpConfig`]: bucket caps, buffer broadcast, compression, timeline.

mod config;
mod wrapper;

pub use config::{DdpConfig, GradientCompression};
pub use wrapper::DistributedDataParallel;
