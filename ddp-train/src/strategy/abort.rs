//! Ending a run on every rank at once: a failure or a panic on one rank aborts the process
//! group with its reason, so the peers blocked in a collective fail now, quoting it, instead
//! of at the timeout. Apart because every stage of the run (the whole of `fit`, each epoch's
//! loader, validation) runs inside this guard.

use super::DdpStrategy;
use crate::error::{DdpTrainError, Result};
use ddp_core::comm::panic_message;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

impl DdpStrategy {
    /// Records a failure and aborts the group, so peers blocked in a collective fail now with
    /// this reason instead of waiting for the timeout.
    pub(super) fn fail(&self, error: DdpTrainError) {
        let reason = error.to_string();
        tracing::error!(rank = self.pg.rank(), error = %reason, "DDP training failed; aborting the process group");
        if self.pg.world_size() > 1 {
            self.pg.abort(&reason);
        }
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some(error);
        }
    }

    /// Runs `body`; when it fails or panics, aborts the group at once with the reason, before
    /// the caller's locals are dropped: dropping a loader's iterator or burn's asynchronous
    /// checkpointers joins their threads (a batch or a file still being written), and the
    /// peers would wait in a collective meanwhile, maybe past the timeout. A panic is recorded
    /// (for [`finish`](Self::finish)) and unwinds on. Aborting twice does nothing.
    pub(super) fn abort_on_failure<T>(&self, body: impl FnOnce() -> Result<T>) -> Result<T> {
        match catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if self.pg.world_size() > 1 {
                    self.pg.abort(&error.to_string());
                }
                Err(error)
            }
            Err(panic) => {
                let reason = format!(
                    "rank {} panicked: {}",
                    self.pg.rank(),
                    panic_message(panic.as_ref())
                );
                tracing::error!(error = %reason, "DDP training panicked; aborting the process group");
                if self.pg.world_size() > 1 {
                    self.pg.abort(&reason);
                }
                let mut state = self.lock();
                if state.failure.is_none() {
                    state.failure = Some(DdpTrainError::Failed(reason));
                }
                drop(state);
                resume_unwind(panic)
            }
        }
    }
}
