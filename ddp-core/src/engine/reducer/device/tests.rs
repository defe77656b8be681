//! Tests of the device engine as a whole, and [`ScriptedDevice`], the device the unit tests of
//! its parts (the issuing thread, the calling thread's collectives) run on: it records what it
//! is asked and fails as a test says, with no communicator behind it.

use super::{DeviceCollective, DeviceWork, FlatTensor, Readiness, ReductionDevice};
use crate::error::DdpError;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::watchdog::CollectiveLabel;
use ddp_comm::{CommError, WorkTiming};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// A device that records what it is asked, in order; a fence is its own outcome; its
/// collectives fail as `fail` says (they finish at once without it); its memory counts its
/// drops (a drop is memory given back to the pool).
#[derive(Clone, Default)]
pub(super) struct ScriptedDevice {
    calls: Arc<Mutex<Vec<String>>>,
    fail: Option<fn() -> CommError>,
    pub(super) drops: Arc<AtomicUsize>,
}

impl ScriptedDevice {
    /// A device whose collectives fail with `fail()`.
    pub(super) fn failing(fail: fn() -> CommError) -> ScriptedDevice {
        ScriptedDevice {
            fail: Some(fail),
            ..ScriptedDevice::default()
        }
    }

    fn log(&self, what: String) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// What it was asked, in order: `fence <outcome>`, `<collective> <bucket>`, `abort
    /// <reason>`.
    pub(super) fn calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Memory as `stage` makes it.
    pub(super) fn memory(&self) -> Counted {
        Counted(self.drops.clone())
    }
}

/// A scripted device's memory: counts its drops.
pub(super) struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A collective that finished as it was queued.
pub(super) struct Done;

impl DeviceWork for Done {
    fn wait(self) -> Result<WorkTiming, CommError> {
        let now = Instant::now();
        Ok(WorkTiming {
            queued: now,
            started: now,
            finished: now,
        })
    }
}

impl ReductionDevice for ScriptedDevice {
    type Memory = Counted;
    type Fence = Result<(), String>;
    type Work = Done;

    fn name(&self) -> &'static str {
        "the scripted device"
    }

    fn stage<I: Backend>(
        &self,
        _: FlatTensor<I>,
        _: &str,
    ) -> Result<(Counted, Result<(), String>), DdpError> {
        Ok((self.memory(), Ok(())))
    }

    fn wait_ready(&self, fence: Result<(), String>) -> Result<(), String> {
        self.log(format!("fence {fence:?}"));
        fence
    }

    fn wait_ready_until(
        &self,
        _: Vec<Result<(), String>>,
        _: Instant,
    ) -> Result<Readiness, String> {
        Ok(Readiness::Ready)
    }

    fn queue(
        &self,
        collective: DeviceCollective<'_, Counted>,
        label: CollectiveLabel,
    ) -> Result<Done, CommError> {
        self.log(format!("{} {:?}", collective.op(), label.bucket));
        match self.fail {
            Some(fail) => Err(fail()),
            None => Ok(Done),
        }
    }

    fn check(&self) -> Result<(), CommError> {
        Ok(())
    }

    fn abort(&self, reason: &str) -> CommError {
        self.log(format!("abort {reason}"));
        CommError::Aborted(reason.to_string())
    }

    fn unstage<I: Backend>(&self, _: Counted, _: &I::Device) -> Result<FloatTensor<I>, DdpError> {
        Err(DdpError::Internal("never unstaged".into()))
    }
}

/// The NCCL engine and its stand-in are one protocol over two devices (type aliases of
/// [`DeviceReduction`](super::DeviceReduction)): what the stand-in's tests prove about the
/// issuing thread, the order, the watchdog and abort holds for NCCL. This fails if either
/// becomes an engine of its own.
#[test]
fn the_nccl_engine_and_its_stand_in_share_the_protocol() {
    let engine = "ddp_core::engine::reducer::device::engine::DeviceReduction<";
    let stand_in = std::any::type_name::<super::StandInReduction>();
    assert!(stand_in.starts_with(engine), "{stand_in}");
    assert!(stand_in.ends_with("StandInDevice>"), "{stand_in}");
    #[cfg(feature = "cuda")]
    {
        let nccl = std::any::type_name::<super::NcclReduction>();
        assert!(nccl.starts_with(engine), "{nccl}");
        assert!(nccl.ends_with("NcclDevice>"), "{nccl}");
    }
}
