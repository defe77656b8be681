//! ZeRO stage 2's collectives on the device: the gradients' reduce-scatter and the parameters'
//! all-gather through the device seam ([`ReductionDevice`]) that DDP's buckets use, so that on
//! GPUs with NCCL neither crosses to the host, and the CPU stand-in runs the same code on
//! machines without GPUs ([`Collectives::StandIn`]).
//!
//! Each collective stages its send buffer and a zeroed receive buffer on the calling thread,
//! waits for both ready fences, queues the collective on the communicator's stream after
//! everything queued before it, and waits for its done event (bounded by the communicator's
//! watchdog). Memory a failed collective may still write is never given back.

use super::error::ZeroError;
use crate::Collectives;
use crate::ddp::reducer::{DeviceWork, ReductionDevice, StandInDevice};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use ddp_comm::ProcessGroup;
use ddp_comm::watchdog::CollectiveLabel;
use std::sync::Arc;

/// Stage 2's two collectives on one communicator, for tensors of backend `I`.
pub(crate) trait ShardCollectives<I: Backend>: Send + Sync {
    /// The communicator, for errors: "NCCL", "the stand-in".
    fn name(&self) -> &'static str;

    /// `send` holds `world` blocks of `block` f32 elements: returns block `rank` of their
    /// average over the ranks.
    fn reduce_scatter(&self, send: Tensor<I, 1>, block: usize) -> Result<Tensor<I, 1>, ZeroError>;

    /// Every rank's `send` (the same length on each), rank `r`'s at `r * send.len()`.
    fn all_gather(&self, send: Tensor<I, 1>) -> Result<Tensor<I, 1>, ZeroError>;
}

/// [`ShardCollectives`] over a [`ReductionDevice`].
struct DeviceShards<D> {
    device: D,
    world: usize,
}

enum Op {
    ReduceScatter,
    AllGather,
}

impl<D: ReductionDevice> DeviceShards<D> {
    /// Stages `send` and a zeroed receive buffer of `recv_len`, runs `op` and returns the
    /// receive buffer.
    fn run<I: Backend>(
        &self,
        op: Op,
        send: Tensor<I, 1>,
        recv_len: usize,
    ) -> Result<Tensor<I, 1>, ZeroError> {
        let what = match op {
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        };
        let fail = |reason: String| ZeroError::Device {
            communicator: self.device.name(),
            op: what,
            reason,
        };
        let device = send.device();
        let dtype = send.dtype();
        if dtype != DType::F32 {
            return Err(fail(format!(
                "ZeRO stage 2 moves f32 values; got {dtype:?}"
            )));
        }
        let send_len = send.dims()[0];
        let recv = Tensor::<I, 1>::zeros([recv_len], &device);
        let path = "ZeRO stage 2";
        let staged = |t: Tensor<I, 1>, len: usize| {
            self.device
                .stage::<I>(t.into_primitive().tensor(), len, DType::F32, path)
                .map_err(|e| fail(e.to_string()))
        };
        let (send_memory, send_ready) = staged(send, send_len)?;
        let (recv_memory, recv_ready) = staged(recv, recv_len)?;
        for ready in [send_ready, recv_ready] {
            self.device.wait_ready(ready).map_err(&fail)?;
        }
        let label = CollectiveLabel::new(what);
        let queued = match op {
            Op::ReduceScatter => self
                .device
                .reduce_scatter(&send_memory, &recv_memory, label),
            Op::AllGather => self.device.all_gather(&send_memory, &recv_memory, label),
        };
        // Nothing was queued on an error here: the memory may go.
        let work = queued.map_err(|e| fail(e.to_string()))?;
        match work.wait() {
            Ok(_) => {
                drop(send_memory);
                let recv = self
                    .device
                    .unstage::<I>(recv_memory, &device)
                    .map_err(|e| fail(e.to_string()))?;
                Ok(Tensor::from_primitive(TensorPrimitive::Float(recv)))
            }
            Err(e) => {
                // Queued and failed: the device may still be writing these (an abort that did
                // not return in time): never give them back. Training ends with this error.
                std::mem::forget(send_memory);
                std::mem::forget(recv_memory);
                Err(fail(e.to_string()))
            }
        }
    }
}

impl<I: Backend, D: ReductionDevice> ShardCollectives<I> for DeviceShards<D> {
    fn name(&self) -> &'static str {
        self.device.name()
    }

    fn reduce_scatter(&self, send: Tensor<I, 1>, block: usize) -> Result<Tensor<I, 1>, ZeroError> {
        self.run(Op::ReduceScatter, send, block)
    }

    fn all_gather(&self, send: Tensor<I, 1>) -> Result<Tensor<I, 1>, ZeroError> {
        let len = send.dims()[0] * self.world;
        self.run(Op::AllGather, send, len)
    }
}

/// The device communicator that `collectives` asks stage 2 to use for a model on `device`, or
/// `None` for the process group's CPU transports (through host memory).
///
/// # Collective
/// Every rank calls it, with the same `collectives`.
pub(crate) fn shard_collectives<I: Backend>(
    pg: &ProcessGroup,
    collectives: Collectives,
    device: &I::Device,
) -> Result<Option<Arc<dyn ShardCollectives<I>>>, ZeroError> {
    let world = pg.world_size();
    let setup = |e: crate::DdpError| ZeroError::Setup(e);
    match collectives {
        Collectives::Host => Ok(None),
        Collectives::StandIn => Ok(Some(Arc::new(DeviceShards {
            device: StandInDevice::new(pg).map_err(setup)?,
            world,
        }))),
        Collectives::Nccl | Collectives::Auto => {
            nccl::shard_collectives::<I>(pg, collectives, device)
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod nccl {
    use super::*;

    /// Built without NCCL: only a request for it is an error.
    pub(super) fn shard_collectives<I: Backend>(
        _pg: &ProcessGroup,
        collectives: Collectives,
        _device: &I::Device,
    ) -> Result<Option<Arc<dyn ShardCollectives<I>>>, ZeroError> {
        match collectives {
            Collectives::Nccl => Err(ZeroError::Setup(crate::DdpError::InvalidConfig(
                "ZeRO stage 2 with Collectives::Nccl needs ddp-core built with its `cuda` \
                 feature (cargo build --features cuda); or use Collectives::Auto or Host"
                    .into(),
            ))),
            _ => Ok(None),
        }
    }
}

#[cfg(feature = "cuda")]
mod nccl {
    use super::*;
    use crate::ddp::reducer::NcclDevice;

    /// NCCL on the model's GPU when it is on burn's CUDA backend and every rank can run it
    /// (asked for, or `Auto` above world size 1); otherwise the host path, or an error when
    /// NCCL was asked for.
    pub(super) fn shard_collectives<I: Backend>(
        pg: &ProcessGroup,
        collectives: Collectives,
        device: &I::Device,
    ) -> Result<Option<Arc<dyn ShardCollectives<I>>>, ZeroError> {
        let refuse = |why: String| {
            Err(ZeroError::Setup(crate::DdpError::InvalidConfig(format!(
                "ZeRO stage 2 with Collectives::Nccl: {why}; use Collectives::Auto or Host to \
                 go through host memory instead"
            ))))
        };
        let cuda = NcclDevice::cuda_device::<I>(device);
        let ordinal = match (collectives, cuda) {
            (Collectives::Nccl, None) => {
                return refuse(format!(
                    "NCCL reduces buffers of burn's unfused CUDA backend in place; this model's \
                     tensors are {}",
                    std::any::type_name::<burn::tensor::ops::FloatTensor<I>>()
                ));
            }
            (Collectives::Auto, None) => return Ok(None),
            (Collectives::Auto, Some(_)) if pg.world_size() == 1 => return Ok(None),
            (_, Some(d)) => d,
        };
        match crate::ddp::nccl_can_run(pg, ordinal).map_err(ZeroError::Setup)? {
            Ok(()) => Ok(Some(Arc::new(DeviceShards {
                device: NcclDevice::new(pg, ordinal).map_err(ZeroError::Setup)?,
                world: pg.world_size(),
            }))),
            Err(why) if collectives == Collectives::Nccl => refuse(why),
            Err(why) => {
                tracing::warn!(
                    rank = pg.rank(),
                    "{why}; ZeRO stage 2's collectives go through host memory"
                );
                Ok(None)
            }
        }
    }
}
