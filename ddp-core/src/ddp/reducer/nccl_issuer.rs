//! The NCCL reduction's issuing thread: waits on the host for each bucket's ready fence (created
//! on the backward thread when the bucket launched), then queues its all-reduce on NCCL's
//! stream (see [`NcclReduction`](super::NcclReduction) for why a thread of its own does this).
//!
//! Nothing can interrupt a host wait for a GPU that never finishes a kernel, so the thread says
//! when it is in one ([`GpuWait`]): a bucket's wait gives up once that has lasted longer than
//! the timeout, and dropping the reduction leaves such a thread behind rather than hang. A bucket
//! the thread cannot hand back ([`Issued`], dropped) returns its memory to cubecl's pool only if
//! its all-reduce certainly finished.

use crate::error::DdpError;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::future::DynFut;
use cubecl::server::ServerError;
use ddp_comm::watchdog::CollectiveLabel;
use ddp_comm::{NcclBackend, NcclDtype, NcclWork, ReduceOp};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long dropping the reduction waits for the thread once the group has failed (its NCCL calls
/// then return at once; only a GPU wait can hold it longer).
const STOP_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// A flat bucket for the issuing thread, and where its all-reduce goes.
pub(super) struct Issue {
    /// The bucket's memory, kept (referenced only here) until its all-reduce is done.
    pub(super) cube: CubeTensor<CudaRuntime>,
    /// The device address of `cube`'s first element, taken on the backward thread.
    pub(super) ptr: u64,
    /// Resolves once the backward thread's stream has run every kernel queued before the
    /// bucket launched (the ones that produced it): `client.sync()` called on the backward
    /// thread, which records an event on that stream and returns at once.
    pub(super) ready: DynFut<Result<(), ServerError>>,
    pub(super) len: usize,
    pub(super) dtype: NcclDtype,
    pub(super) bucket: usize,
    pub(super) path: String,
    pub(super) reply: mpsc::Sender<Issued>,
}

/// Why a bucket's all-reduce is not running.
pub(super) struct NotIssued {
    pub(super) error: DdpError,
    /// NCCL may have queued it anyway: the error came from the NCCL call (a call still being
    /// issued at its deadline, an abort while issuing), so its kernel may be on NCCL's stream
    /// and the memory must never be reused.
    pub(super) maybe_queued: bool,
}

impl NotIssued {
    /// Gives `cube` back to cubecl's pool only if NCCL certainly never saw it; the error.
    pub(super) fn release(self, cube: CubeTensor<CudaRuntime>) -> DdpError {
        if self.maybe_queued {
            std::mem::forget(cube);
        }
        self.error
    }
}

/// A bucket's memory and its all-reduce, or why that is not running.
pub(super) type IssuedParts = (CubeTensor<CudaRuntime>, Result<NcclWork, NotIssued>);

/// The bucket's memory, back from the issuing thread, with its all-reduce (or why it was not
/// queued). Dropped without [`into_parts`](Self::into_parts) (its step gave up on it), it
/// waits for the all-reduce (bounded by the group's watchdog; at once on a failed group) and
/// leaks the memory unless the all-reduce certainly finished: NCCL may still be writing it.
pub(super) struct Issued {
    parts: Option<IssuedParts>,
}

impl Issued {
    pub(super) fn into_parts(mut self) -> Option<IssuedParts> {
        self.parts.take()
    }
}

impl Drop for Issued {
    fn drop(&mut self) {
        match self.parts.take() {
            Some((cube, Err(not))) => drop(not.release(cube)),
            Some((cube, Ok(work))) => match work.wait() {
                Ok(_) => drop(cube),
                Err(_) => std::mem::forget(cube),
            },
            None => {}
        }
    }
}

/// Since when, and for which bucket, the issuing thread has been waiting for the GPU.
#[derive(Debug, Default)]
pub(super) struct GpuWait(Mutex<Option<(usize, Instant)>>);

impl GpuWait {
    /// The bucket the thread has been waiting for longer than `limit`, and for how long.
    pub(super) fn longer_than(&self, limit: Duration) -> Option<(usize, Duration)> {
        let since = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        since
            .map(|(bucket, t)| (bucket, t.elapsed()))
            .filter(|(_, waited)| *waited > limit)
    }

    fn set(&self, state: Option<(usize, Instant)>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }
}

/// The issuing thread and the way to it.
pub(super) struct Issuer {
    /// `None` once stopping.
    sender: Mutex<Option<mpsc::Sender<Issue>>>,
    thread: Option<JoinHandle<()>>,
    pub(super) gpu_wait: Arc<GpuWait>,
}

impl Issuer {
    /// Starts the thread; it holds a handle of `nccl` until it ends.
    pub(super) fn start(nccl: NcclBackend, rank: usize) -> Result<Issuer, DdpError> {
        let (sender, issues) = mpsc::channel::<Issue>();
        let gpu_wait = Arc::new(GpuWait::default());
        let waiting = gpu_wait.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ddp-nccl-issue-{rank}"))
            .spawn(move || {
                // Buckets in launch order: every rank queues its all-reduces in the same order.
                for mut job in issues {
                    let work = issue(&nccl, &waiting, &mut job);
                    // A step that gave up waiting dropped its receiver: the returned `Issued`
                    // is dropped here, which frees the memory only if NCCL is done with it.
                    let _ = job.reply.send(Issued {
                        parts: Some((job.cube, work)),
                    });
                }
            })
            .map_err(|e| {
                DdpError::Internal(format!(
                    "NCCL bucket reduction: starting the issuing thread: {e}"
                ))
            })?;
        Ok(Issuer {
            sender: Mutex::new(Some(sender)),
            thread: Some(thread),
            gpu_wait,
        })
    }

    /// Hands a bucket to the thread.
    pub(super) fn send(&self, job: Issue) -> Result<(), String> {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .ok_or("the reduction is being dropped")?
            .send(job)
            .map_err(|_| "the issuing thread ended".to_string())
    }

    /// Ends the thread: joined once it has finished its buckets, or left behind (and said so)
    /// when it has been waiting for the GPU longer than `timeout`, or is still busy
    /// [`STOP_AFTER_FAILURE`] after `nccl` failed.
    pub(super) fn stop(&mut self, nccl: &NcclBackend, timeout: Duration) {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(thread) = self.thread.take() else {
            return;
        };
        let mut failed_at = None;
        while !thread.is_finished() {
            if let Some((bucket, waited)) = self.gpu_wait.longer_than(timeout) {
                // The thread holds the group: fail it now, so the peers learn at once and the
                // communicator is aborted instead of living as long as the stuck wait.
                let e = nccl.abort(&format!(
                    "the GPU has not finished the kernels that produce gradient bucket {bucket} \
                     after {waited:?}"
                ));
                tracing::error!(
                    bucket,
                    waited_s = waited.as_secs_f64(),
                    error = %e,
                    "the NCCL issuing thread is still waiting for the GPU; leaving it behind"
                );
                return;
            }
            if nccl.check().is_err() {
                let at = *failed_at.get_or_insert_with(Instant::now);
                if at.elapsed() > STOP_AFTER_FAILURE {
                    tracing::error!(
                        "the NCCL group failed and its issuing thread has not ended; leaving it \
                         behind"
                    );
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.join().is_err() {
            tracing::error!("the NCCL issuing thread panicked");
        }
    }
}

/// Clears the thread's [`GpuWait`] however the wait ends.
struct Waiting<'a>(&'a GpuWait);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

/// On the issuing thread: waits for the bucket's ready fence (an event on the backward
/// thread's stream, recorded when the bucket launched), then queues its all-reduce on NCCL's
/// stream. Only this thread blocks; backward goes on queueing kernels, and no whole-device
/// sync is made.
fn issue(nccl: &NcclBackend, gpu_wait: &GpuWait, job: &mut Issue) -> Result<NcclWork, NotIssued> {
    let fail = |what: &str, e: &dyn std::fmt::Debug| NotIssued {
        error: DdpError::Gradient {
            path: job.path.clone(),
            reason: format!("{what} for NCCL: {e:?}"),
        },
        maybe_queued: false,
    };
    {
        gpu_wait.set(Some((job.bucket, Instant::now())));
        let _waiting = Waiting(gpu_wait);
        let ready = std::mem::replace(&mut job.ready, Box::pin(async { Ok(()) }));
        cubecl::future::block_on(ready)
            .map_err(|e| fail("waiting for the bucket's kernels", &e))?;
    }
    let ptr = job.ptr;
    // SAFETY: `ptr` is the start of `cube`'s buffer, at least `len` contiguous elements of
    // `dtype` (checked in `launch`) on the model's device (the group's device, chosen from
    // it); `cube` is referenced only by the bucket (can_mut, or a fresh copy) and is kept, by
    // the pending bucket or by `Issued`'s drop, until the all-reduce is known to have finished
    // (or forever), so nothing else reads, writes or reuses the memory meanwhile; the compute
    // stream finished writing it (the ready fence).
    unsafe {
        nccl.all_reduce_raw_async(
            ptr,
            job.len,
            job.dtype,
            ReduceOp::Avg,
            CollectiveLabel {
                op: "all_reduce",
                bucket: Some(job.bucket),
            },
        )
    }
    .map_err(|e| NotIssued {
        // Only a refused argument is certain to come before NCCL's call.
        maybe_queued: !matches!(e, ddp_comm::CommError::InvalidArgument { .. }),
        error: DdpError::comm("all-reducing a gradient bucket with NCCL")(e),
    })
}
