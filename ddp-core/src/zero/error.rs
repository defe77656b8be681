//! The errors of [`ZeroRedundancyOptimizer`](super::ZeroRedundancyOptimizer).

use crate::DdpError;
use crate::checkpoint::CheckpointError;

/// Failures of the sharded optimizer. Any of them aborts the process group (the peers fail at
/// once with this rank's reason) and makes the optimizer refuse later steps
/// ([`ZeroError::Poisoned`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZeroError {
    /// Broadcasting the updated parameters from their owners failed (a peer died, or sent
    /// bytes that do not fit this rank's model).
    #[error("sharing the parameters updated by rank {owner}: {source}")]
    Broadcast {
        /// The rank whose shard was being shared.
        owner: usize,
        /// What failed.
        #[source]
        source: DdpError,
    },
    /// Stage 2: reduce-scattering the gradients to their owners failed (a peer died, or
    /// called another collective).
    #[error("ZeRO stage 2: reduce-scattering the gradients to their owners: {source}")]
    ReduceGradients {
        /// What failed.
        #[source]
        source: ddp_comm::CommError,
    },
    /// Stage 2: all-gathering the updated parameters from their owners failed.
    #[error("ZeRO stage 2: all-gathering the updated parameters: {reason}")]
    GatherParameters {
        /// What went wrong.
        reason: String,
    },
    /// Stage 2: a collective on the device communicator (NCCL, or its CPU stand-in) failed.
    #[error("ZeRO stage 2: {op} on {communicator}: {reason}")]
    Device {
        /// The communicator: "NCCL", "the stand-in".
        communicator: &'static str,
        /// The collective: `reduce_scatter`, `all_gather`.
        op: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// Stage 2 cannot shard this parameter's gradient.
    #[error("ZeRO stage 2: parameter {parameter}: {reason}")]
    Unsupported {
        /// The parameter's id.
        parameter: String,
        /// Why.
        reason: String,
    },
    /// A trained parameter appears twice in the module (tied weights, such as an embedding
    /// shared with the output layer). ZeRO gives each tensor one owner; a tied parameter would
    /// get two, each stepping it, and the consolidated state would hold it twice.
    #[error(
        "ZeRO: parameter '{path}' is tied (the same parameter appears twice in the module): the \
         sharded optimizer needs each trained parameter once; train tied weights with \
         DistributedDataParallel and an unsharded optimizer"
    )]
    TiedParameter {
        /// The module path of the second appearance.
        path: String,
    },
    /// Setting stage 2 up on the DDP wrapper failed (registering its hook).
    #[error("ZeRO stage 2: registering the local-gradients hook on DDP: {0}")]
    Setup(#[source] DdpError),
    /// Gathering the shards' optimizer state on rank 0 failed.
    #[error("gathering the optimizer state on rank 0 ({context}): {reason}")]
    Consolidate {
        /// What was being done.
        context: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// Saving the consolidated state failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// An earlier step failed; the process group was aborted.
    #[error(
        "the sharded optimizer is unusable after an earlier error (the process group was \
         aborted): {first}; restart the job (with `--max-restarts` it resumes from the latest \
         checkpoint)"
    )]
    Poisoned {
        /// The first error.
        first: String,
    },
}
