//! Writing the step timeline ([`DdpConfig::timeline_path`]): rank 0 rewrites the whole Chrome
//! trace after each recorded step, so a run that dies still leaves a readable file.
//!
//! [`DdpConfig::timeline_path`]: crate::DdpConfig::timeline_path

use super::DistributedDataParallel;
use crate::ddp::timeline::StepTimes;
use crate::engine::tap::TapBackend;
use burn::module::AutodiffModule;

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// Adds a synchronised step to the timeline and rewrites its file (rank 0, the first
    /// [`DdpConfig::timeline_steps`](crate::DdpConfig::timeline_steps) steps).
    pub(super) fn record(&mut self, times: &StepTimes) {
        let Some(t) = self.timeline.as_mut() else {
            return;
        };
        if self.step as usize > self.config.timeline_steps {
            return;
        }
        t.record_step(self.step, times);
        self.write_timeline();
    }

    /// Rewrites the timeline file with everything recorded so far. A file that cannot be
    /// written (a missing directory, a full disk) turns the timeline off with a warning: a
    /// diagnostics option must not end a training run, let alone abort its peers.
    pub(super) fn write_timeline(&mut self) {
        let (Some(t), Some(path)) = (self.timeline.as_ref(), self.config.timeline_path.as_ref())
        else {
            return;
        };
        if let Err(error) = std::fs::write(path, t.to_json()) {
            tracing::warn!(
                path = %path,
                %error,
                "could not write the DDP timeline; it is off for the rest of this run"
            );
            self.timeline = None;
        }
    }
}
