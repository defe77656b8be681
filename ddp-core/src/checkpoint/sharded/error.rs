//! [`ShardedCheckpointError`]: what a sharded save or load can fail with beyond the errors
//! the rank-0 checkpoints share ([`CheckpointError`]).

use super::super::error::{CheckpointError, StorageError};
use std::path::PathBuf;

/// Why a sharded checkpoint could not be saved, loaded or converted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardedCheckpointError {
    /// An error shared with rank-0 checkpoints: I/O, verification ([`CheckpointError::Invalid`]
    /// names the bad shard file), communication, a peer's failure.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// This rank cannot see the staging directory rank 0 created for the save: the ranks do
    /// not share the checkpoint directory. Nothing was committed.
    #[error(
        "rank {rank} cannot see the directory {path} that rank 0 created for this save: sharded \
         checkpoints need a filesystem every rank shares (NFS, Lustre, one machine) at the same \
         path; use the rank-0 FullCheckpointer otherwise"
    )]
    NotShared {
        /// This rank.
        rank: usize,
        /// The staging directory as this rank looked for it.
        path: PathBuf,
    },
    /// A rank reported its shard written and fsynced, but rank 0 cannot see it: the ranks do
    /// not share the checkpoint directory. Nothing was committed.
    #[error(
        "rank {rank} wrote its shard {path}, but rank 0 cannot see it ({found}): sharded checkpoints \
         need a filesystem every rank shares (NFS, Lustre, one machine); use the rank-0 FullCheckpointer otherwise"
    )]
    MissingShard {
        /// The rank whose shard is missing.
        rank: usize,
        /// The shard file as rank 0 looked for it.
        path: PathBuf,
        /// What rank 0 found instead (no such file, another size).
        found: String,
    },
    /// This rank holds optimizer state for parameters another rank owns under the checkpoint's
    /// partition, so writing only its own would lose state.
    #[error(
        "rank {rank} holds optimizer state for {count} parameter(s) it does not own under the \
         partition of world size {world_size}; save a replicated optimizer with save, a \
         ZeroRedundancyOptimizer of the same process group with save_state"
    )]
    ForeignOptimizerState {
        /// This rank.
        rank: usize,
        /// How many entries are not its own.
        count: usize,
        /// The world size the partition was computed for.
        world_size: usize,
    },
    /// A shard's optimizer state could not be serialised or decoded.
    #[error("optimizer state of shard {file}: {reason}")]
    OptimizerState {
        /// The shard file.
        file: String,
        /// The recorder's message.
        reason: String,
    },
    /// Two shards hold the same tensor or the same parameter's optimizer state.
    #[error("checkpoint {name}: {what} is held by more than one shard")]
    Duplicate {
        /// The checkpoint.
        name: String,
        /// The tensor path or parameter id.
        what: String,
    },
}

/// The storage layer's errors reach a sharded save as they reach a rank-0 one: inside
/// [`CheckpointError::Storage`], so one match arm sees both.
impl From<StorageError> for ShardedCheckpointError {
    fn from(e: StorageError) -> Self {
        ShardedCheckpointError::Checkpoint(e.into())
    }
}
