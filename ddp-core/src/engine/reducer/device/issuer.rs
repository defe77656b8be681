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
//!
//! Once a bucket could not be issued, the thread aborts the communicator and queues nothing
//! more: on NCCL this rank's next bucket would otherwise meet its peers' failed one (a hang,
//! or unrelated gradients added together).

use super::{DeviceCollective, DeviceWork, ReductionDevice};
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

impl<D: ReductionDevice> Staged<D> {
    /// What its number counts, for errors: "gradient bucket", "FSDP unit".
    fn noun(&self) -> &'static str {
        match self {
            Staged::AllReduce(_) => "gradient bucket",
            Staged::ReduceScatter { .. } => "FSDP unit",
        }
    }

    /// The collective its memory goes through.
    fn collective(&self) -> DeviceCollective<'_, D::Memory> {
        match self {
            Staged::AllReduce(memory) => DeviceCollective::AllReduce(memory),
            Staged::ReduceScatter { send, recv } => DeviceCollective::ReduceScatter { send, recv },
        }
    }

    /// What its collective does, for errors.
    fn doing(&self) -> &'static str {
        match self {
            Staged::AllReduce(_) => "all-reducing a gradient bucket on the device",
            Staged::ReduceScatter { .. } => {
                "reduce-scattering an FSDP unit's gradients on the device"
            }
        }
    }
}

/// A numbered collective, for errors: "gradient bucket 3", "FSDP unit 1".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Numbered {
    pub(super) noun: &'static str,
    pub(super) n: usize,
}

impl std::fmt::Display for Numbered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.noun, self.n)
    }
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

/// Since when, and for which collective, the issuing thread has been waiting for the device.
#[derive(Debug, Default)]
pub(super) struct DeviceWait(Mutex<Option<(Numbered, Instant)>>);

impl DeviceWait {
    /// The collective the thread has been waiting for longer than `limit`, and for how long.
    pub(super) fn longer_than(&self, limit: Duration) -> Option<(Numbered, Duration)> {
        let since = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        since
            .map(|(what, t)| (what, t.elapsed()))
            .filter(|(_, waited)| *waited > limit)
    }

    fn set(&self, state: Option<(Numbered, Instant)>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }
}

/// The error for a fence of `what` that has not completed after `waited`.
pub(super) fn fence_stuck(what: Numbered, waited: Duration) -> String {
    format!("the device has not finished the kernels that produce {what} after {waited:?}")
}

/// The end of the reason the issuing thread aborts the communicator with, once a collective
/// could not be issued.
const STOPPED: &str = "this rank's issuing thread queues no collective after it";

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
                // Once set, why this thread issues nothing more: the first collective it
                // could not issue, and why. The communicator is aborted then, so it stays
                // set for the reduction's life (every later step fails anyway).
                let mut stopped: Option<String> = None;
                // Buckets in launch order: every rank queues its collectives in the same order.
                for job in issues {
                    let Issue {
                        staged,
                        ready,
                        bucket,
                        path,
                        reply,
                    } = job;
                    let what = Numbered {
                        noun: staged.noun(),
                        n: bucket,
                    };
                    let work = match &stopped {
                        // Never touches the communicator: nothing was queued, so the memory
                        // may go.
                        Some(first) => Err(NotIssued {
                            error: DdpError::Gradient {
                                path,
                                reason: format!(
                                    "{what} was not issued: an earlier collective could not be \
                                     ({first})"
                                ),
                            },
                            maybe_queued: false,
                        }),
                        None => {
                            let work = issue(&device, &waiting, &staged, ready, what, &path);
                            if let Err(not) = &work {
                                // Before replying, so that no later bucket of this rank meets
                                // a peer's failed one, and the peers fail now, with this reason.
                                let reason = format!("{}; {STOPPED}", not.error);
                                let e = device.abort(&reason);
                                tracing::error!(
                                    collective = %what,
                                    error = %e,
                                    communicator = device.name(),
                                    "a collective could not be issued; aborted the communicator"
                                );
                                stopped = Some(format!("{what}: {}", not.error));
                            }
                            work
                        }
                    };
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
            if let Some((what, waited)) = self.device_wait.longer_than(timeout) {
                // The thread holds the communicator: fail it now, so the peers learn at once
                // and it is aborted instead of living as long as the stuck wait.
                let e = device.abort(&fence_stuck(what, waited));
                tracing::error!(
                    collective = %what,
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
    what: Numbered,
    path: &str,
) -> Result<D::Work, NotIssued> {
    let bucket = what.n;
    {
        device_wait.set(Some((what, Instant::now())));
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
    let collective = staged.collective();
    let label = CollectiveLabel {
        op: collective.op(),
        bucket: Some(bucket),
    };
    device.queue(collective, label).map_err(|e| NotIssued {
        // Only a refused argument is certain to come before the communicator's call.
        maybe_queued: !matches!(e, ddp_comm::CommError::InvalidArgument { .. }),
        error: DdpError::comm(staged.doing())(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::reducer::device::tests::ScriptedDevice;

    /// Waits (a generous minute) for the thread's answer about one bucket.
    fn answer(reply: &mpsc::Receiver<Issued<ScriptedDevice>>) -> Result<(), NotIssued> {
        let issued = reply
            .recv_timeout(Duration::from_secs(60))
            .expect("the issuing thread answers");
        let (_, work) = issued.into_parts().expect("parts");
        work.map(|_| ())
    }

    /// A bucket whose fence failed: the thread aborts the communicator (before it answers)
    /// and queues none of the buckets after it, which on NCCL would meet the peers' failed
    /// bucket; those fail without touching the communicator, saying why.
    #[test]
    fn after_a_bucket_that_was_not_issued_nothing_more_is_queued() {
        let device = ScriptedDevice::default();
        let mut issuer = Issuer::start(device.clone(), 0).expect("start");
        let send = |bucket: usize, fence: Result<(), String>| {
            let (reply, answer) = mpsc::channel();
            let job = Issue {
                staged: Staged::AllReduce(device.memory()),
                ready: vec![fence],
                bucket,
                path: format!("p{bucket}"),
                reply,
            };
            issuer.send(job).expect("send");
            answer
        };
        let first = send(0, Ok(()));
        let failing = send(1, Err("the event failed".into()));
        let later = [send(2, Ok(())), send(3, Ok(()))];
        assert!(answer(&first).is_ok());
        let not = answer(&failing).expect_err("bucket 1 fails");
        assert!(!not.maybe_queued);
        assert!(
            not.error.to_string().contains("the event failed"),
            "{}",
            not.error
        );
        let calls = device.calls();
        let aborted = calls
            .iter()
            .any(|c| c.starts_with("abort") && c.contains(STOPPED));
        assert!(aborted, "aborted before answering: {calls:?}");
        for (bucket, reply) in (2..).zip(&later) {
            let not = answer(reply).expect_err("later buckets fail");
            assert!(!not.maybe_queued, "nothing was queued");
            let text = not.error.to_string();
            assert!(
                text.contains(&format!("gradient bucket {bucket} was not issued"))
                    && text.contains("gradient bucket 1")
                    && text.contains("the event failed"),
                "{text}"
            );
        }
        issuer.stop(&device, Duration::from_secs(60));
        let calls = device.calls();
        assert_eq!(
            calls
                .iter()
                .filter(|c| !c.starts_with("abort"))
                .collect::<Vec<_>>(),
            [
                "fence Ok(())",
                "all_reduce Some(0)",
                "fence Err(\"the event failed\")"
            ],
            "{calls:?}"
        );
    }
}
