//! Which communicator carries ZeRO stage 2's reduce-scatters and all-gathers: a device one
//! (NCCL on GPUs, or its CPU stand-in, [`Collectives::StandIn`]), through the seam DDP's
//! buckets use ([`ShardCollectives`]), or the process group's CPU transports.

use super::error::ZeroError;
use crate::Collectives;
use crate::engine::reducer::{
    DeviceChoice, DeviceShards, ShardCollectives, ShardError, choose_device,
};
use burn::tensor::backend::Backend;
use ddp_comm::ProcessGroup;
use std::sync::Arc;

impl From<ShardError> for ZeroError {
    fn from(e: ShardError) -> Self {
        ZeroError::Device {
            communicator: e.communicator,
            op: e.op,
            reason: e.reason,
        }
    }
}

/// The device communicator that `collectives` asks stage 2 to use for a model on `device`
/// ([`choose_device`]), or `None` for the process group's CPU transports.
///
/// # Collective
/// Every rank calls it, with the same `collectives`.
pub(crate) fn shard_collectives<I: Backend>(
    pg: &ProcessGroup,
    collectives: Collectives,
    device: &I::Device,
) -> Result<Option<Arc<dyn ShardCollectives<I>>>, ZeroError> {
    let (world, timeout) = (pg.world_size(), pg.timeout());
    Ok(
        match choose_device::<I>(pg, collectives, device, "ZeRO stage 2")
            .map_err(ZeroError::Setup)?
        {
            DeviceChoice::Host => None,
            DeviceChoice::StandIn(device) => Some(Arc::new(DeviceShards {
                device,
                world,
                timeout,
                user: "ZeRO stage 2",
            })),
            #[cfg(feature = "cuda")]
            DeviceChoice::Nccl(device) => Some(Arc::new(DeviceShards {
                device,
                world,
                timeout,
                user: "ZeRO stage 2",
            })),
        },
    )
}
