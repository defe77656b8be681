//! [`NcclDevice`]: the device engine on a GPU: cubecl buffers of burn's CUDA backend, reduced
//! in place by the process group's NCCL backend on its own stream.
//!
//! Both of burn's CUDA backends are reduced: the unfused `CubeBackend` (our workspace's build)
//! and `Fusion<CubeBackend>`, what `burn::backend::Cuda` is with burn's default features. A
//! fused bucket is resolved to its cubecl tensor (the fusion server runs what is queued for it,
//! on the calling thread's stream, without waiting for the GPU), reduced the same way, and
//! registered back as a fused tensor (an `Init` operation, as burn-fusion's `from_data` does).
//!
//! A bucket's memory is the flat cubecl tensor and its device address; its ready fence is
//! `client.sync()` called on the backward thread (an event on that thread's stream, returned
//! at once; cubecl 0.10 offers no stream for NCCL's to wait on); its done event is
//! [`NcclWork`], whose end event the group's watchdog polls. The gradients handed to the
//! optimizer are views of the flat tensor (a gradient whose size is not a multiple of 512
//! bytes is copied out by burn). Nothing crosses to the host.

use super::waiter::BlockingWaiter;
use super::{DeviceCollective, DeviceWork, FlatTensor, Readiness, ReductionDevice, internal};
use crate::error::DdpError;
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::client::GlobalFusionClient;
use burn_fusion::stream::OperationStreams;
use burn_fusion::{FusionTensor, NoOp};
use burn_ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::future::DynFut;
use cubecl::server::ServerError;
use ddp_comm::watchdog::CollectiveLabel;
use ddp_comm::{CommError, NcclBackend, NcclDtype, NcclWork, ProcessGroup, ReduceOp, WorkTiming};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// A tensor of `Fusion<CubeBackend<CudaRuntime, ..>>`, whatever its element types.
type FusedCudaTensor = FusionTensor<FusionCubeRuntime<CudaRuntime>>;

/// The inner backend a fused CUDA tensor resolves to: its float primitive is a
/// `CubeTensor<CudaRuntime>` whatever the element types (a tensor carries its own dtype).
type CubeCuda = CubeBackend<CudaRuntime, f32, i32, u8>;

/// How burn's CUDA backend `I` holds its float tensors, if it is one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CudaTensors {
    /// `CubeBackend<CudaRuntime, ..>`: the cubecl tensor itself.
    Unfused,
    /// `Fusion<CubeBackend<CudaRuntime, ..>>`: a handle in burn-fusion's server.
    Fused,
}

impl CudaTensors {
    /// Which of burn's CUDA backends `I` is, or `None` for any other backend.
    pub(crate) fn of<I: Backend>() -> Option<CudaTensors> {
        let float = std::any::TypeId::of::<FloatTensor<I>>();
        if float == std::any::TypeId::of::<CubeTensor<CudaRuntime>>() {
            Some(CudaTensors::Unfused)
        } else if float == std::any::TypeId::of::<FusedCudaTensor>() {
            Some(CudaTensors::Fused)
        } else {
            None
        }
    }
}

/// The process group's NCCL backend on the model's CUDA device.
#[derive(Clone)]
pub(crate) struct NcclDevice {
    nccl: NcclBackend,
    /// Waits for the ready fences that must end at a deadline (`wait_ready_until`): a cubecl
    /// fence blocks its thread until the GPU reaches it.
    fences: Arc<BlockingWaiter>,
}

/// A flat bucket in cubecl's memory, with its device address and what NCCL reduces of it.
pub(crate) struct CubeBucket {
    /// Referenced only here until NCCL is done with it: cubecl's pool cannot reuse it.
    cube: CubeTensor<CudaRuntime>,
    ptr: u64,
    len: usize,
    dtype: NcclDtype,
}

impl NcclDevice {
    /// The process group's own NCCL backend on CUDA device `device` (the model's), as
    /// PyTorch's DDP reduces through its group's ProcessGroupNCCL.
    ///
    /// # Collective
    /// Every rank of `pg` calls it.
    pub(crate) fn new(pg: &ProcessGroup, device: usize) -> Result<NcclDevice, DdpError> {
        let nccl = pg.nccl(device).map_err(DdpError::comm(
            "creating the process group's NCCL backend for the gradient buckets",
        ))?;
        tracing::info!(
            rank = pg.rank(),
            device,
            group = nccl.name(),
            "gradient buckets are all-reduced by NCCL"
        );
        Ok(NcclDevice {
            nccl,
            fences: Arc::new(BlockingWaiter::new(format!("ddp-fence-{}", pg.rank()))),
        })
    }

    /// The CUDA device ordinal of `device` when `I` is one of burn's CUDA backends (fused or
    /// not), whose tensors this device reduces in place.
    pub(crate) fn cuda_device<I: Backend>(device: &I::Device) -> Option<usize> {
        CudaTensors::of::<I>()?;
        let device = (device as &dyn Any).downcast_ref::<CudaDevice>()?;
        Some(device.index)
    }
}

fn nccl_dtype(dtype: DType) -> Option<NcclDtype> {
    Some(match dtype {
        DType::F32 => NcclDtype::F32,
        DType::F64 => NcclDtype::F64,
        DType::F16 => NcclDtype::F16,
        DType::BF16 => NcclDtype::BF16,
        _ => return None,
    })
}

impl DeviceWork for NcclWork {
    fn wait(self) -> Result<WorkTiming, CommError> {
        NcclWork::wait(self)
    }
}

impl ReductionDevice for NcclDevice {
    type Memory = CubeBucket;
    type Fence = DynFut<Result<(), ServerError>>;
    type Work = NcclWork;

    fn name(&self) -> &'static str {
        "NCCL"
    }

    fn stage<I: Backend>(
        &self,
        flat: FlatTensor<I>,
        path: &str,
    ) -> Result<(CubeBucket, Self::Fence), DdpError> {
        let FlatTensor {
            tensor: flat,
            len,
            dtype,
        } = flat;
        let nccl_type = nccl_dtype(dtype).ok_or_else(|| DdpError::Gradient {
            path: path.to_string(),
            reason: format!("NCCL cannot reduce {dtype:?}"),
        })?;
        let mut cube = into_cube::<I>(flat)?;
        // In place only on memory nothing else references (a lone gradient may share its
        // buffer with another tensor of the graph), laid out as the flat bucket.
        if !(cube.can_mut() && cube.is_contiguous()) {
            cube = cube.copy();
        }
        // NCCL reads and writes `len` elements of `dtype`: the buffer must hold them (cubecl
        // rounds allocations up, so it may hold more).
        let usable = cube.handle.size_in_used() as usize; // from the view's start
        if cube.dtype != dtype || usable < len * dtype.size() {
            return Err(internal(format!(
                "the flat bucket holds {usable} bytes of {:?}, expected {len} elements of \
                 {dtype:?}",
                cube.dtype
            )));
        }
        let ptr = cube
            .client
            .get_resource(cube.handle.clone())
            .map_err(|e| internal(format!("locating the bucket's memory: {e:?}")))?
            .resource()
            .ptr;
        let ready = cube.client.sync();
        let bucket = CubeBucket {
            cube,
            ptr,
            len,
            dtype: nccl_type,
        };
        Ok((bucket, ready))
    }

    fn wait_ready(&self, fence: Self::Fence) -> Result<(), String> {
        cubecl::future::block_on(fence).map_err(|e| format!("{e:?}"))
    }

    fn wait_ready_until(
        &self,
        fences: Vec<Self::Fence>,
        deadline: Instant,
    ) -> Result<Readiness, String> {
        // The first poll of a cubecl fence blocks in `cuEventSynchronize`, and cubecl exposes
        // neither the event nor a query: the waiter's thread blocks in it instead of the
        // caller, for one hand-off per collective (both fences in one job).
        self.fences.wait_until(deadline, move || {
            for fence in fences {
                cubecl::future::block_on(fence).map_err(|e| format!("{e:?}"))?;
            }
            Ok(())
        })
    }

    fn queue(
        &self,
        collective: DeviceCollective<'_, CubeBucket>,
        label: CollectiveLabel,
    ) -> Result<NcclWork, CommError> {
        let (nccl, avg) = (&self.nccl, ReduceOp::Avg);
        let world = nccl.world_size();
        match collective {
            // SAFETY: `ptr` is the start of `cube`'s buffer, at least `len` contiguous elements
            // of `dtype` (checked in `stage`) on the model's device (the group's device, chosen
            // from it); `cube` is referenced only by the bucket (can_mut, or a fresh copy) and
            // is kept, by the pending bucket or by `Issued`'s drop, until the all-reduce is
            // known to have finished (or forever), so nothing else reads, writes or reuses the
            // memory meanwhile; the compute stream finished writing it (the ready fence, waited
            // for before this call by the issuing thread).
            DeviceCollective::AllReduce(m) => unsafe {
                nccl.all_reduce_raw_async(m.ptr, m.len, m.dtype, avg, label)
            },
            DeviceCollective::ReduceScatter { send, recv } => {
                check_blocks(collective.op(), recv, send, world)?;
                // SAFETY: as for an all-reduce, for both buffers (each staged, referenced only
                // by its bucket, kept until the collective is known to have finished, on the
                // group's device, produced before the ready fences the caller waited for);
                // their sizes are checked above and in `stage`; two stagings are two
                // allocations, so they do not overlap.
                let (from, to) = (send.ptr, recv.ptr);
                unsafe { nccl.reduce_scatter_raw_async(from, to, recv.len, recv.dtype, avg, label) }
            }
            DeviceCollective::AllGather { send, recv } => {
                check_blocks(collective.op(), send, recv, world)?;
                // SAFETY: as for a reduce-scatter above.
                unsafe {
                    nccl.all_gather_raw_async(send.ptr, recv.ptr, send.len, send.dtype, label)
                }
            }
        }
    }

    fn check(&self) -> Result<(), CommError> {
        self.nccl.check()
    }

    fn abort(&self, reason: &str) -> CommError {
        self.nccl.abort(reason)
    }

    fn unstage<I: Backend>(
        &self,
        memory: CubeBucket,
        device: &I::Device,
    ) -> Result<FloatTensor<I>, DdpError> {
        let boxed: Box<dyn Any> = match CudaTensors::of::<I>() {
            Some(CudaTensors::Fused) => {
                let device = (device as &dyn Any)
                    .downcast_ref::<CudaDevice>()
                    .ok_or_else(|| internal("a fused CUDA tensor off a CUDA device"))?;
                Box::new(into_fused(memory.cube, device))
            }
            _ => Box::new(memory.cube),
        };
        boxed.downcast::<FloatTensor<I>>().map(|b| *b).map_err(|_| {
            internal(format!(
                "the bucket is no longer a {}",
                std::any::type_name::<FloatTensor<I>>()
            ))
        })
    }
}

/// `whole` must hold `world` blocks of `block`'s length, in `block`'s dtype.
fn check_blocks(
    op: &'static str,
    block: &CubeBucket,
    whole: &CubeBucket,
    world: usize,
) -> Result<(), CommError> {
    if block.dtype == whole.dtype && whole.len == block.len * world {
        return Ok(());
    }
    Err(CommError::InvalidArgument {
        op,
        reason: format!(
            "{} elements of {:?} are not {world} blocks of {} elements of {:?}",
            whole.len, whole.dtype, block.len, block.dtype
        ),
    })
}

/// The cubecl tensor of a tensor of either CUDA backend. A fused one is resolved: the fusion
/// server runs what is queued for it (on this thread's stream) and hands over its buffer.
fn into_cube<I: Backend>(t: FloatTensor<I>) -> Result<CubeTensor<CudaRuntime>, DdpError> {
    let boxed: Box<dyn Any> = Box::new(t);
    let boxed = match boxed.downcast::<CubeTensor<CudaRuntime>>() {
        Ok(cube) => return Ok(*cube),
        Err(other) => other,
    };
    match boxed.downcast::<FusedCudaTensor>() {
        Ok(fused) => {
            let client = fused.client.clone();
            Ok(client.resolve_tensor_float::<CubeCuda>(*fused))
        }
        Err(_) => Err(internal(format!(
            "expected burn's CUDA tensors, got {}",
            std::any::type_name::<FloatTensor<I>>()
        ))),
    }
}

/// A cubecl tensor registered with `device`'s fusion server as a fused tensor: an `Init`
/// operation over its handle, as burn-fusion's own `float_from_data` registers a new buffer.
fn into_fused(cube: CubeTensor<CudaRuntime>, device: &CudaDevice) -> FusedCudaTensor {
    let client = GlobalFusionClient::<FusionCubeRuntime<CudaRuntime>>::load(device);
    let shape = cube.meta.shape().clone();
    let dtype = cube.dtype;
    let handle = <CubeCuda as BackendIr>::float_tensor_handle(cube);
    let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(
            OperationStreams::default(),
            OperationIr::Init(init),
            NoOp::<CubeCuda>::new(),
        )
        .output()
}

/// The NCCL engine is the device engine's protocol over [`NcclDevice`], nothing of its own:
/// this fails to compile if it stops being one.
pub(crate) type NcclReduction = super::DeviceReduction<NcclDevice>;

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn_fusion::Fusion;

    /// Which backends the NCCL engine reduces on the device: both of burn's CUDA backends,
    /// whatever their element types, and nothing else (a model on any other backend, or on a
    /// GPU backend of another runtime, goes through host memory, with a warning). No GPU needed:
    /// it is decided from types alone.
    #[test]
    fn both_cuda_backends_are_reduced_on_the_device_and_no_other() {
        type Unfused = CubeBackend<CudaRuntime, f32, i32, u8>;
        type UnfusedHalf = CubeBackend<CudaRuntime, burn::tensor::bf16, i64, u32>;
        assert_eq!(CudaTensors::of::<Unfused>(), Some(CudaTensors::Unfused));
        assert_eq!(CudaTensors::of::<UnfusedHalf>(), Some(CudaTensors::Unfused));
        assert_eq!(
            CudaTensors::of::<Fusion<Unfused>>(),
            Some(CudaTensors::Fused)
        );
        assert_eq!(
            CudaTensors::of::<Fusion<UnfusedHalf>>(),
            Some(CudaTensors::Fused)
        );
        assert!(CudaTensors::of::<burn::backend::Cuda>().is_some());
        assert_eq!(CudaTensors::of::<Flex>(), None);
        let gpu = CudaDevice::new(1);
        assert_eq!(NcclDevice::cuda_device::<Fusion<Unfused>>(&gpu), Some(1));
        assert_eq!(NcclDevice::cuda_device::<Unfused>(&gpu), Some(1));
        assert_eq!(NcclDevice::cuda_device::<Flex>(&Default::default()), None);
    }
}
