//! [`NcclError`]: what can go wrong with CUDA and NCCL, each variant saying what to do.

use cudarc::driver::DriverError;
use cudarc::nccl::sys::ncclResult_t;

/// A failure of the CUDA driver or of NCCL. Reaches callers as
/// [`CommError::Nccl`](crate::CommError::Nccl).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// The CUDA driver library cannot be loaded (no NVIDIA driver on this machine).
    #[error(
        "no CUDA driver found (libcuda could not be loaded): run on a machine with an NVIDIA GPU and driver, or use a CPU process group (ProcessGroup) instead"
    )]
    DriverNotFound,
    /// The NCCL library cannot be loaded.
    #[error(
        "NCCL not found (libnccl could not be loaded; tried {candidates}): install NCCL (e.g. the libnccl2 package or pip's nvidia-nccl-cu12) and add its directory to LD_LIBRARY_PATH"
    )]
    LibraryNotFound {
        /// The file names cudarc looks for, comma separated.
        candidates: String,
    },
    /// The requested device ordinal is not visible to this process.
    #[error(
        "CUDA device {device} does not exist: this process sees {count} device(s) (check LOCAL_RANK and CUDA_VISIBLE_DEVICES)"
    )]
    NoSuchDevice {
        /// The ordinal asked for.
        device: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[error("cuda {op} on device {device}: {source}")]
    Cuda {
        /// What we were doing, e.g. `copying to the device`.
        op: &'static str,
        /// The device ordinal.
        device: usize,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// An NCCL call failed; the group is unusable afterwards.
    #[error(
        "nccl {op} on rank {rank} of group '{group}' failed with {code:?} ({hint}){detail}; set NCCL_DEBUG=WARN for NCCL's own report"
    )]
    Nccl {
        /// The call, e.g. `all_reduce` or `init`.
        op: &'static str,
        /// The group's name.
        group: String,
        /// This rank in the group.
        rank: usize,
        /// NCCL's result code.
        code: ncclResult_t,
        /// What the code usually means.
        hint: &'static str,
        /// NCCL's last error message, when it has one (starts with `: `).
        detail: String,
    },
    /// Not every rank joined the communicator within the group's timeout; the half-made
    /// communicator was aborted.
    #[error(
        "NCCL group '{group}': rank {rank} could not join the communicator of {world_size} ranks within {timeout:?}; the init was aborted. Check that every rank started and called NcclBackend::new with the same group name and world size, that the hosts reach each other (NCCL_SOCKET_IFNAME, firewalls), and set NCCL_DEBUG=INFO for NCCL's own report"
    )]
    InitTimeout {
        /// The group's name.
        group: String,
        /// This rank.
        rank: usize,
        /// The group's size.
        world_size: usize,
        /// The timeout that ran out.
        timeout: std::time::Duration,
    },
    /// The store holds something under the unique-id key that is not an NCCL unique id.
    #[error(
        "store key '{key}' holds {len_bytes} bytes, not a {expected}-byte NCCL unique id (is another program using this key?)"
    )]
    BadUniqueId {
        /// The key.
        key: String,
        /// How many bytes it holds.
        len_bytes: usize,
        /// How many an id has.
        expected: usize,
    },
    /// Rank 0 found a unique id already published under the group's key.
    #[error(
        "an NCCL unique id is already published under store key '{key}': each NCCL group needs a name that is unique within its store (NcclBackendConfig::with_name)"
    )]
    NameInUse {
        /// The key.
        key: String,
    },
}

impl NcclError {
    /// Whether this machine cannot run NCCL at all (no driver, no libnccl, no such device), as
    /// opposed to a failure while running. Tests and benchmarks use it to skip.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            NcclError::DriverNotFound
                | NcclError::LibraryNotFound { .. }
                | NcclError::NoSuchDevice { .. }
        )
    }

    pub(crate) fn cuda(op: &'static str, device: usize) -> impl FnOnce(DriverError) -> Self {
        move |source| NcclError::Cuda { op, device, source }
    }
}

/// What an NCCL result code usually means, for error messages (NCCL's own strings are terse).
pub(crate) fn hint(code: ncclResult_t) -> &'static str {
    match code {
        ncclResult_t::ncclUnhandledCudaError => "a CUDA call inside NCCL failed",
        ncclResult_t::ncclSystemError => {
            "a system call failed: network, shared memory (/dev/shm size) or a peer process"
        }
        ncclResult_t::ncclInternalError => "internal NCCL error or a bug in a peer",
        ncclResult_t::ncclInvalidArgument => "invalid argument: buffer, count, type or root",
        ncclResult_t::ncclInvalidUsage => {
            "invalid usage: two ranks on one GPU, mismatched calls, or a destroyed communicator"
        }
        ncclResult_t::ncclRemoteError => "a peer failed or went away",
        _ => "unexpected result",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_driver_message_says_what_to_do() {
        let msg = NcclError::DriverNotFound.to_string();
        assert!(msg.starts_with("no CUDA driver found (libcuda could not be loaded)"));
        assert!(NcclError::DriverNotFound.is_unavailable());
    }

    #[test]
    fn init_timeout_names_the_group_and_what_to_check() {
        let e = NcclError::InitTimeout {
            group: "world".into(),
            rank: 1,
            world_size: 4,
            timeout: std::time::Duration::from_secs(5),
        };
        let msg = e.to_string();
        assert!(
            msg.contains(
                "NCCL group 'world': rank 1 could not join the communicator of 4 ranks within 5s"
            ),
            "{msg}"
        );
        assert!(msg.contains("same group name and world size"), "{msg}");
        assert!(!e.is_unavailable());
    }

    #[test]
    fn nccl_failure_names_op_rank_group_and_code() {
        let e = NcclError::Nccl {
            op: "all_reduce",
            group: "world".into(),
            rank: 3,
            code: ncclResult_t::ncclRemoteError,
            hint: hint(ncclResult_t::ncclRemoteError),
            detail: String::new(),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("nccl all_reduce on rank 3 of group 'world'"),
            "{msg}"
        );
        assert!(msg.contains("ncclRemoteError"), "{msg}");
        assert!(!e.is_unavailable());
    }
}
