//! [`NcclWork`]: a device collective that was queued and returns at once, supervised by the
//! group's watchdog until it finishes on the GPU.

use super::clock::GpuClock;
use crate::error::NcclError;
use crate::error::Result;
use crate::watchdog::{CompletionProbe, WatchedWork};
use crate::work::WorkTiming;
use cudarc::driver::CudaEvent;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// An enqueued device collective, supervised by the watchdog. `Send`: wait for it on any
/// thread. Dropping it does not cancel the collective; the watchdog still supervises it.
#[derive(Debug)]
#[must_use = "a collective's completion is only known after `wait`"]
pub struct NcclWork {
    pub(crate) watched: WatchedWork,
    pub(crate) start: CudaEvent,
    pub(crate) end: Arc<CudaEvent>,
    pub(crate) clock: Arc<GpuClock>,
    pub(crate) queued: Instant,
    pub(crate) device: usize,
}

impl NcclWork {
    /// Blocks until the collective has finished on the GPU (its event completed), or the
    /// watchdog's error.
    ///
    /// The timing: `queued` is when the call was made (host clock); `started` and `finished`
    /// come from CUDA events recorded right before and right after the collective on the
    /// group's stream (GPU time, so `started` includes no host queueing and `finished` no
    /// polling delay), mapped onto the host clock through an anchor event recorded when the
    /// group started (accuracy: microseconds in the first seconds, about 0.25 ms after an hour
    /// of the group's life, see the crate's NCCL docs). They are clamped so that
    /// `queued <= started <= finished <= ` the moment the watchdog saw it complete.
    ///
    /// # Errors
    /// [`CommError::Watchdog`](crate::CommError::Watchdog) when the collective timed out or
    /// the communicator failed (the group is then aborted; every later call fails the same
    /// way); a CUDA error reading the events.
    pub fn wait(self) -> Result<WorkTiming> {
        // The watchdog polls every few milliseconds; a training step should not wait for its
        // next poll, so the end event is queried here too. The watchdog's verdict still
        // decides when the event does not complete (timeout, failure), and when it completed
        // only because the watchdog aborted the communicator.
        if self.poll_end_event() {
            self.watched.finish_observed()?;
        } else {
            self.watched.wait()?;
        }
        let seen = Instant::now();
        let op = "reading the collective's timing events";
        let started =
            (self.clock.host_time(&self.start)).map_err(NcclError::cuda(op, self.device))?;
        let finished =
            (self.clock.host_time(&self.end)).map_err(NcclError::cuda(op, self.device))?;
        let finished = finished.min(seen).max(self.queued);
        let started = started.max(self.queued).min(finished);
        Ok(WorkTiming {
            queued: self.queued,
            started,
            finished,
        })
    }

    /// Polls the end event until it completes (true) or the watchdog has settled the work,
    /// done or failed (false): yielding at first, then in short sleeps.
    fn poll_end_event(&self) -> bool {
        if self.end.context().bind_to_thread().is_err() {
            return false;
        }
        let mut polls = 0u32;
        loop {
            match self.end.try_is_complete() {
                Ok(true) => return true,
                Ok(false) if !self.watched.is_completed() => {}
                Ok(false) | Err(_) => return false,
            }
            polls = polls.saturating_add(1);
            if polls < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// Whether the collective has finished, or the group failed; never blocks.
    pub fn is_completed(&self) -> bool {
        self.watched.is_completed()
    }

    /// The collective's sequence number in the group (the first is 1), as the watchdog's
    /// reports and the store's `watchdog/<group>/<rank>` progress count them.
    pub fn seq(&self) -> u64 {
        self.watched.seq()
    }
}

/// Completion of a collective for the watchdog, which supervises it from before NCCL is
/// called: issuing can itself wait for the peers (NCCL connects them on a communicator's first
/// collectives), and that wait must be timed out and reported like any other. Not finished
/// until the end event recorded after the call is [set](EventProbe::set), then that event's.
#[derive(Default)]
pub(crate) struct EventProbe(OnceLock<Arc<CudaEvent>>);

impl EventProbe {
    /// The end event, once the collective is on the stream.
    pub(crate) fn set(&self, end: Arc<CudaEvent>) {
        let _ = self.0.set(end);
    }
}

impl CompletionProbe for EventProbe {
    fn poll(&self) -> std::result::Result<bool, String> {
        let Some(end) = self.0.get() else {
            return Ok(false);
        };
        // The watchdog's thread needs the event's context current for the query.
        end.context()
            .bind_to_thread()
            .map_err(|e| format!("binding the CUDA context to query an event: {e}"))?;
        end.try_is_complete()
            .map_err(|e| format!("CUDA event query: {e}"))
    }
}
