//! [`GpuClock`]: maps CUDA events onto the host's clock, for [`NcclWork`](super::NcclWork)'s
//! timings.
//!
//! The group records an anchor event on its idle stream when it starts and notes the host time
//! right after the event completed. An event's host time is the anchor's plus the GPU time
//! between the two (`cuEventElapsedTime`). The anchor's host time is late by the
//! synchronisation's latency (microseconds); the GPU time is an `f32` count of milliseconds,
//! so its resolution coarsens with the group's age: about 0.5 µs (the event resolution) for a
//! few seconds, 0.25 ms after an hour. Drift between the GPU's and the host's clocks adds a few
//! ppm.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, DriverError};
use std::time::{Duration, Instant};

/// The anchor of a group's GPU-to-host time mapping.
#[derive(Debug)]
pub(crate) struct GpuClock {
    anchor: CudaEvent,
    anchor_host: Instant,
}

impl GpuClock {
    /// Anchors on `stream`, which must have no work queued yet (or it waits for that work).
    pub(crate) fn start(stream: &CudaStream) -> Result<GpuClock, DriverError> {
        let anchor = timed_event(stream)?;
        anchor.synchronize()?;
        Ok(GpuClock {
            anchor,
            anchor_host: Instant::now(),
        })
    }

    /// When `event` (recorded with timing, and complete) happened, on the host clock.
    pub(crate) fn host_time(&self, event: &CudaEvent) -> Result<Instant, DriverError> {
        let ms = self.anchor.elapsed_ms(event)?;
        let after = Duration::try_from_secs_f64(f64::from(ms) / 1e3).unwrap_or(Duration::ZERO);
        Ok(self
            .anchor_host
            .checked_add(after)
            .unwrap_or(self.anchor_host))
    }
}

/// Records an event with timing on `stream` (cudarc's default disables timing).
pub(crate) fn timed_event(stream: &CudaStream) -> Result<CudaEvent, DriverError> {
    stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
}
