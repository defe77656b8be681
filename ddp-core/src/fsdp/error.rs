//! The errors of [`FullyShardedDataParallel`](super::FullyShardedDataParallel).

use crate::DdpError;
use crate::checkpoint::CheckpointError;
use crate::checkpoint::sharded::ShardedCheckpointError;

/// Failures of fully sharded training. A failed collective aborts the process group (the peers
/// fail at once with this rank's reason) and makes the wrapper refuse later calls
/// ([`FsdpError::Poisoned`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsdpError {
    /// A unit given to [`FsdpConfig::with_unit`](super::FsdpConfig::with_unit) names no
    /// trainable parameter of the model.
    #[error(
        "FSDP unit '{prefix}' matches no trainable parameter; the model's parameter paths \
         start with: {known}"
    )]
    UnitMatchesNothing {
        /// The unit's path prefix as given.
        prefix: String,
        /// The first segments of the model's parameter paths.
        known: String,
    },
    /// Every trainable parameter under a unit's prefix belongs to a longer unit prefix (the
    /// longest matching prefix wins), so the unit would hold nothing.
    #[error(
        "FSDP unit '{prefix}' would be empty: every trainable parameter under '{prefix}' belongs \
         to a longer unit prefix ({longer}), as the longest matching prefix wins; remove \
         '{prefix}' or the longer prefixes"
    )]
    UnitCoveredByLongerUnits {
        /// The unit's path prefix as given.
        prefix: String,
        /// The longer unit prefixes that took its parameters.
        longer: String,
    },
    /// A parameter that cannot be sharded.
    #[error("FSDP cannot shard parameter '{path}': {reason}")]
    Unsupported {
        /// The parameter's path in the module.
        path: String,
        /// Why.
        reason: String,
    },
    /// Setting up (checking that every rank holds the same model, taking rank 0's weights).
    #[error("FSDP setup: {0}")]
    Setup(#[source] DdpError),
    /// All-gathering a unit's parameters failed (a peer died, or called another collective).
    #[error("FSDP: all-gathering the parameters of unit '{unit}': {source}")]
    Gather {
        /// The unit's name.
        unit: String,
        /// What failed.
        #[source]
        source: ddp_comm::CommError,
    },
    /// Reduce-scattering a unit's gradients failed.
    #[error("FSDP: reduce-scattering the gradients of unit '{unit}': {source}")]
    ReduceScatter {
        /// The unit's name.
        unit: String,
        /// What failed.
        #[source]
        source: ddp_comm::CommError,
    },
    /// A unit's collective on the device communicator (NCCL, or its CPU stand-in) failed.
    #[error("FSDP: {op} of unit '{unit}' on the device: {reason}")]
    Device {
        /// The unit's name.
        unit: String,
        /// `reduce_scatter` or `all_gather`.
        op: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// Agreeing on which units any rank used this step failed (an all-reduce of one flag per
    /// unit, before the reduce-scatters).
    #[error("FSDP: agreeing on which units the ranks used: {0}")]
    UsedUnits(#[source] ddp_comm::CommError),
    /// A gradient handed over during backward could not be used (read from the device, or
    /// of the wrong size), or rank 0's unit order was invalid.
    #[error("FSDP backward: {0}")]
    Gradients(String),
    /// Broadcasting rank 0's buffers (batch-norm statistics) after backward failed.
    #[error("FSDP: broadcasting rank 0's buffers after backward: {0}")]
    BufferSync(#[source] DdpError),
    /// Saving or loading a checkpoint failed (I/O, verification, a peer's failure).
    #[error("FSDP checkpoint: {0}")]
    Checkpoint(#[from] ShardedCheckpointError),
    /// A unit's optimizer state could not be cut into its parameters' states (save) or joined
    /// into this rank's chunk (load).
    #[error("FSDP checkpoint: the optimizer state of unit '{unit}': {reason}")]
    CheckpointState {
        /// The unit's name.
        unit: String,
        /// What was wrong.
        reason: String,
    },
    /// `backward` was called with no forward since the last one.
    #[error(
        "FSDP: backward without a forward: call `forward` (which gathers the parameters) \
         before each `backward`"
    )]
    NoForward,
    /// An earlier call failed; the process group was aborted.
    #[error(
        "FSDP is unusable after an earlier error (the process group was aborted): {first}; \
         restart the job"
    )]
    Poisoned {
        /// The first error.
        first: String,
    },
}

impl From<CheckpointError> for FsdpError {
    fn from(e: CheckpointError) -> Self {
        FsdpError::Checkpoint(e.into())
    }
}
