//! Writing the step timeline ([`DdpConfig::timeline_path`]): rank 0 rewrites the whole Chrome
//! trace after each recorded step, so a run that dies still leaves a readable file.
//!
//! [`DdpConfig::timeline_path`]: crate::DdpConfig::timeline_path

use super::DistributedDataParallel;
use crate::ddp::timeline::StepTimes;
use crate::engine::tap::TapBackend;
use crate::error::DdpError;
use burn::module::AutodiffModule;

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// Adds a synchronised step to the timeline and rewrites its file (rank 0, the first
    /// [`DdpConfig::timeline_steps`](crate::DdpConfig::timeline_steps) steps).
    pub(super) fn record(&mut self, times: &StepTimes) -> Result<(), DdpError> {
        let Some(t) = self.timeline.as_mut() else {
            return Ok(());
        };
        if self.step as usize > self.config.timeline_steps {
            return Ok(());
        }
        t.record_step(self.step, times);
        self.write_timeline()
    }

    /// Rewrites the timeline file with everything recorded so far.
    pub(super) fn write_timeline(&self) -> Result<(), DdpError> {
        let (Some(t), Some(path)) = (self.timeline.as_ref(), self.config.timeline_path.as_ref())
        else {
            return Ok(());
        };
        std::fs::write(path, t.to_json()).map_err(|source| DdpError::Timeline {
            path: path.clone(),
            source,
        })
    }
}
