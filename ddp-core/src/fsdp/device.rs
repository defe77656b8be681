//! FSDP's collectives on a device communicator (NCCL on GPUs, or its CPU stand-in,
//! [`crate::Collectives::StandIn`]), through the seam DDP's buckets use:
//! a unit's reduce-scatter is staged on the backward thread and queued, in launch order, by the
//! device engine's issuing thread, as DDP's buckets are; the chunks' all-gathers run on the
//! calling thread. Gradients and parameters stay tensors on the model's device.

use super::error::FsdpError;
use crate::Collectives;
use crate::engine::reducer::{
    BucketReduction, ChunkInFlight, DeviceChoice, DeviceReduction, DeviceShards, ReductionDevice,
    ShardCollectives, ShardError, UnitGradient, choose_device,
};
use crate::error::DdpError;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::ProcessGroup;
use std::sync::Arc;

/// FSDP's collectives on one device communicator, for tensors of backend `I`.
pub(super) trait UnitCollectives<I: Backend>: Send + Sync {
    /// The communicator: "NCCL", "the stand-in".
    fn name(&self) -> &'static str;

    /// On the backward thread: queues the reduce-scatter (`Avg`) of a unit's flat gradient
    /// into this rank's chunk, behind every unit launched before it. Does not wait for the
    /// device.
    fn launch_reduce_scatter(
        &self,
        gradient: UnitGradient<I>,
        device: &I::Device,
    ) -> Result<Box<dyn PendingChunk<I>>, DdpError>;

    /// Every rank's `send` (the same length on each), rank `r`'s at `r * send.len()`.
    fn all_gather(&self, send: Tensor<I, 1>) -> Result<Tensor<I, 1>, ShardError>;

    /// Fails the communicator (peers learn it): a step failed on this rank.
    fn abort(&self, reason: &str);
}

/// A unit's reduce-scatter in flight on the device.
pub(super) trait PendingChunk<I: Backend>: Send {
    /// This rank's averaged chunk, once the collective is done.
    fn wait(self: Box<Self>, device: &I::Device) -> Result<FloatTensor<I>, DdpError>;
}

impl<I: Backend, D: ReductionDevice> PendingChunk<I> for ChunkInFlight<D> {
    fn wait(self: Box<Self>, device: &I::Device) -> Result<FloatTensor<I>, DdpError> {
        ChunkInFlight::wait::<I>(*self, device)
    }
}

/// [`UnitCollectives`] over a [`ReductionDevice`]: its engine (issuing thread) for the
/// reduce-scatters, the same communicator for the all-gathers.
struct DeviceUnits<D: ReductionDevice> {
    engine: DeviceReduction<D>,
    shards: DeviceShards<D>,
}

impl<I: Backend, D: ReductionDevice> UnitCollectives<I> for DeviceUnits<D> {
    fn name(&self) -> &'static str {
        self.shards.device.name()
    }

    fn launch_reduce_scatter(
        &self,
        gradient: UnitGradient<I>,
        device: &I::Device,
    ) -> Result<Box<dyn PendingChunk<I>>, DdpError> {
        let flight = self.engine.launch_reduce_scatter::<I>(gradient, device)?;
        Ok(Box::new(flight))
    }

    fn all_gather(&self, send: Tensor<I, 1>) -> Result<Tensor<I, 1>, ShardError> {
        ShardCollectives::<I>::all_gather(&self.shards, send)
    }

    fn abort(&self, reason: &str) {
        BucketReduction::<I>::abort(&self.engine, reason);
    }
}

fn device_units<I: Backend, D: ReductionDevice>(
    device: D,
    pg: &ProcessGroup,
) -> Result<Arc<dyn UnitCollectives<I>>, DdpError> {
    let engine = DeviceReduction::start(device.clone(), pg.rank(), pg.timeout())?;
    let shards = DeviceShards {
        device,
        world: pg.world_size(),
        timeout: pg.timeout(),
        user: "FSDP",
    };
    Ok(Arc::new(DeviceUnits { engine, shards }))
}

/// The device communicator `collectives` asks FSDP to use for a model on `device`, or `None`
/// for the process group's CPU transports.
///
/// # Collective
/// Every rank calls it, with the same `collectives`.
pub(super) fn unit_collectives<I: Backend>(
    pg: &ProcessGroup,
    collectives: Collectives,
    device: &I::Device,
) -> Result<Option<Arc<dyn UnitCollectives<I>>>, FsdpError> {
    let chosen = choose_device::<I>(pg, collectives, device, "FSDP").map_err(FsdpError::Setup)?;
    let units = match chosen {
        DeviceChoice::Host => return Ok(None),
        DeviceChoice::StandIn(device) => device_units::<I, _>(device, pg),
        #[cfg(feature = "cuda")]
        DeviceChoice::Nccl(device) => device_units::<I, _>(device, pg),
    };
    units.map(Some).map_err(FsdpError::Setup)
}
