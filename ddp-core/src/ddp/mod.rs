//! DDP: the wrapper, its settings and its step, on the shared [`engine`](crate::engine).
//!
//! - [`DistributedDataParallel`] (`wrapper/`): construction sync, `forward`, `backward`,
//!   `no_sync`; beside it `step_on` (the closure step), `join` (uneven inputs, the per-step
//!   round), `guard` (errors are final: abort the group, poison the wrapper) and `record` (the
//!   step timeline file). The step's passes themselves (tap, backward, depth plan) are the
//!   engine's `tap::TappedPasses`, shared with FSDP.
//! - [`DdpConfig`]: bucket caps, buffer broadcast, timeline, collectives.
//! - `reduction_choice`: NCCL or the CPU transports for the buckets, and the reducer over them.
//! - `buffers`: rank 0's running statistics reach every rank every step.
//! - `timeline`: per-step statistics and the Chrome-trace timeline.

mod buffers;
mod config;
mod reduction_choice;
pub(crate) mod timeline;
mod wrapper;

pub use config::DdpConfig;
pub use wrapper::DistributedDataParallel;
