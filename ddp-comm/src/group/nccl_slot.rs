//! Where a process group keeps its NCCL backend (see `ProcessGroup::nccl`).

use crate::nccl::NcclBackend;
use std::sync::Mutex;

/// The NCCL backend of one group, once created.
#[derive(Default)]
pub(crate) struct NcclSlot {
    pub(super) backend: Mutex<Option<NcclBackend>>,
}

impl NcclSlot {
    /// Aborts the backend if it exists (see `ProcessGroup::abort`); never waits for a
    /// creation in progress.
    pub(crate) fn abort(&self, reason: &str) {
        if let Ok(slot) = self.backend.try_lock()
            && let Some(backend) = slot.as_ref()
        {
            // The error it returns is for a caller that goes on; the group is failing anyway.
            let _ = backend.abort(reason);
        }
    }
}
