//! [`HookReduction`]: buckets reduced by a user's [`CommHook`] on a communication thread.
//!
//! The hook runs on its own thread, one bucket after another in launch order, so backward keeps
//! going while it communicates, and every rank issues the hook's collectives in the same
//! order. The reducer waits for every bucket before its own control collectives, so those
//! never interleave with the hook's. A bucket of another dtype goes through [`HostReduction`]
//! from the backward thread only after the hook has finished every bucket before it, so the
//! two threads' collectives reach the group in the same order on every rank.

use super::host_grad::HostGrad;
use super::reduction::{
    BucketReduction, FullBucket, Held, HostReduction, PendingBucket, Reduced, Slot,
};
use crate::engine::hooks::{BucketParam, CommHook, CommHookState, CommHookStateError, GradBucket};
use crate::error::DdpError;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, TensorData};
use ddp_comm::{ProcessGroup, WorkTiming};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// What the hook's thread is given, in launch order.
enum Work {
    /// An f32 bucket for the hook.
    Bucket(Job),
    /// Answered once every bucket before it is reduced.
    Fence(mpsc::Sender<()>),
    /// Answered with the hook's state, after every bucket before it.
    TakeState(mpsc::Sender<Option<CommHookState>>),
    /// Answered once the hook took (or refused) the state, after every bucket before it.
    LoadState(CommHookState, mpsc::Sender<Result<(), CommHookStateError>>),
}

struct Job {
    bucket: GradBucket,
    queued: Instant,
    reply: mpsc::Sender<(Result<GradBucket, DdpError>, WorkTiming)>,
}

/// f32 buckets go through the hook; buckets of other dtypes through [`HostReduction`].
pub(crate) struct HookReduction {
    host: HostReduction,
    work: mpsc::Sender<Work>,
    hook: Arc<str>,
    /// How long a bucket may take in the hook: the process group's timeout.
    timeout: Duration,
}

impl HookReduction {
    /// Starts the hook's thread; it ends when the reduction is dropped.
    pub(crate) fn new(
        host: HostReduction,
        mut hook: Box<dyn CommHook>,
    ) -> Result<HookReduction, DdpError> {
        let (work, rx) = mpsc::channel::<Work>();
        let pg: ProcessGroup = host.pg.clone();
        let name: Arc<str> = hook.name().into();
        let timeout = pg.timeout();
        std::thread::Builder::new()
            .name(format!("ddp-hook-{}", pg.rank()))
            .spawn(move || {
                for work in rx {
                    let Job {
                        mut bucket,
                        queued,
                        reply,
                    } = match work {
                        Work::Bucket(job) => job,
                        Work::Fence(done) => {
                            let _ = done.send(());
                            continue;
                        }
                        Work::TakeState(reply) => {
                            let _ = reply.send(hook.state());
                            continue;
                        }
                        Work::LoadState(state, reply) => {
                            let _ = reply.send(hook.load_state(state));
                            continue;
                        }
                    };
                    let index = bucket.index();
                    let started = Instant::now();
                    let result = hook.reduce(&mut bucket, &pg).map(|()| bucket);
                    // The hook's run is the bucket's communication, for the timeline.
                    let timing = WorkTiming {
                        queued,
                        started,
                        finished: Instant::now(),
                    };
                    let result = result.map_err(|source| DdpError::CommHook {
                        hook: hook.name().to_string(),
                        bucket: index,
                        source,
                    });
                    // The reducer may have given up on this step already.
                    let _ = reply.send((result, timing));
                }
            })
            .map_err(|e| DdpError::Internal(format!("starting the hook thread: {e}")))?;
        Ok(HookReduction {
            host,
            work,
            hook: name,
            timeout,
        })
    }

    /// Waits until the hook has reduced every bucket launched before bucket `index`.
    fn drain_before(&self, index: usize) -> Result<(), DdpError> {
        self.ask(index, Work::Fence)
    }

    /// Sends the hook's thread the request `work` makes of a reply channel, after everything
    /// queued before it, and waits for the answer (`index`: the bucket errors name).
    fn ask<T>(
        &self,
        index: usize,
        work: impl FnOnce(mpsc::Sender<T>) -> Work,
    ) -> Result<T, DdpError> {
        let (reply, answer) = mpsc::channel();
        self.work
            .send(work(reply))
            .map_err(|_| hook_thread_ended(&self.hook, index))?;
        match answer.recv_timeout(self.timeout) {
            Ok(value) => Ok(value),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(hook_timeout(&self.hook, index, self.timeout))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(hook_thread_ended(&self.hook, index)),
        }
    }
}

/// The hook's thread is gone (it panicked): the bucket cannot be reduced.
fn hook_thread_ended(hook: &str, bucket: usize) -> DdpError {
    DdpError::CommHook {
        hook: hook.to_string(),
        bucket,
        source: "the hook's thread ended (the hook panicked; its message is in the log)".into(),
    }
}

fn hook_timeout(hook: &str, bucket: usize, timeout: Duration) -> DdpError {
    DdpError::CommHook {
        hook: hook.to_string(),
        bucket,
        source: format!(
            "not reduced within {timeout:?} (the process group's timeout): the hook or a peer \
             is stuck"
        )
        .into(),
    }
}

impl<I: Backend> BucketReduction<I> for HookReduction {
    fn comm_hook_state(&self) -> Result<Option<CommHookState>, DdpError> {
        // Between steps the hook's thread is idle: it answers at once.
        self.ask(0, Work::TakeState)
    }

    fn load_comm_hook_state(&self, _hook: &str, state: CommHookState) -> Result<(), DdpError> {
        Ok(self.ask(0, |reply| Work::LoadState(state, reply))??)
    }

    fn hold(
        &self,
        slot: &Slot<I>,
        grad: burn::tensor::ops::FloatTensor<I>,
    ) -> Result<Held<I>, DdpError> {
        BucketReduction::<I>::hold(&self.host, slot, grad)
    }

    fn add(&self, slot: &Slot<I>, acc: Held<I>, more: Held<I>) -> Result<Held<I>, DdpError> {
        BucketReduction::<I>::add(&self.host, slot, acc, more)
    }

    fn launch(&self, bucket: FullBucket<'_, I>) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
        if bucket.slots.first().map(|s| s.dtype) != Some(DType::F32) {
            // Its collective goes on the group from this thread: after the hook's, in order.
            self.drain_before(bucket.position.index)?;
            return self.host.launch(bucket);
        }
        let FullBucket {
            position,
            slots,
            grads,
        } = bucket;
        let total: usize = slots.iter().map(|s| s.numel()).sum();
        let mut buffer = Vec::with_capacity(total);
        let mut params = Vec::with_capacity(slots.len());
        for (slot, g) in slots.iter().zip(grads) {
            params.push(BucketParam {
                path: slot.path.clone(),
                shape: slot.shape.clone(),
                offset: buffer.len(),
            });
            match g {
                Some(Held::Host(HostGrad::F32(v))) => buffer.extend_from_slice(&v),
                // Unused here: zeros, so every rank's hook sees the same layout.
                None => buffer.resize(buffer.len() + slot.numel(), 0.0),
                Some(_) => {
                    return Err(DdpError::Internal(
                        "bucket reduction: an f32 bucket holds a non-f32 gradient".into(),
                    ));
                }
            }
        }
        let (reply, result) = mpsc::channel();
        let index = position.index;
        let job = Job {
            bucket: GradBucket::new(index, position.last_of_its_dtype, buffer, params),
            queued: Instant::now(),
            reply,
        };
        self.work
            .send(Work::Bucket(job))
            .map_err(|_| hook_thread_ended(&self.hook, index))?;
        Ok(Box::new(HookPending {
            result,
            hook: self.hook.clone(),
            bucket: index,
            timeout: self.timeout,
        }))
    }
}

struct HookPending {
    result: mpsc::Receiver<(Result<GradBucket, DdpError>, WorkTiming)>,
    hook: Arc<str>,
    bucket: usize,
    timeout: Duration,
}

impl<I: Backend> PendingBucket<I> for HookPending {
    fn wait(self: Box<Self>, slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError> {
        let (bucket, timing) = self
            .result
            .recv_timeout(self.timeout)
            .map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => {
                    hook_timeout(&self.hook, self.bucket, self.timeout)
                }
                mpsc::RecvTimeoutError::Disconnected => hook_thread_ended(&self.hook, self.bucket),
            })?;
        let bucket = bucket?;
        let buffer = bucket.into_buffer();
        let mut at = 0;
        let mut tensors = Vec::with_capacity(slots.len());
        for slot in slots {
            let n = slot.numel();
            let values = buffer.get(at..at + n).ok_or_else(|| {
                DdpError::Internal("the hook's result is shorter than its bucket".into())
            })?;
            at += n;
            let data = TensorData::new(values.to_vec(), slot.shape.clone());
            tensors.push(Some(I::float_from_data(data, &slot.device)));
        }
        Ok((tensors, Some(timing)))
    }
}
