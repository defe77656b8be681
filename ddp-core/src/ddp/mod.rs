//! Everything about DDP: the wrapper and the machinery under it.
//!
//! - [`DistributedDataParallel`]: construction sync, taps, buckets, `backward`, `no_sync`.
//! - [`DdpConfig`]: bucket caps, buffer broadcast, timeline, collectives.
//! - `join`: uneven inputs, the per-step round and [`join`](DistributedDataParallel::join).
//! - `guard`: errors are final (abort the group, poison the wrapper).
//! - `record`: writing the step timeline file.
//! - `reduction_choice`: NCCL or the CPU transports for the buckets, and the reducer over them.
//! - `buffers`: rank 0's running statistics reach every rank every step.
//! - `params`: the module's parameters and buffers, in one order on every rank.
//! - `model_sync`: rank 0's model reaches every rank at construction.
//! - `tap`: the identity nodes that hand each gradient to the reducer during backward.
//! - `boundary`: [`layer_boundary`](crate::layer_boundary), opt-in marks in a model's forward.
//! - `reducer`: the bucket bookkeeping and how a bucket is reduced; `reducible`: the dtypes it
//!   reduces.
//! - `bucket`: the bucketing rule; [`hooks`]: communication hooks.
//! - `timeline`: per-step statistics and the Chrome-trace timeline.

pub(crate) mod arrival_order;
pub(crate) mod boundary;
pub(crate) mod bucket;
mod buffers;
mod config;
mod guard;
pub mod hooks;
mod join;
pub(crate) mod model_sync;
pub(crate) mod params;
mod record;
pub(crate) mod reducer;
pub(crate) mod reducible;
mod reduction_choice;
pub(crate) mod tap;
pub(crate) mod timeline;
mod wrapper;

pub use config::{Collectives, DdpConfig, HostStaging};
pub use wrapper::DistributedDataParallel;
