//! Errors are final: the first error aborts the process group (peers fail at once, quoting this
//! rank's reason) and poisons the wrapper, which then refuses every call
//! ([`DdpError::Poisoned`]).

use super::DistributedDataParallel;
use crate::engine::tap::TapBackend;
use crate::error::DdpError;
use burn::module::AutodiffModule;

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// [`DdpError::Poisoned`] once an earlier call failed.
    pub(super) fn check_usable(&self) -> Result<(), DdpError> {
        match &self.poisoned {
            Some(first) => Err(DdpError::Poisoned {
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Makes an error final: aborts the group (peers fail now, with this reason) and poisons the
    /// wrapper.
    pub(super) fn guard<T>(&mut self, result: Result<T, DdpError>) -> Result<T, DdpError> {
        if let Err(e) = &result {
            let reason = e.to_string();
            tracing::error!(rank = self.pg.rank(), error = %reason, "DDP failed; aborting the process group");
            // The NCCL group first: its peers then quote this rank's reason, not the error a
            // peer gets once the process group is aborted.
            self.reduction.abort(&reason);
            if self.pg.world_size() > 1 {
                self.pg.abort(&reason);
            }
            self.passes.forget();
            self.poisoned = Some(reason);
        }
        result
    }

    /// Runs `f`, a part of a step that runs burn's backward; a panic in it (out of device
    /// memory, a kernel's assertion) is made final like an error before it unwinds on: the
    /// peers fail at once with this reason instead of waiting for the timeout, and a caller
    /// that catches the panic finds the wrapper poisoned, with nothing of the half-done step
    /// left to leak into the next one.
    pub(super) fn guard_panics<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Self) -> Result<T, DdpError>,
    ) -> Result<T, DdpError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))) {
            Ok(result) => self.guard(result),
            Err(panic) => {
                let message = ddp_comm::panic_message(&*panic);
                let _ = self.guard::<()>(Err(DdpError::Internal(format!(
                    "{what} panicked on rank {}: {message}",
                    self.pg.rank()
                ))));
                std::panic::resume_unwind(panic);
            }
        }
    }
}
