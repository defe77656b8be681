//! The device engine: buckets reduced in place on the device by a communicator with its own
//! stream, while backward goes on, behind one seam ([`ReductionDevice`]) with two sides.
//!
//! - **The protocol** ([`DeviceReduction`], [`issuer`]): on the backward thread a full bucket
//!   is flattened ([`flatten`](super::flat_bucket::flatten), 512-byte slots), staged on the
//!   device with a *ready fence* and handed to the issuing thread; that thread waits for each
//!   fence in launch order and queues the bucket's collective on the communication stream, so
//!   every rank queues the same collectives in the same order; [`PendingBucket::wait`]
//!   returns once the collective is done. Failures are bounded: the communicator's watchdog
//!   bounds every collective, the issuing thread says how long it has waited for a fence (a
//!   kernel that never ends fails the communicator after the timeout; ZeRO's and FSDP's
//!   collectives on the calling thread, [`DeviceShards`], wait for theirs until the timeout,
//!   [`ReductionDevice::wait_ready_until`]), a failed step aborts the communicator, and memory
//!   a collective may still write is never given back.
//! - **The device** ([`ReductionDevice`]): what the protocol needs from one: a bucket's
//!   memory, a ready fence taken on the backward thread, an asynchronous collective queued in
//!   issue order (all-reduce for DDP's buckets; reduce-scatter and all-gather for ZeRO stage
//!   2, [`crate::zero`]), its done event, the communicator's failure, abort.
//!   - `NcclDevice` (feature `cuda`, `nccl.rs`): cubecl buffers, `client.sync()` fences (waited
//!     for on a thread of its own when a deadline bounds the wait, `waiter.rs`), NCCL on the
//!     group's stream, CUDA events.
//!   - [`StandInDevice`]: host buffers, fences completed by the producing thread, the
//!     collectives on [`StandInComm`](ddp_comm::stand_in::StandInComm)'s thread over the CPU
//!     transports: the same protocol runs at any world size on machines without GPUs
//!     ([`Collectives::StandIn`](crate::Collectives::StandIn)), which is how it is tested.
//!
//! [`PendingBucket::wait`]: super::reduction::PendingBucket::wait

mod choice;
mod engine;
mod issuer;
#[cfg(feature = "cuda")]
mod nccl;
mod shards;
mod stand_in;
#[cfg(any(feature = "cuda", test))]
mod waiter;

#[cfg(feature = "cuda")]
pub(crate) use choice::nccl_can_run;
pub(crate) use choice::{DeviceChoice, choose_device};
pub(crate) use engine::{ChunkInFlight, DeviceReduction, UnitGradient};
#[cfg(feature = "cuda")]
pub(crate) use nccl::{NcclDevice, NcclReduction};
pub(crate) use shards::{DeviceShards, ShardCollectives, ShardError};
pub(crate) use stand_in::{StandInDevice, StandInReduction};

use crate::error::DdpError;
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::watchdog::CollectiveLabel;
use ddp_comm::{CommError, WorkTiming};
use std::time::Instant;

/// What the device engine's protocol needs from a device and its communicator.
///
/// Cheap to clone: the issuing thread holds a clone.
pub(crate) trait ReductionDevice: Clone + Send + Sync + 'static {
    /// A flat bucket on the device, kept alive, and untouched, while its collective may run.
    type Memory: Send + 'static;
    /// Completes once everything that produced a bucket has run on the device.
    type Fence: Send + 'static;
    /// A collective queued on the communication stream.
    type Work: DeviceWork;

    /// The communicator, for logs and errors: "NCCL", "the stand-in".
    fn name(&self) -> &'static str;

    /// On the backward thread: the flat bucket as device memory, and its ready fence (`path`:
    /// the parameter or user its errors name). Must not wait for the device.
    fn stage<I: Backend>(
        &self,
        flat: FlatTensor<I>,
        path: &str,
    ) -> Result<(Self::Memory, Self::Fence), DdpError>;

    /// On the issuing thread: blocks until `fence` has completed.
    fn wait_ready(&self, fence: Self::Fence) -> Result<(), String>;

    /// On a thread that must not hang (ZeRO's and FSDP's callers, [`DeviceShards`]): waits
    /// until every one of `fences` has completed, or until `deadline`, whichever comes first,
    /// even when a kernel never ends (a hung GPU), so that the caller can fail in its place.
    /// [`Readiness::Pending`] leaves the kernels running: the memory they produce may still be
    /// written.
    fn wait_ready_until(
        &self,
        fences: Vec<Self::Fence>,
        deadline: Instant,
    ) -> Result<Readiness, String>;

    /// Queues `collective` on the communication stream, after every collective queued before
    /// it, and returns at once (on the issuing thread for DDP's buckets and FSDP's units).
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] only when nothing was queued.
    fn queue(
        &self,
        collective: DeviceCollective<'_, Self::Memory>,
        label: CollectiveLabel,
    ) -> Result<Self::Work, CommError>;

    /// The communicator's failure, if it has failed.
    fn check(&self) -> Result<(), CommError>;

    /// Fails the communicator from any thread; its peers learn it. Returns the error.
    fn abort(&self, reason: &str) -> CommError;

    /// After its collective: the reduced flat bucket as a tensor on `device` again.
    fn unstage<I: Backend>(
        &self,
        memory: Self::Memory,
        device: &I::Device,
    ) -> Result<FloatTensor<I>, DdpError>;
}

/// A flat tensor for [`ReductionDevice::stage`], and what its collective reads and writes of
/// it: `len` elements of `dtype`.
pub(crate) struct FlatTensor<I: Backend> {
    pub(crate) tensor: FloatTensor<I>,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl<I: Backend> FlatTensor<I> {
    /// `len` f32 elements: what ZeRO's and FSDP's collectives move.
    pub(crate) fn f32(tensor: FloatTensor<I>, len: usize) -> FlatTensor<I> {
        FlatTensor {
            tensor,
            len,
            dtype: DType::F32,
        }
    }
}

/// A collective over staged memory, as [`ReductionDevice::queue`] queues it. The two buffers of
/// a reduce-scatter or an all-gather were both staged, in one dtype, and are distinct.
pub(crate) enum DeviceCollective<'a, M> {
    /// The in-place average of the memory across the ranks (DDP's buckets).
    AllReduce(&'a M),
    /// The average of every rank's `send` (`world` blocks of `recv`'s length) into `recv`,
    /// this rank's block (ZeRO stage 2's gradients, FSDP's units).
    ReduceScatter { send: &'a M, recv: &'a M },
    /// Every rank's `send` gathered into `recv`, rank `r`'s at `r * send`'s length (ZeRO
    /// stage 2's parameters, FSDP's chunks).
    AllGather { send: &'a M, recv: &'a M },
}

impl<M> DeviceCollective<'_, M> {
    /// The collective's name, for labels and errors: `all_reduce`, `reduce_scatter`,
    /// `all_gather`.
    pub(crate) fn op(&self) -> &'static str {
        match self {
            DeviceCollective::AllReduce(_) => "all_reduce",
            DeviceCollective::ReduceScatter { .. } => "reduce_scatter",
            DeviceCollective::AllGather { .. } => "all_gather",
        }
    }
}

/// How a [`ReductionDevice::wait_ready_until`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Every fence completed: the kernels that produced the memory have run.
    Ready,
    /// The deadline came first: those kernels may still be running.
    Pending,
}

/// A collective's done event.
pub(crate) trait DeviceWork: Send + 'static {
    /// Blocks until the collective has finished on the device, or the communicator failed.
    fn wait(self) -> Result<WorkTiming, CommError>;
}

fn internal(what: impl std::fmt::Display) -> DdpError {
    DdpError::Internal(format!("device bucket reduction: {what}"))
}

#[cfg(test)]
mod tests;
