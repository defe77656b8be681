//! The DDP wrapper.
//!
//! - [`DistributedDataParallel`]: construction sync, taps, buckets, `backward`, `no_sync`.
//! - [`DdpConfig`]: bucket caps, buffer broadcast, compression, timeline, collectives.
//! - `engine_choice`: NCCL or the CPU transports for the buckets.
//! - `buffers`: rank 0's running statistics reach every rank every step.

mod buffers;
mod config;
mod engine_choice;
mod wrapper;

pub use config::{Collectives, DdpConfig, GradientCompression, HostStaging};
pub use wrapper::DistributedDataParallel;
