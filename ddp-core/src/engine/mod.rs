//! The machinery DDP, ZeRO and FSDP share; `ddp/`, [`crate::zero`] and [`crate::fsdp`]
//! sit above it and never import each other's internals.
//!
//! - `params`: the module's parameters and buffers, in one order on every rank; `reducible`:
//!   the dtypes the reducers reduce.
//! - `model_sync`: rank 0's model (or any bytes) reaches every rank.
//! - `tap`: the identity nodes that hand each gradient over during backward; `boundary`:
//!   [`layer_boundary`](crate::layer_boundary), opt-in marks in a model's forward.
//! - `arrival_order`: the ranks agree on the order gradients arrived in.
//! - `partition`: which rank owns which tensor (ZeRO's rule; sharded checkpoints write by it),
//!   over `module_tensors`, the module's float tensors in order.
//! - `bucket`: the bucketing rule; `reducer`: the bucket bookkeeping and how a bucket is
//!   reduced (host transports, a communication hook, or the device engine that drives NCCL and
//!   its CPU stand-in, whose reduce-scatters and all-gathers ZeRO-2 and FSDP use too).
//! - [`hooks`]: communication hooks; `collectives`: which communicator reduces, and how
//!   gradients are staged for the CPU transports.

pub(crate) mod arrival_order;
pub(crate) mod boundary;
pub(crate) mod bucket;
mod collectives;
pub mod hooks;
pub(crate) mod model_sync;
pub(crate) mod module_tensors;
pub(crate) mod params;
pub(crate) mod partition;
pub(crate) mod reducer;
pub(crate) mod reducible;
pub(crate) mod tap;

pub use collectives::{Collectives, HostStaging};
