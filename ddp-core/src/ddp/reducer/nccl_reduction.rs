//! [`NcclReduction`]: buckets all-reduced by NCCL on the GPU, in place, while backward goes on.
//!
//! A full bucket's gradients are concatenated on the device into one flat tensor
//! ([`flatten`], each gradient at a 512-byte boundary); NCCL averages that tensor's memory in
//! place on its own stream; the gradients handed to the optimizer are slices of it
//! ([`unflatten`]: views, except for a gradient whose size is not a multiple of 512 bytes,
//! which burn's CUDA backend copies out). Nothing crosses to the host.
//!
//! # Ordering between the streams
//! cubecl 0.10 does not expose the CUDA stream its kernels run on (one per thread), so NCCL's
//! stream cannot wait on an event of ours. What cubecl does give is `client.sync()`: called on
//! a thread, it records an event on that thread's stream and returns a future at once. So
//! [`BucketReduction::launch`], on the backward thread, takes the flat bucket's device address and
//! that future (the "ready fence": every kernel that produced the bucket is before it), hands
//! both to the reduction's issuing thread and returns. That thread waits on the host for the
//! fence only, then queues the all-reduce on the NCCL group's stream. Only the issuing thread
//! blocks; backward goes on queueing kernels, and nothing syncs the whole device. [`PendingBucket::wait`]
//! returns once the all-reduce has finished on the GPU, so every later kernel that reads the
//! slices sees the reduced values. That wait ends early when the group fails (the watchdog
//! bounds every NCCL call), and when the issuing thread has waited for the GPU longer than the
//! process group's timeout (a kernel that never ends): see [`nccl_issuer`](super::nccl_issuer).
//!
//! # Memory
//! The flat tensor is kept, unchanged and referenced only here, until NCCL is done: cubecl's
//! pool cannot hand its memory to another tensor meanwhile, and no kernel reads or writes it.
//! When the all-reduce fails it is never released (NCCL may still be writing it).
//! It is a new tensor each step, which cubecl's pool serves from the memory the previous
//! step's bucket returned. PyTorch's `gradient_as_bucket_view` goes further (autograd writes
//! gradients straight into the bucket, saving the concatenation); burn allocates every
//! gradient itself, so one device copy per gradient remains.

use super::flat_bucket::{FlatLayout, flatten, unflatten};
use super::nccl_issuer::{GpuWait, Issue, Issued, Issuer};
use super::reduction::{BucketReduction, Held, PendingBucket, Reduced, Slot};
use crate::error::DdpError;
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use ddp_comm::{NcclBackend, NcclDtype, ProcessGroup, WorkTiming};
use std::any::Any;
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// How often a bucket's wait for the issuing thread checks the group and the GPU wait.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Gradients stay on the GPU; buckets are averaged by NCCL.
pub(crate) struct NcclReduction {
    /// The issuing thread, which waits for each bucket's kernels and queues its all-reduce;
    /// stopped on drop. The communicator itself is the process group's and lives as long as
    /// the group.
    issuer: Issuer,
    /// The group too, to abort it from DDP's thread when a step fails.
    nccl: NcclBackend,
    /// How long the issuing thread may wait for the GPU (the process group's timeout).
    timeout: Duration,
}

impl Drop for NcclReduction {
    fn drop(&mut self) {
        self.issuer.stop(&self.nccl, self.timeout);
    }
}

impl NcclReduction {
    /// Reduces through `pg`'s NCCL backend on CUDA device `device` (the model's).
    ///
    /// # Collective
    /// Every rank of `pg` calls it.
    pub(crate) fn new(pg: &ProcessGroup, device: usize) -> Result<NcclReduction, DdpError> {
        // The process group's own NCCL backend (created by the first DDP on this group, kept
        // with the group), as PyTorch's DDP reduces through its group's ProcessGroupNCCL.
        let nccl = pg.nccl(device).map_err(DdpError::comm(
            "creating the process group's NCCL backend for the gradient buckets",
        ))?;
        tracing::info!(
            rank = pg.rank(),
            device,
            group = nccl.name(),
            "gradient buckets are all-reduced by NCCL"
        );
        let issuer = Issuer::start(nccl.clone(), pg.rank())?;
        Ok(NcclReduction {
            issuer,
            nccl,
            timeout: pg.timeout(),
        })
    }

    /// The CUDA device ordinal of `device` when it is burn's CUDA backend's device type and the
    /// backend's tensors are the ones this reduction reduces in place.
    pub(crate) fn cuda_device<I: Backend>(device: &I::Device) -> Option<usize> {
        let is_cube = std::any::TypeId::of::<FloatTensor<I>>()
            == std::any::TypeId::of::<CubeTensor<CudaRuntime>>();
        let device = (device as &dyn Any).downcast_ref::<CudaDevice>()?;
        is_cube.then_some(device.index)
    }
}

fn internal(what: String) -> DdpError {
    DdpError::Internal(format!("NCCL bucket reduction: {what}"))
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

impl<I: Backend> BucketReduction<I> for NcclReduction {
    fn launch(
        &self,
        bucket: (usize, usize),
        slots: &[&Slot<I>],
        grads: Vec<Option<Held<I>>>,
    ) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
        let first = slots
            .first()
            .ok_or_else(|| internal("empty bucket".into()))?;
        let dtype = nccl_dtype(first.dtype).ok_or_else(|| DdpError::Gradient {
            path: first.path.clone(),
            reason: format!("NCCL cannot reduce {:?}", first.dtype),
        })?;
        let (flat, layout) = flatten(slots, grads)?;
        let mut cube = into_cube::<I>(flat)?;
        // In place only on memory nothing else references (a lone gradient may share its buffer
        // with another tensor of the graph), laid out as the flat bucket.
        if !(cube.can_mut() && cube.is_contiguous()) {
            cube = cube.copy();
        }
        let len = layout.len;
        // NCCL reads and writes `len` elements of `dtype`: the buffer must hold them (cubecl
        // rounds allocations up, so it may hold more).
        let usable = cube.handle.size_in_used() as usize; // from the view's start
        if cube.dtype != first.dtype || usable < len * first.dtype.size() {
            return Err(internal(format!(
                "the flat bucket holds {usable} bytes of {:?}, expected {len} elements of {:?}",
                cube.dtype, first.dtype
            )));
        }
        // On this (the backward) thread: the address, and the fence after the bucket's kernels
        // on this thread's stream. Neither waits for the GPU.
        let ptr = cube
            .client
            .get_resource(cube.handle.clone())
            .map_err(|e| internal(format!("locating the bucket's memory: {e:?}")))?
            .resource()
            .ptr;
        let ready = cube.client.sync();
        let (reply, issued) = mpsc::channel();
        let job = Issue {
            cube,
            ptr,
            ready,
            len,
            dtype,
            bucket: bucket.0,
            path: first.path.clone(),
            reply,
        };
        self.issuer.send(job).map_err(internal)?;
        Ok(Box::new(InFlight {
            issued: Some(issued),
            layout,
            nccl: self.nccl.clone(),
            gpu_wait: self.issuer.gpu_wait.clone(),
            timeout: self.timeout,
        }))
    }

    fn abort(&self, reason: &str) {
        // The peers' watchdogs read `reason` from the store (every second) and abort too.
        let e = self.nccl.abort(reason);
        tracing::debug!(error = %e, "aborted the NCCL group of the gradient buckets");
    }
}

/// A bucket NCCL is reducing: its memory comes back with the all-reduce, and is kept until that
/// is done.
struct InFlight {
    issued: Option<mpsc::Receiver<Issued>>,
    layout: FlatLayout,
    /// To give up as soon as the group has failed.
    nccl: NcclBackend,
    /// To give up, failing the group, once the issuing thread has waited for the GPU longer
    /// than `timeout`.
    gpu_wait: Arc<GpuWait>,
    timeout: Duration,
}

impl InFlight {
    fn finish(&mut self) -> Result<(CubeTensor<CudaRuntime>, WorkTiming), DdpError> {
        let issued = self
            .issued
            .take()
            .ok_or_else(|| internal("waited twice".into()))?;
        // The issuing thread answers once the GPU has produced the bucket (and every bucket
        // before it) and NCCL has queued it. Its NCCL calls are bounded by the group's
        // watchdog; its wait for the GPU by the check here. On giving up, a reply that still
        // comes is dropped with `issued`, which frees the memory only if NCCL finished.
        let answer = loop {
            match issued.recv_timeout(WAIT_SLICE) {
                Ok(answer) => break answer,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(internal("the issuing thread ended".into()));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = self.nccl.check() {
                        return Err(all_reduce_failed(e));
                    }
                    if let Some((bucket, waited)) = self.gpu_wait.longer_than(self.timeout) {
                        let reason = format!(
                            "the GPU has not finished the kernels that produce gradient bucket \
                             {bucket} after {waited:?} (the timeout is {:?}): a kernel that \
                             never ends?",
                            self.timeout
                        );
                        return Err(all_reduce_failed(self.nccl.abort(&reason)));
                    }
                }
            }
        };
        let (cube, work) = answer
            .into_parts()
            .ok_or_else(|| internal("a bucket came back empty".into()))?;
        let work = match work {
            Ok(work) => work,
            Err(not) => return Err(not.release(cube)),
        };
        match work.wait() {
            Ok(timing) => Ok((cube, timing)),
            Err(e) => {
                // Queued and failed: NCCL may still be writing it (an abort that did not
                // return in time): never hand this memory back to cubecl's pool. A failed
                // group ends training, so this leaks the buckets of one step, once.
                std::mem::forget(cube);
                Err(all_reduce_failed(e))
            }
        }
    }
}

fn all_reduce_failed(e: ddp_comm::CommError) -> DdpError {
    DdpError::comm("all-reducing a gradient bucket with NCCL")(e)
}

impl<I: Backend> PendingBucket<I> for InFlight {
    fn wait(mut self: Box<Self>, slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError> {
        let (cube, timing) = self.finish()?;
        let flat = from_cube::<I>(cube)?;
        Ok((unflatten(flat, &self.layout, slots)?, Some(timing)))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // A bucket dropped unwaited (an error elsewhere in this backward): its memory must
        // outlive the collective, so wait for it (bounded by the group's watchdog).
        if self.issued.is_some()
            && let Err(e) = self.finish()
        {
            tracing::warn!(error = %e, "an abandoned NCCL bucket failed");
        }
    }
}

fn into_cube<I: Backend>(t: FloatTensor<I>) -> Result<CubeTensor<CudaRuntime>, DdpError> {
    let boxed: Box<dyn Any> = Box::new(t);
    boxed
        .downcast::<CubeTensor<CudaRuntime>>()
        .map(|b| *b)
        .map_err(|_| {
            internal(format!(
                "expected burn's CUDA tensors, got {}",
                std::any::type_name::<FloatTensor<I>>()
            ))
        })
}

fn from_cube<I: Backend>(t: CubeTensor<CudaRuntime>) -> Result<FloatTensor<I>, DdpError> {
    let boxed: Box<dyn Any> = Box::new(t);
    boxed.downcast::<FloatTensor<I>>().map(|b| *b).map_err(|_| {
        internal(format!(
            "the bucket is no longer a {}",
            std::any::type_name::<FloatTensor<I>>()
        ))
    })
}
