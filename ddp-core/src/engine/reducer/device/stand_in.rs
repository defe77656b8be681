//! [`StandInDevice`]: the device engine on host memory, so that the protocol NCCL runs on GPUs
//! runs, and is tested, at any world size on machines without GPUs.
//!
//! A bucket's memory is a [`StandInBuffer`] read from the flat tensor on the backward thread;
//! its ready fence is completed by that (the producing) thread once the read is done, as a
//! GPU's stream completes an event after the producing kernels; the collective runs on
//! [`StandInComm`]'s communication thread in issue order, supervised by the same watchdog as
//! NCCL's. With ddp-core's `test-hooks` feature, [`FENCE_FAULT_ENV`] delays fences or leaves one
//! never completed, as a slow or hung kernel would.

use super::{DeviceCollective, DeviceWork, FlatTensor, Readiness, ReductionDevice, internal};
use crate::engine::reducer::host_grad::{HostGrad, read_to_host};
use crate::error::DdpError;
use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::stand_in::{StandInBuffer, StandInComm, StandInWork};
use ddp_comm::watchdog::CollectiveLabel;
use ddp_comm::{CommError, ProcessGroup, ReduceOp, WorkTiming, bf16, f16};
use std::sync::mpsc;
#[cfg(feature = "test-hooks")]
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// Test-only (`test-hooks`): `delay:<ms>` completes every fence that long after the bucket
/// was read; `slow:<ms>:<k>` completes fences `0, k, 2k, ...` that long after their bucket was
/// read and the others at once, so that fences complete out of launch order (with `k` buckets
/// a step, the first of each step last); `never:<n>` never completes the fence of this rank's `n`-th bucket (from 0,
/// counting every bucket of every step); `fail:<n>` fails the `n`-th bucket's fence (its wait
/// returns an error, as a failed CUDA event would); `kill:<n>` SIGKILLs this process as its `n`-th bucket
/// is staged (a rank that dies between two buckets); `abort:<n>` aborts the communicator from
/// another thread as the `n`-th bucket is staged, before its fence completes (the buckets
/// before it may still be in flight; the peers are waiting in the `n`-th).
#[cfg(feature = "test-hooks")]
pub(crate) const FENCE_FAULT_ENV: &str = "DDP_TEST_STAND_IN_FENCE";

/// The stand-in communicator, and the fence faults a test asked for.
#[derive(Clone)]
pub(crate) struct StandInDevice {
    comm: StandInComm,
    #[cfg(feature = "test-hooks")]
    fault: fault::FenceFault,
    /// Fences that must never complete: their senders, kept so they never disconnect either.
    #[cfg(feature = "test-hooks")]
    stuck: Arc<Mutex<(usize, Vec<mpsc::Sender<FenceResult>>)>>,
}

/// A flat bucket in host memory, in its parameters' dtype.
pub(crate) enum HostBucket {
    F32(StandInBuffer<f32>),
    F64(StandInBuffer<f64>),
    F16(StandInBuffer<f16>),
    BF16(StandInBuffer<bf16>),
}

/// Completes once the producing thread has finished the bucket.
pub(crate) struct HostFence(mpsc::Receiver<FenceResult>);

/// How a fence completed: an error is a device that failed the bucket's kernels.
type FenceResult = Result<(), String>;

impl StandInDevice {
    /// The stand-in communicator of `pg`'s ranks.
    ///
    /// # Collective
    /// Every rank of `pg` calls it.
    pub(crate) fn new(pg: &ProcessGroup) -> Result<StandInDevice, DdpError> {
        let comm = StandInComm::new(pg).map_err(DdpError::comm(
            "creating the stand-in communicator for the gradient buckets",
        ))?;
        tracing::info!(
            rank = pg.rank(),
            group = comm.name(),
            "gradient buckets are all-reduced by the device engine's CPU stand-in"
        );
        Ok(StandInDevice {
            comm,
            #[cfg(feature = "test-hooks")]
            fault: fault::FenceFault::from_env()?,
            #[cfg(feature = "test-hooks")]
            stuck: Arc::default(),
        })
    }

    /// Completes the fence the way the test asked (at once without `test-hooks`).
    fn complete(&self, done: mpsc::Sender<FenceResult>) {
        #[cfg(feature = "test-hooks")]
        {
            let mut stuck = self.stuck.lock().unwrap_or_else(PoisonError::into_inner);
            let n = stuck.0;
            stuck.0 += 1;
            match self.fault {
                fault::FenceFault::Never(at) if at == n => {
                    tracing::warn!(bucket = n, "{FENCE_FAULT_ENV}: this fence never completes");
                    stuck.1.push(done);
                    return;
                }
                fault::FenceFault::Fail(at) if at == n => {
                    tracing::warn!(bucket = n, "{FENCE_FAULT_ENV}: this fence fails");
                    let _ = done.send(Err(format!(
                        "{FENCE_FAULT_ENV}=fail:{n}: this bucket's fence failed"
                    )));
                    return;
                }
                fault::FenceFault::Kill(at) if at == n => {
                    tracing::warn!(bucket = n, "{FENCE_FAULT_ENV}: killing this process");
                    // SAFETY: plain syscall signalling our own process.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
                fault::FenceFault::Abort(at) if at == n => {
                    tracing::warn!(bucket = n, "{FENCE_FAULT_ENV}: aborting the communicator");
                    let comm = self.comm.clone();
                    std::thread::spawn(move || {
                        let e = comm.abort(&format!("{FENCE_FAULT_ENV}=abort:{n}"));
                        tracing::debug!(error = %e, "aborted from another thread");
                        let _ = done.send(Ok(()));
                    });
                    return;
                }
                fault::FenceFault::Slow { delay, every } if n.is_multiple_of(every) => {
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        let _ = done.send(Ok(()));
                    });
                    return;
                }
                fault::FenceFault::Delay(d) => {
                    std::thread::spawn(move || {
                        std::thread::sleep(d);
                        let _ = done.send(Ok(()));
                    });
                    return;
                }
                _ => {}
            }
        }
        let _ = done.send(Ok(()));
    }
}

impl DeviceWork for StandInWork {
    fn wait(self) -> Result<WorkTiming, CommError> {
        StandInWork::wait(self)
    }
}

impl ReductionDevice for StandInDevice {
    type Memory = HostBucket;
    type Fence = HostFence;
    type Work = StandInWork;

    fn name(&self) -> &'static str {
        "the stand-in"
    }

    fn stage<I: Backend>(
        &self,
        flat: FlatTensor<I>,
        path: &str,
    ) -> Result<(HostBucket, HostFence), DdpError> {
        let FlatTensor {
            tensor: flat,
            len,
            dtype,
        } = flat;
        let gradient = |reason: String| DdpError::Gradient {
            path: path.to_string(),
            reason,
        };
        let data =
            read_to_host::<I>(flat).map_err(|e| gradient(format!("reading the bucket: {e}")))?;
        if data.dtype != dtype || data.num_elements() != len {
            return Err(internal(format!(
                "the flat bucket has {} elements of {:?}, expected {len} of {dtype:?}",
                data.num_elements(),
                data.dtype
            )));
        }
        let memory = match HostGrad::from_data(data).map_err(gradient)? {
            HostGrad::F32(v) => HostBucket::F32(StandInBuffer::new(v)),
            HostGrad::F64(v) => HostBucket::F64(StandInBuffer::new(v)),
            HostGrad::F16(v) => HostBucket::F16(StandInBuffer::new(v)),
            HostGrad::BF16(v) => HostBucket::BF16(StandInBuffer::new(v)),
        };
        let (done, fence) = mpsc::channel();
        self.complete(done);
        Ok((memory, HostFence(fence)))
    }

    fn wait_ready(&self, fence: HostFence) -> Result<(), String> {
        fence.0.recv().map_err(|_| fence_dropped())?
    }

    fn wait_ready_until(
        &self,
        fences: Vec<HostFence>,
        deadline: Instant,
    ) -> Result<Readiness, String> {
        // A fence is a channel: its wait can end at a deadline on this thread, as a GPU's
        // could not (see `NcclDevice`).
        for fence in fences {
            let left = deadline.saturating_duration_since(Instant::now());
            match fence.0.recv_timeout(left) {
                Ok(done) => done?,
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(Readiness::Pending),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(fence_dropped()),
            }
        }
        Ok(Readiness::Ready)
    }

    fn queue(
        &self,
        collective: DeviceCollective<'_, HostBucket>,
        label: CollectiveLabel,
    ) -> Result<StandInWork, CommError> {
        use HostBucket::{BF16, F16, F32, F64};
        let (comm, avg) = (&self.comm, ReduceOp::Avg);
        match collective {
            DeviceCollective::AllReduce(memory) => match memory {
                F32(b) => comm.all_reduce_async(b, avg, label),
                F64(b) => comm.all_reduce_async(b, avg, label),
                F16(b) => comm.all_reduce_async(b, avg, label),
                BF16(b) => comm.all_reduce_async(b, avg, label),
            },
            DeviceCollective::ReduceScatter { send, recv } => match (send, recv) {
                (F32(s), F32(r)) => comm.reduce_scatter_async(s, r, avg, label),
                (F64(s), F64(r)) => comm.reduce_scatter_async(s, r, avg, label),
                (F16(s), F16(r)) => comm.reduce_scatter_async(s, r, avg, label),
                (BF16(s), BF16(r)) => comm.reduce_scatter_async(s, r, avg, label),
                _ => Err(dtypes_differ(collective.op())),
            },
            DeviceCollective::AllGather { send, recv } => match (send, recv) {
                (F32(s), F32(r)) => comm.all_gather_async(s, r, label),
                (F64(s), F64(r)) => comm.all_gather_async(s, r, label),
                (F16(s), F16(r)) => comm.all_gather_async(s, r, label),
                (BF16(s), BF16(r)) => comm.all_gather_async(s, r, label),
                _ => Err(dtypes_differ(collective.op())),
            },
        }
    }

    fn check(&self) -> Result<(), CommError> {
        self.comm.check()
    }

    fn abort(&self, reason: &str) -> CommError {
        self.comm.abort(reason)
    }

    fn unstage<I: Backend>(
        &self,
        memory: HostBucket,
        device: &I::Device,
    ) -> Result<FloatTensor<I>, DdpError> {
        let data = match memory {
            HostBucket::F32(b) => vec_data(b.take()),
            HostBucket::F64(b) => vec_data(b.take()),
            HostBucket::F16(b) => vec_data(b.take()),
            HostBucket::BF16(b) => vec_data(b.take()),
        };
        Ok(I::float_from_data(data, device))
    }
}

fn fence_dropped() -> String {
    "the producing thread dropped the bucket's fence".to_string()
}

fn dtypes_differ(op: &'static str) -> CommError {
    CommError::InvalidArgument {
        op,
        reason: "the send and receive buffers have different dtypes".into(),
    }
}

fn vec_data<T: burn::tensor::Element>(v: Vec<T>) -> TensorData {
    let n = v.len();
    TensorData::new(v, [n])
}

#[cfg(feature = "test-hooks")]
mod fault {
    use super::FENCE_FAULT_ENV;
    use crate::error::DdpError;
    use std::time::Duration;

    /// What [`FENCE_FAULT_ENV`] asks of the fences.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum FenceFault {
        None,
        Delay(Duration),
        /// Every `every`-th fence (from the first) is `delay` late, the others are not.
        Slow {
            delay: Duration,
            every: usize,
        },
        Never(usize),
        Fail(usize),
        Kill(usize),
        Abort(usize),
    }

    impl FenceFault {
        pub(super) fn from_env() -> Result<FenceFault, DdpError> {
            let Some(value) = std::env::var_os(FENCE_FAULT_ENV) else {
                return Ok(FenceFault::None);
            };
            let bad = || {
                DdpError::InvalidConfig(format!(
                    "{FENCE_FAULT_ENV}={value:?}: expected delay:<milliseconds>, \
                     slow:<milliseconds>:<every (1 or more)>, \
                     never:<bucket number>, fail:<bucket number>, kill:<bucket number> or \
                     abort:<bucket number>"
                ))
            };
            let text = value.to_str().ok_or_else(bad)?;
            let (kind, n) = text.split_once(':').ok_or_else(bad)?;
            if kind == "slow" {
                let (ms, every) = n.split_once(':').ok_or_else(bad)?;
                let delay = Duration::from_millis(ms.parse().map_err(|_| bad())?);
                let every: usize = every.parse().map_err(|_| bad())?;
                if every == 0 {
                    return Err(bad());
                }
                return Ok(FenceFault::Slow { delay, every });
            }
            let n: u64 = n.parse().map_err(|_| bad())?;
            match kind {
                "delay" => Ok(FenceFault::Delay(Duration::from_millis(n))),
                "never" => Ok(FenceFault::Never(usize::try_from(n).map_err(|_| bad())?)),
                "fail" => Ok(FenceFault::Fail(usize::try_from(n).map_err(|_| bad())?)),
                "kill" => Ok(FenceFault::Kill(usize::try_from(n).map_err(|_| bad())?)),
                "abort" => Ok(FenceFault::Abort(usize::try_from(n).map_err(|_| bad())?)),
                _ => Err(bad()),
            }
        }
    }
}

/// The device engine over the stand-in ([`Collectives::StandIn`](crate::Collectives::StandIn)).
pub(crate) type StandInReduction = super::DeviceReduction<StandInDevice>;
