//! Collectives on a device communicator, called and waited for on the calling thread: ZeRO
//! stage 2's reduce-scatters and all-gathers, FSDP's all-gathers, through the same seam
//! ([`ReductionDevice`]) as DDP's buckets, so that on GPUs with NCCL nothing crosses to the
//! host, and the CPU stand-in runs the same code on machines without GPUs.
//!
//! Each collective stages its send buffer and a zeroed receive buffer on the calling thread,
//! waits for both ready fences, queues the collective on the communicator's stream after
//! everything queued before it, and waits for its done event (bounded by the communicator's
//! watchdog). The fence wait is bounded by the process group's timeout, as DDP's issuing
//! thread's is: a kernel that never ends fails this rank, naming it, and aborts the
//! communicator so that the peers waiting in the collective fail at once with that reason
//! instead of at their own timeout. Memory a failed collective (or an unfinished kernel) may
//! still write is never given back.

use super::{DeviceCollective, DeviceWork, FlatTensor, Readiness, ReductionDevice};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use ddp_comm::CommError;
use ddp_comm::watchdog::CollectiveLabel;
use std::time::{Duration, Instant};

/// Why a collective on the device failed.
#[derive(Debug)]
pub(crate) struct ShardError {
    /// The communicator: "NCCL", "the stand-in".
    pub(crate) communicator: &'static str,
    /// `reduce_scatter` or `all_gather`.
    pub(crate) op: &'static str,
    pub(crate) reason: String,
}

/// A reduce-scatter and an all-gather of f32 tensors on one device communicator, for tensors
/// of backend `I`.
pub(crate) trait ShardCollectives<I: Backend>: Send + Sync {
    /// The communicator, for errors: "NCCL", "the stand-in".
    fn name(&self) -> &'static str;

    /// `send` holds `world` blocks of `block` f32 elements: returns block `rank` of their
    /// average over the ranks.
    fn reduce_scatter(&self, send: Tensor<I, 1>, block: usize) -> Result<Tensor<I, 1>, ShardError>;

    /// Every rank's `send` (the same length on each), rank `r`'s at `r * send.len()`.
    fn all_gather(&self, send: Tensor<I, 1>) -> Result<Tensor<I, 1>, ShardError>;

    /// Fails the communicator from any thread, so that peers waiting in one of its collectives
    /// fail at once with `reason` (the process group's abort does not reach them).
    fn abort(&self, reason: &str);
}

/// Which collective of a send and a receive buffer [`DeviceShards`] runs.
enum Op {
    ReduceScatter,
    AllGather,
}

/// [`ShardCollectives`] over a [`ReductionDevice`].
pub(crate) struct DeviceShards<D> {
    pub(crate) device: D,
    pub(crate) world: usize,
    /// How long a collective waits for its buffers' ready fences: the process group's
    /// timeout, which bounds its collectives and DDP's fence waits too.
    pub(crate) timeout: Duration,
    /// Who runs these collectives, for errors: "ZeRO stage 2", "FSDP".
    pub(crate) user: &'static str,
}

impl<D: ReductionDevice> DeviceShards<D> {
    /// Stages `send` and a zeroed receive buffer of `recv_len`, runs `op` and returns the
    /// receive buffer.
    fn run<I: Backend>(
        &self,
        op: Op,
        send: Tensor<I, 1>,
        recv_len: usize,
    ) -> Result<Tensor<I, 1>, ShardError> {
        let what = match op {
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        };
        let fail = |reason: String| ShardError {
            communicator: self.device.name(),
            op: what,
            reason,
        };
        let device = send.device();
        let dtype = send.dtype();
        if dtype != DType::F32 {
            return Err(fail(format!(
                "{} moves f32 values; got {dtype:?}",
                self.user
            )));
        }
        let send_len = send.dims()[0];
        let recv = Tensor::<I, 1>::zeros([recv_len], &device);
        let path = self.user;
        let staged = |t: Tensor<I, 1>, len: usize| {
            self.device
                .stage(FlatTensor::<I>::f32(t.into_primitive().tensor(), len), path)
                .map_err(|e| fail(e.to_string()))
        };
        let (send_memory, send_ready) = staged(send, send_len)?;
        let (recv_memory, recv_ready) = staged(recv, recv_len)?;
        let since = Instant::now();
        let ready = self
            .device
            .wait_ready_until(vec![send_ready, recv_ready], since + self.timeout)
            .map_err(&fail)?;
        if ready == Readiness::Pending {
            // The kernels producing both buffers may still write them: never give them back.
            std::mem::forget(send_memory);
            std::mem::forget(recv_memory);
            return Err(fail(self.fence_stuck(what, since.elapsed())));
        }
        let (send, recv) = (&send_memory, &recv_memory);
        let collective = match op {
            Op::ReduceScatter => DeviceCollective::ReduceScatter { send, recv },
            Op::AllGather => DeviceCollective::AllGather { send, recv },
        };
        let queued = self.device.queue(collective, CollectiveLabel::new(what));
        let work = match queued {
            Ok(work) => work,
            Err(e) => {
                // Only a refused argument is certain to come before the communicator's call
                // ([`ReductionDevice`]); any other error may come after NCCL queued the kernel
                // (a deadline or an abort while in progress), which may still write both
                // buffers: never give them back then.
                if !matches!(e, CommError::InvalidArgument { .. }) {
                    std::mem::forget(send_memory);
                    std::mem::forget(recv_memory);
                }
                return Err(fail(e.to_string()));
            }
        };
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

impl<D: ReductionDevice> DeviceShards<D> {
    /// After `waited` for the buffers of `what` (a collective): aborts the communicator, so
    /// the peers already waiting in that collective fail now, with this reason, and says why.
    fn fence_stuck(&self, what: &str, waited: Duration) -> String {
        let reason = format!(
            "this rank's device has not finished the kernels that produce the buffers of its \
             {what} after {waited:.1?} (the timeout is {:?}): a kernel on this device did not \
             finish (hung, or slower than the timeout allows); aborted {} so that its peers \
             fail too",
            self.timeout,
            self.device.name()
        );
        let e = self.device.abort(&reason);
        tracing::error!(
            op = what,
            waited_s = waited.as_secs_f64(),
            communicator = self.device.name(),
            error = %e,
            "a device collective's ready fence did not complete within the timeout"
        );
        reason
    }
}

impl<I: Backend, D: ReductionDevice> ShardCollectives<I> for DeviceShards<D> {
    fn name(&self) -> &'static str {
        self.device.name()
    }

    fn reduce_scatter(&self, send: Tensor<I, 1>, block: usize) -> Result<Tensor<I, 1>, ShardError> {
        self.run(Op::ReduceScatter, send, block)
    }

    fn all_gather(&self, send: Tensor<I, 1>) -> Result<Tensor<I, 1>, ShardError> {
        let len = send.dims()[0] * self.world;
        self.run(Op::AllGather, send, len)
    }

    fn abort(&self, reason: &str) {
        self.device.abort(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::reducer::device::tests::ScriptedDevice;
    use std::sync::atomic::Ordering;

    type B = burn::backend::Flex;

    /// Both buffers' drops after a failed reduce-scatter, and after a failed all-gather.
    fn drops_after_failures(fail: fn() -> CommError) -> [usize; 2] {
        let device = ScriptedDevice::failing(fail);
        let drops = device.drops.clone();
        let shards = DeviceShards {
            device,
            world: 2,
            timeout: Duration::from_secs(60),
            user: "FSDP",
        };
        let device = Default::default();
        let send = || Tensor::<B, 1>::zeros([4], &device);
        let rs = ShardCollectives::<B>::reduce_scatter(&shards, send(), 2);
        assert!(rs.is_err_and(|e| e.op == "reduce_scatter"));
        let after_rs = drops.swap(0, Ordering::SeqCst);
        let ag = ShardCollectives::<B>::all_gather(&shards, send());
        assert!(ag.is_err_and(|e| e.op == "all_gather"));
        [after_rs, drops.load(Ordering::SeqCst)]
    }

    /// A collective call that failed after it may have queued the kernel (NCCL: a deadline
    /// while in progress, an abort under the call): NCCL may still write both buffers, so
    /// neither goes back to the pool.
    #[test]
    fn buffers_of_a_collective_that_may_have_been_queued_are_never_given_back() {
        let aborted = || CommError::Aborted("aborted while queuing".into());
        assert_eq!(drops_after_failures(aborted), [0, 0]);
    }

    /// Errors name the user of the collectives (FSDP uses them too), not ZeRO.
    #[test]
    fn errors_name_who_runs_the_collectives() {
        let refused = || CommError::InvalidArgument {
            op: "all_gather",
            reason: "refused".into(),
        };
        let shards = DeviceShards {
            device: ScriptedDevice::failing(refused),
            world: 2,
            timeout: Duration::from_secs(60),
            user: "FSDP",
        };
        let device = Default::default();
        let f64s = Tensor::<B, 1>::zeros([4], &device).cast(burn::tensor::FloatDType::F64);
        let reason = ShardCollectives::<B>::all_gather(&shards, f64s)
            .expect_err("f64 is refused")
            .reason;
        assert!(reason.starts_with("FSDP moves f32 values"), "{reason}");
    }

    /// A refused argument is certain to come before the call: the buffers may go.
    #[test]
    fn buffers_of_a_refused_collective_are_given_back() {
        let refused = || CommError::InvalidArgument {
            op: "all_gather",
            reason: "refused".into(),
        };
        assert_eq!(drops_after_failures(refused), [2, 2]);
    }
}
