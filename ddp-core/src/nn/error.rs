//! [`SyncBatchNormError`]: what can go wrong in a synchronised batch norm.

use ddp_comm::CommError;

/// Failures of [`SyncBatchNorm::try_forward`](super::SyncBatchNorm::try_forward) and
/// [`SyncBatchNormGroup::new`](super::SyncBatchNormGroup::new).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncBatchNormError {
    /// A collective failed (a peer died, stalled, or called something else).
    #[error("SyncBatchNorm: {context}: {source}")]
    Comm {
        /// What was being all-reduced.
        context: &'static str,
        /// The communication error.
        #[source]
        source: CommError,
    },
    /// `new_group` did not make this rank a member (it was given another rank's group).
    #[error(
        "SyncBatchNormGroup: this rank is not a member of the subgroup of ranks {ranks:?}; pass \
         the process group this rank trains with"
    )]
    NotAMember {
        /// The ranks of the group given.
        ranks: Vec<usize>,
    },
    /// The input has fewer than two dimensions.
    #[error(
        "SyncBatchNorm expects an input [batch, channels, ...] of rank 2 or more, got rank {0}"
    )]
    InputRank(usize),
    /// The input's channel dimension does not match the layer.
    #[error("SyncBatchNorm: the input has {got} channels (dimension 1), the layer has {expected}")]
    Channels {
        /// Channels of the input.
        got: usize,
        /// Features of the layer.
        expected: usize,
    },
    /// No rank had a sample, so there are no statistics to normalise with.
    #[error(
        "SyncBatchNorm: the global batch is empty on every rank; training needs at least one \
         value per channel"
    )]
    EmptyGlobalBatch,
    /// Every rank together had one value per channel: its variance is 0, so the output would be
    /// `beta` whatever the input, and no gradient would reach the input (PyTorch refuses it too).
    #[error(
        "SyncBatchNorm: the global batch holds one value per channel (over every rank); training \
         needs more than one: use larger batches, or evaluation mode"
    )]
    OneValuePerChannel,
}
