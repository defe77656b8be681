//! The device engine's issuing thread: waits on the host for each bucket's ready fence (taken on
//! the backward thread when the bucket launched), then queues its collective on the
//! communication stream, in launch order (see [`DeviceReduction`](super::DeviceReduction) for
//! why a thread of its own does this).
//!
//! Nothing can interrupt a host wait for a device that never finishes a kernel, so the thread
//! says when it is in one ([`DeviceWait`]): a bucket's wait gives up once that has lasted longer
//! than the timeout, and dropping the reduction leaves such a thread behind rather than hang. A
//! bucket the thread cannot hand back ([`Issued`], dropped) gives its memory back only if its
//! collective certainly finished.

use super::{DeviceWork, ReductionDevice};
use crate::error::DdpError;
use ddp_comm::watchdog::CollectiveLabel;
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long dropping the reduction waits for the thread once the communicator has failed (its
/// calls then return at once; only a device wait can hold it longer).
const STOP_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// What one collective reduces: its memory, kept (referenced only here) until it is done.
pub(super) enum Staged<D: ReductionDevice> {
    /// DDP's gradient bucket, averaged in place.
    AllReduce(D::Memory),
    /// FSDP's unit: `send` (every rank's chunk) averaged into `recv` (this rank's chunk).
    ReduceScatter { send: D::Memory, recv: D::Memory },
}

/// A staged bucket for the issuing thread, and where its collective goes.
pub(super) struct Issue<D: ReductionDevice> {
    pub(super) staged: Staged<D>,
    /// Complete once the kernels that produced the memory have run.
    pub(super) ready: Vec<D::Fence>,
    pub(super) bucket: usize,
    pub(super) path: String,
    pub(super) reply: mpsc::Sender<Issued<D>>,
}

/// Why a bucket's collective is not running.
pub(super) struct NotIssued {
    pub(super) error: DdpError,
    /// The communicator may have queued it anyway: the error came from the call (a call still
    /// being issued at its deadline, an abort while issuing), so the device may still write
    /// the memory, which must never be reused.
    pub(super) maybe_queued: bool,
}

impl NotIssued {
    /// Gives `memory` back only if the communicator certainly never saw it; the error.
    pub(super) fn release<M>(self, memory: M) -> DdpError {
        if self.maybe_queued {
            std::mem::forget(memory);
        }
        self.error
    }
}

/// A bucket's memory and its collective, or why that is not running.
pub(super) type IssuedParts<D> = (Staged<D>, Result<<D as ReductionDevice>::Work, NotIssued>);

/// The bucket's memory, back from the issuing thread, with its collective (or why it was not
/// queued). Dropped without [`into_parts`](Self::into_parts) (its step gave up on it), it
/// waits for the collective (bounded by the communicator's watchdog; at once once it failed)
/// and leaks the memory unless the collective certainly finished: the device may still be
/// writing it.
pub(super) struct Issued<D: ReductionDevice> {
    parts: Option<IssuedParts<D>>,
}

impl<D: ReductionDevice> Issued<D> {
    pub(super) fn into_parts(mut self) -> Option<IssuedParts<D>> {
        self.parts.take()
    }
}

impl<D: ReductionDevice> Drop for Issued<D> {
    fn drop(&mut self) {
        match self.parts.take() {
            Some((memory, Err(not))) => drop(not.release(memory)),
            Some((memory, Ok(work))) => match work.wait() {
                Ok(_) => drop(memory),
                Err(_) => std::mem::forget(memory),
            },
            None => {}
        }
    }
}

/// Since when, and for which bucket, the issuing thread has been waiting for the device.
#[derive(Debug, Default)]
pub(super) struct DeviceWait(Mutex<Option<(usize, Instant)>>);

impl DeviceWait {
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

/// The error for a fence that has not completed after `waited`.
pub(super) fn fence_stuck(bucket: usize, waited: Duration) -> String {
    format!(
        "the device has not finished the kernels that produce gradient bucket {bucket} after \
         {waited:?}"
    )
}

/// The issuing thread and the way to it.
pub(super) struct Issuer<D: ReductionDevice> {
    /// `None` once stopping.
    sender: Mutex<Option<mpsc::Sender<Issue<D>>>>,
    thread: Option<JoinHandle<()>>,
    pub(super) device_wait: Arc<DeviceWait>,
}

impl<D: ReductionDevice> Issuer<D> {
    /// Starts the thread; it holds a clone of `device` until it ends.
    pub(super) fn start(device: D, rank: usize) -> Result<Issuer<D>, DdpError> {
        let (sender, issues) = mpsc::channel::<Issue<D>>();
        let device_wait = Arc::new(DeviceWait::default());
        let waiting = device_wait.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ddp-issue-{rank}"))
            .spawn(move || {
                // Buckets in launch order: every rank queues its collectives in the same order.
                for job in issues {
                    let Issue {
                        staged,
                        ready,
                        bucket,
                        path,
                        reply,
                    } = job;
                    let work = issue(&device, &waiting, &staged, ready, bucket, &path);
                    // A step that gave up waiting dropped its receiver: the returned `Issued`
                    // is dropped here, which frees the memory only if the device is done.
                    let _ = reply.send(Issued {
                        parts: Some((staged, work)),
                    });
                }
            })
            .map_err(|e| {
                DdpError::Internal(format!(
                    "device bucket reduction: starting the issuing thread: {e}"
                ))
            })?;
        Ok(Issuer {
            sender: Mutex::new(Some(sender)),
            thread: Some(thread),
            device_wait,
        })
    }

    /// Hands a bucket to the thread.
    pub(super) fn send(&self, job: Issue<D>) -> Result<(), String> {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .ok_or("the reduction is being dropped")?
            .send(job)
            .map_err(|_| "the issuing thread ended".to_string())
    }

    /// Ends the thread: joined once it has finished its buckets, or left behind (and said so)
    /// when it has been waiting for the device longer than `timeout`, or is still busy
    /// [`STOP_AFTER_FAILURE`] after the communicator failed.
    pub(super) fn stop(&mut self, device: &D, timeout: Duration) {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(thread) = self.thread.take() else {
            return;
        };
        let mut failed_at = None;
        while !thread.is_finished() {
            if let Some((bucket, waited)) = self.device_wait.longer_than(timeout) {
                // The thread holds the communicator: fail it now, so the peers learn at once
                // and it is aborted instead of living as long as the stuck wait.
                let e = device.abort(&fence_stuck(bucket, waited));
                tracing::error!(
                    bucket,
                    waited_s = waited.as_secs_f64(),
                    error = %e,
                    communicator = device.name(),
                    "the issuing thread is still waiting for the device; leaving it behind"
                );
                return;
            }
            if device.check().is_err() {
                let at = *failed_at.get_or_insert_with(Instant::now);
                if at.elapsed() > STOP_AFTER_FAILURE {
                    tracing::error!(
                        communicator = device.name(),
                        "the communicator failed and its issuing thread has not ended; leaving \
                         it behind"
                    );
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.join().is_err() {
            tracing::error!(communicator = device.name(), "the issuing thread panicked");
        }
    }
}

/// Clears the thread's [`DeviceWait`] however the wait ends.
struct Waiting<'a>(&'a DeviceWait);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

/// On the issuing thread: waits for the bucket's ready fence, then queues its collective on the
/// communication stream. Only this thread blocks; backward goes on, and nothing waits for the
/// whole device.
fn issue<D: ReductionDevice>(
    device: &D,
    device_wait: &DeviceWait,
    staged: &Staged<D>,
    ready: Vec<D::Fence>,
    bucket: usize,
    path: &str,
) -> Result<D::Work, NotIssued> {
    {
        device_wait.set(Some((bucket, Instant::now())));
        let _waiting = Waiting(device_wait);
        for fence in ready {
            device.wait_ready(fence).map_err(|e| NotIssued {
                error: DdpError::Gradient {
                    path: path.to_string(),
                    reason: format!(
                        "waiting for the bucket's kernels for {}: {e}",
                        device.name()
                    ),
                },
                maybe_queued: false,
            })?;
        }
    }
    let (queued, what) = match staged {
        Staged::AllReduce(memory) => {
            let label = CollectiveLabel {
                op: "all_reduce",
                bucket: Some(bucket),
            };
            (
                device.all_reduce(memory, label),
                "all-reducing a gradient bucket on the device",
            )
        }
        Staged::ReduceScatter { send, recv } => {
            let label = CollectiveLabel {
                op: "reduce_scatter",
                bucket: Some(bucket),
            };
            (
                device.reduce_scatter(send, recv, label),
                "reduce-scattering an FSDP unit's gradients on the device",
            )
        }
    };
    queued.map_err(|e| NotIssued {
        // Only a refused argument is certain to come before the communicator's call.
        maybe_queued: !matches!(e, ddp_comm::CommError::InvalidArgument { .. }),
        error: DdpError::comm(what)(e),
    })
}
