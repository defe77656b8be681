//! [`NcclBackendConfig`]: who this rank is and which GPU it drives.

use crate::deadline::check_timeout;
use crate::error::{CommError, Result};
use crate::setters::setters;
use std::time::Duration;

/// How long an NCCL collective may run, and the group may take to form, by default: 10
/// minutes, PyTorch's default for NCCL process groups.
pub const NCCL_DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Settings of an [`NcclBackend`](super::NcclBackend), in burn's config style:
/// `NcclBackendConfig::new(rank, world_size, local_rank).with_name("tensor-parallel")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclBackendConfig {
    /// This process's rank in the group, `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the group.
    pub world_size: usize,
    /// The CUDA device ordinal this rank drives, normally `LOCAL_RANK`. NCCL cannot put two
    /// ranks of one communicator on the same device.
    pub device: usize,
    /// The group's name, part of the store key its NCCL unique id is published under; unique
    /// among the NCCL groups that meet through one store.
    pub name: String,
    /// How long the ranks may take to form the communicator, and each collective may run
    /// (from when it is queued to when it finishes on the GPU), before the group is aborted
    /// with an error naming the collective and the ranks behind ([`CommError::Watchdog`]).
    /// Defaults to [`NCCL_DEFAULT_TIMEOUT`] (10 minutes); a process group's backend ([`ProcessGroup::nccl`](crate::ProcessGroup::nccl))
    /// takes the process group's (`DDP_TIMEOUT_SECS`).
    pub timeout: Duration,
}

impl NcclBackendConfig {
    /// A group of `world_size` ranks in which this process is `rank` and drives `device`.
    /// The name defaults to `default`.
    pub fn new(rank: usize, world_size: usize, device: usize) -> Self {
        NcclBackendConfig {
            rank,
            world_size,
            device,
            name: "default".into(),
            timeout: NCCL_DEFAULT_TIMEOUT,
        }
    }

    setters! {
        /// Sets the timeout.
        pub fn with_timeout(timeout: Duration) => timeout;
        /// Sets the group's name.
        pub fn with_name(name: impl Into<String>) => name = name.into();
        /// Sets the device ordinal.
        pub fn with_device(device: usize) => device;
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.world_size == 0 || i32::try_from(self.world_size).is_err() {
            return Err(CommError::config(
                "nccl world size",
                format!("{} is not between 1 and 2^31-1", self.world_size),
            ));
        }
        CommError::check_rank("nccl rank", self.rank, self.world_size)?;
        check_timeout("nccl timeout", self.timeout)?;
        if self.name.is_empty() {
            return Err(CommError::config(
                "nccl group name",
                "the name is empty; give each group a name",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_outside_world_is_rejected() {
        let e = NcclBackendConfig::new(2, 2, 0).validate().unwrap_err();
        assert!(e.to_string().contains("rank 2 is outside 0..2"), "{e}");
        assert!(NcclBackendConfig::new(0, 0, 0).validate().is_err());
        assert!(
            NcclBackendConfig::new(0, 1, 0)
                .with_name("")
                .validate()
                .is_err()
        );
        assert!(NcclBackendConfig::new(1, 2, 1).validate().is_ok());
        assert!(
            NcclBackendConfig::new(0, 1, 0)
                .with_timeout(std::time::Duration::ZERO)
                .validate()
                .is_err()
        );
        assert_eq!(
            NcclBackendConfig::new(0, 1, 0).timeout,
            NCCL_DEFAULT_TIMEOUT
        );
    }
}
