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
}
