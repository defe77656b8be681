//! DDP: the wrapper, its settings and its step, on the shared [`engine`](crate::engine).
//!
//! - [`DistributedDataParallel`]: construction sync, taps, buckets, `backward`, `no_sync`.
//! - [`DdpConfig`]: bucket caps, buffer broadcast, timeline, collectives.
//! - `join`: uneven inputs, the per-step round and [`join`](DistributedDataParallel::join).
//! - `guard`: errors are final (abort the group, poison the wrapper).
//! - `record`: writing the step timeline file.
//! - `reduction_choice`: NCCL or the CPU transports for the buckets, and the reducer over them.
//! - `buffers`: rank 0's running statistics reach every rank every step.
//! - `timeline`: per-step statistics and the Chrome-trace timeline.

mod buffers;
mod config;
mod guard;
mod join;
mod record;
mod reduction_choice;
pub(crate) mod timeline;
mod wrapper;

pub use config::DdpConfig;
pub use wrapper::DistributedDataParallel;
