//! [`DeviceReduction`]: the device engine's [`BucketReduction`], generic over the
//! [`ReductionDevice`] (NCCL on a GPU, or the CPU stand-in).
//!
//! # Ordering between the streams
//! A device's compute stream cannot always be made to wait on the communication stream's events
//! (cubecl 0.10 does not expose its CUDA stream), so [`BucketReduction::launch`], on the
//! backward thread, stages the flat bucket and takes its *ready fence* (for CUDA:
//! `client.sync()`, an event recorded on that thread's stream, returned at once), hands both to
//! the issuing thread ([`issuer`](super::issuer)) and returns. That thread waits on the host
//! for the fence only, then queues the collective on the communicator's stream. Only the
//! issuing thread blocks; backward goes on, and nothing waits for the whole device.
//! [`PendingBucket::wait`] returns once the collective has finished on the device, so every
//! later kernel that reads the slices sees the reduced values. That wait ends early when the
//! communicator fails (its watchdog bounds every collective), and when the issuing thread has
//! waited for a fence longer than the process group's timeout (a kernel that never ends).
//!
//! # Memory
//! The staged bucket is kept, unchanged and referenced only here, until its collective is done:
//! the device's pool cannot hand its memory to another tensor meanwhile. When the collective
//! fails it is never released (the device may still be writing it).

use super::issuer::{DeviceWait, Issue, Issued, Issuer, Staged, fence_stuck};
use super::{DeviceWork, FlatTensor, ReductionDevice, internal};
use crate::engine::reducer::flat_bucket::{FlatLayout, flatten, unflatten};
use crate::engine::reducer::reduction::{
    BucketReduction, FullBucket, PendingBucket, Reduced, Slot,
};
use crate::error::DdpError;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::{CommError, WorkTiming};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// How often a bucket's wait for the issuing thread checks the communicator and the fence wait.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Buckets averaged in place on the device by `D`'s communicator, while backward goes on.
pub(crate) struct DeviceReduction<D: ReductionDevice> {
    /// The issuing thread, which waits for each bucket's fence and queues its collective;
    /// stopped on drop.
    issuer: Issuer<D>,
    /// The device too, to abort its communicator from DDP's thread when a step fails.
    device: D,
    /// How long the issuing thread may wait for a fence (the process group's timeout).
    timeout: Duration,
}

impl<D: ReductionDevice> Drop for DeviceReduction<D> {
    fn drop(&mut self) {
        self.issuer.stop(&self.device, self.timeout);
    }
}

impl<D: ReductionDevice> DeviceReduction<D> {
    /// Starts the issuing thread of `rank` for `device`; a fence may take `timeout`.
    pub(crate) fn start(
        device: D,
        rank: usize,
        timeout: Duration,
    ) -> Result<DeviceReduction<D>, DdpError> {
        let issuer = Issuer::start(device.clone(), rank)?;
        Ok(DeviceReduction {
            issuer,
            device,
            timeout,
        })
    }
}

impl<I: Backend, D: ReductionDevice> BucketReduction<I> for DeviceReduction<D> {
    fn launch(&self, bucket: FullBucket<'_, I>) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
        let first = bucket
            .slots
            .first()
            .ok_or_else(|| internal("empty bucket"))?;
        let path = first.path.clone();
        let (flat, layout) = flatten(bucket.slots, bucket.grads)?;
        // On this (the backward) thread: the memory and the fence after the bucket's kernels.
        // Neither waits for the device.
        let (memory, ready) = self.device.stage::<I>(
            FlatTensor {
                tensor: flat,
                len: layout.len,
                dtype: first.dtype,
            },
            &path,
        )?;
        let flight = self.send(
            Staged::AllReduce(memory),
            vec![ready],
            bucket.position.index,
            path,
        )?;
        Ok(Box::new(BucketInFlight { flight, layout }))
    }

    fn abort(&self, reason: &str) {
        // The peers' watchdogs read `reason` from the store (every second) and fail too.
        let e = self.device.abort(reason);
        tracing::debug!(error = %e, communicator = self.device.name(), "aborted the bucket communicator");
    }
}

impl<D: ReductionDevice> DeviceReduction<D> {
    /// Hands staged memory to the issuing thread, behind every collective handed to it before.
    fn send(
        &self,
        staged: Staged<D>,
        ready: Vec<D::Fence>,
        bucket: usize,
        path: String,
    ) -> Result<InFlight<D>, DdpError> {
        let (reply, issued) = mpsc::channel();
        let job_path = path.clone();
        let job = Issue {
            staged,
            ready,
            bucket,
            path,
            reply,
        };
        self.issuer.send(job).map_err(internal)?;
        Ok(InFlight {
            issued: Some(issued),
            path: job_path,
            device: self.device.clone(),
            device_wait: self.issuer.device_wait.clone(),
            timeout: self.timeout,
        })
    }

    /// On the backward thread: stages the unit's flat gradient and a zeroed chunk, and queues
    /// their reduce-scatter (`Avg`) behind every collective launched before, as
    /// [`launch`](BucketReduction::launch) does for a bucket. Neither waits for the device.
    pub(crate) fn launch_reduce_scatter<I: Backend>(
        &self,
        gradient: UnitGradient<I>,
        device: &I::Device,
    ) -> Result<ChunkInFlight<D>, DdpError> {
        let UnitGradient {
            unit,
            flat: send,
            len: send_len,
            chunk_len: recv_len,
        } = gradient;
        let path = format!("FSDP unit {unit}");
        let recv = I::float_zeros([recv_len].into(), device, burn::tensor::FloatDType::F32);
        let (recv, recv_ready) = self
            .device
            .stage(FlatTensor::<I>::f32(recv, recv_len), &path)?;
        let (send, send_ready) = self
            .device
            .stage(FlatTensor::<I>::f32(send, send_len), &path)?;
        let flight = self.send(
            Staged::ReduceScatter { send, recv },
            vec![recv_ready, send_ready],
            unit,
            path,
        )?;
        Ok(ChunkInFlight { flight })
    }
}

/// An FSDP unit's flat gradient for [`DeviceReduction::launch_reduce_scatter`]: `len` f32
/// elements, every rank's chunk of `chunk_len` one after another.
pub(crate) struct UnitGradient<I: Backend> {
    pub(crate) unit: usize,
    pub(crate) flat: FloatTensor<I>,
    pub(crate) len: usize,
    pub(crate) chunk_len: usize,
}

/// A bucket the device is reducing, and how to take it apart.
struct BucketInFlight<D: ReductionDevice> {
    flight: InFlight<D>,
    layout: FlatLayout,
}

/// An FSDP unit's reduce-scatter on the device.
pub(crate) struct ChunkInFlight<D: ReductionDevice> {
    flight: InFlight<D>,
}

impl<D: ReductionDevice> ChunkInFlight<D> {
    /// This rank's averaged chunk, once the collective is done.
    pub(crate) fn wait<I: Backend>(
        mut self,
        device: &I::Device,
    ) -> Result<FloatTensor<I>, DdpError> {
        let (staged, _) = self.flight.finish()?;
        match staged {
            Staged::ReduceScatter { send, recv } => {
                drop(send);
                self.flight.device.unstage::<I>(recv, device)
            }
            Staged::AllReduce(_) => Err(internal("a reduce-scatter came back as an all-reduce")),
        }
    }
}

/// A collective the device is running: its memory comes back with it, and is kept until it is
/// done.
struct InFlight<D: ReductionDevice> {
    issued: Option<mpsc::Receiver<Issued<D>>>,
    /// The collective's name and first parameter, for errors.
    path: String,
    /// To give up as soon as the communicator has failed.
    device: D,
    /// To give up, failing the communicator, once the issuing thread has waited for a fence
    /// longer than `timeout`.
    device_wait: Arc<DeviceWait>,
    timeout: Duration,
}

impl<D: ReductionDevice> InFlight<D> {
    /// The communicator's failure `e`, seen while waiting for the issuing thread. When that
    /// thread has meanwhile waited for a fence for over half the timeout, this rank's device is
    /// why (the peers failed waiting for its bucket, possibly before this rank's own limit):
    /// the error says so first.
    fn failed(&self, e: CommError) -> DdpError {
        match self.device_wait.longer_than(self.timeout / 2) {
            Some((what, waited)) => DdpError::Gradient {
                path: self.path.clone(),
                reason: format!(
                    "{} (the timeout is {:?}), and {} failed meanwhile: {e}",
                    fence_stuck(what, waited),
                    self.timeout,
                    self.device.name()
                ),
            },
            None => all_reduce_failed(e),
        }
    }

    fn finish(&mut self) -> Result<(Staged<D>, WorkTiming), DdpError> {
        let issued = self.issued.take().ok_or_else(|| internal("waited twice"))?;
        // The issuing thread answers once the device has produced the bucket (and every
        // bucket before it) and the communicator has queued it. Its calls are bounded by the
        // watchdog; its fence wait by the check here. On giving up, a reply that still comes
        // is dropped with `issued`, which frees the memory only if the collective finished.
        let answer = loop {
            match issued.recv_timeout(WAIT_SLICE) {
                Ok(answer) => break answer,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(internal("the issuing thread ended"));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = self.device.check() {
                        return Err(self.failed(e));
                    }
                    if let Some((what, waited)) = self.device_wait.longer_than(self.timeout) {
                        let reason = format!(
                            "{} (the timeout is {:?}): a kernel that never ends?",
                            fence_stuck(what, waited),
                            self.timeout
                        );
                        return Err(all_reduce_failed(self.device.abort(&reason)));
                    }
                }
            }
        };
        let (memory, work) = answer
            .into_parts()
            .ok_or_else(|| internal("a bucket came back empty"))?;
        let work = match work {
            Ok(work) => work,
            Err(not) => return Err(not.release(memory)),
        };
        match work.wait() {
            Ok(timing) => Ok((memory, timing)),
            Err(e) => {
                // Queued and failed: the device may still be writing it (an abort that did
                // not return in time): never give this memory back. A failed communicator ends
                // training, so this leaks the buckets of one step, once.
                std::mem::forget(memory);
                Err(all_reduce_failed(e))
            }
        }
    }
}

fn all_reduce_failed(e: CommError) -> DdpError {
    DdpError::comm(
        "reducing gradients on the device (a bucket's all-reduce, or a unit's reduce-scatter)",
    )(e)
}

impl<I: Backend, D: ReductionDevice> PendingBucket<I> for BucketInFlight<D> {
    fn wait(mut self: Box<Self>, slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError> {
        let (staged, timing) = self.flight.finish()?;
        let Staged::AllReduce(memory) = staged else {
            return Err(internal("a bucket came back as a reduce-scatter"));
        };
        let first = slots.first().ok_or_else(|| internal("empty bucket"))?;
        let flat = self.flight.device.unstage::<I>(memory, &first.device)?;
        Ok((unflatten(flat, &self.layout, slots)?, Some(timing)))
    }
}

impl<D: ReductionDevice> Drop for InFlight<D> {
    fn drop(&mut self) {
        // A bucket dropped unwaited (an error elsewhere in this backward): its memory must
        // outlive the collective, so wait for it (bounded by the communicator's watchdog).
        if self.issued.is_some()
            && let Err(e) = self.finish()
        {
            tracing::warn!(error = %e, "an abandoned device bucket failed");
        }
    }
}
