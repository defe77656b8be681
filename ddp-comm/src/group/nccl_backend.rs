//! A process group's CUDA backend: [`ProcessGroup::nccl`].
//!
//! As c10d's `ProcessGroupNCCL` is a backend of a PyTorch process group, NCCL here is a
//! backend of [`ProcessGroup`], not a second kind of group: the same ranks, met through the
//! group's store, created on first use and kept (and aborted, and destroyed) with the group.

use super::process_group::ProcessGroup;
use crate::error::{CommError, Result};
use crate::nccl::{NcclBackend, NcclBackendConfig};
use std::sync::PoisonError;

/// The store name of a group's NCCL communicator (the group's store is its own namespace).
const NAME: &str = "process-group";

impl NcclBackendConfig {
    /// The same ranks as `pg`, each on the device of its `LOCAL_RANK`, with `pg`'s timeout.
    pub fn for_process_group(pg: &ProcessGroup) -> Self {
        Self::new(pg.rank(), pg.world_size(), pg.local_rank()).with_timeout(pg.timeout())
    }
}

impl ProcessGroup {
    /// This group's NCCL backend, with this rank driving CUDA device `device` (usually
    /// [`local_rank`](Self::local_rank)): collectives on device buffers between the same ranks.
    ///
    /// The first call creates the communicator: rank 0 publishes NCCL's unique id in the
    /// group's store, every rank joins, with the group's timeout. Later calls, from any clone
    /// of the group, return the same backend. It is destroyed with the group, and
    /// [`abort`](Self::abort) aborts it too. A subgroup ([`new_group`](Self::new_group)) has a
    /// backend of its own.
    ///
    /// # Collective
    /// The first call is collective: every rank of the group makes it, each with its own
    /// device.
    ///
    /// # Errors
    /// A later call with another device ([`CommError::InvalidArgument`]: a group's backend
    /// drives one device per rank, as `device_id` binds a PyTorch group; create a subgroup for
    /// another). Creation errors are [`NcclBackend::new`]'s, among them
    /// [`NcclError::is_unavailable`](crate::NcclError::is_unavailable) when this machine has no
    /// driver, libnccl or such device. After a failed creation, a retry fails on rank 0 (the
    /// name is used); create a new group instead.
    pub fn nccl(&self, device: usize) -> Result<NcclBackend> {
        let mut slot = self
            .inner
            .nccl
            .backend
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(backend) = slot.as_ref() {
            if backend.device() != device {
                return Err(CommError::arg(
                    "ProcessGroup::nccl",
                    format!(
                        "group `{}`'s NCCL backend drives device {} on this rank, not {device}; \
                         use new_group for a communicator on another device",
                        self.name(),
                        backend.device()
                    ),
                ));
            }
            return Ok(backend.clone());
        }
        let config = NcclBackendConfig::for_process_group(self)
            .with_device(device)
            .with_name(NAME);
        let backend = NcclBackend::new(self.store(), config)?;
        tracing::info!(
            group = self.name(),
            rank = self.rank(),
            device,
            "NCCL backend created"
        );
        *slot = Some(backend.clone());
        Ok(backend)
    }
}
