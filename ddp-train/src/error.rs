//! Errors of the DDP training strategy.

use ddp_core::checkpoint::CheckpointError;
use ddp_core::{DdpError, comm::CommError, data::DataError};

/// What can go wrong while training with [`DdpStrategy`](crate::DdpStrategy) or loading with
/// [`DistributedLoader`](crate::DistributedLoader).
///
/// Every variant says which phase failed, so a rank's log line names the step without a
/// backtrace. A failure on one rank aborts the process group, so the other ranks report
/// [`DdpTrainError::Comm`] quoting it within about a second instead of waiting for a timeout.
#[derive(Debug, thiserror::Error)]
pub enum DdpTrainError {
    /// A collective failed (a peer died, stalled past the timeout, or aborted the group).
    #[error("{context}: {source}")]
    Comm {
        /// What this rank was doing.
        context: String,
        /// The process group's error (it names the peer and its reason).
        #[source]
        source: CommError,
    },
    /// ddp-core's data-parallel engine failed (building its buckets, or a step's gradient
    /// all-reduce: a peer failed, or the model does not fit the buckets).
    #[error("{context}: {source}")]
    Ddp {
        /// What this rank was doing.
        context: String,
        /// ddp-core's error (boxed: it is large, with the `cuda` feature larger still, and
        /// every `Result` of this crate would carry its size).
        #[source]
        source: Box<DdpError>,
    },
    /// The ranks do not hold the same model (number, shapes or kinds of parameters differ).
    #[error("the ranks hold different models: {0}")]
    ModelMismatch(String),
    /// Ranks ran different numbers of training steps in an epoch (an uneven sampler, or a
    /// loader that ended an epoch early): they cannot all-reduce the same gradients.
    #[error(
        "epoch {epoch}, step {step}: ranks {exhausted:?} have no batch left while others do; every rank must see the same number of batches (use DistributedLoader, which pads the last shard)"
    )]
    UnevenBatches {
        /// The epoch (1-based, as burn-train counts).
        epoch: usize,
        /// The step within the epoch (1-based).
        step: usize,
        /// Ranks without a batch.
        exhausted: Vec<usize>,
    },
    /// A metrics item could not be encoded or merged across ranks.
    #[error("syncing the metrics item of step {step}: {reason}")]
    ItemSync {
        /// The step within the epoch (1-based).
        step: usize,
        /// Why.
        reason: String,
    },
    /// The data pipeline failed (dataset, batcher or sampler settings).
    #[error("data loader: {0}")]
    Data(#[from] DataError),
    /// A [`DistributedLoader`](crate::DistributedLoader) could not load an epoch's batch on
    /// this rank (a dataset returning no item, a panicking dataset or batcher): the epoch
    /// cannot be completed, so the run fails (the other ranks report it as a
    /// [`Comm`](Self::Comm) error quoting this one).
    #[error(
        "epoch {epoch}: the {what} data failed to load (sampler epoch {sampler_epoch}): {source}"
    )]
    Loading {
        /// The epoch (1-based, as burn-train counts).
        epoch: usize,
        /// `"training"` or `"validation"`.
        what: &'static str,
        /// The epoch the sampler shuffled for (from 0).
        sampler_epoch: u64,
        /// ddp-data's error (it names the data set's index for a missing item).
        #[source]
        source: DataError,
    },
    /// Reading burn-train's checkpoint directory failed.
    #[error("reading the checkpoint directory {path}: {source}")]
    Io {
        /// The directory.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Writing, reading or decoding a checkpoint file failed (rank 0 writes and reads them).
    #[error("checkpoint file {path}: {reason}")]
    Checkpoint {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// ddp-core's checkpoint storage layer failed to write a file atomically or to read
    /// rank 0's files to every rank (the error names the file, or rank 0's failure).
    #[error("{context}: {source}")]
    CheckpointStorage {
        /// What this rank was doing.
        context: String,
        /// The storage layer's error (boxed, as [`Ddp`](Self::Ddp)'s).
        #[source]
        source: Box<CheckpointError>,
    },
    /// The ranks cannot resume together: they were given different epochs to resume from, or
    /// rank 0 could not provide the checkpoint.
    #[error("resuming: {0}")]
    Resume(String),
    /// The strategy's settings contradict each other (for example mid-epoch checkpoints
    /// without a checkpoint directory).
    #[error("DdpStrategy settings: {0}")]
    Settings(String),
    /// An earlier failure already ended this training run.
    #[error("the training run already failed: {0}")]
    Failed(String),
}

/// The `map_err` constructors of the variants that wrap an error of the layer below with what
/// this rank was doing: `$name(context)` makes the closure that builds `$variant`.
macro_rules! context_wrappers {
    ($($(#[$doc:meta])* $name:ident($source:ty) => $variant:ident;)*) => {
        impl DdpTrainError {
            $(
                $(#[$doc])*
                pub(crate) fn $name(context: impl Into<String>) -> impl FnOnce($source) -> Self {
                    let context = context.into();
                    move |source| DdpTrainError::$variant {
                        context,
                        source: source.into(),
                    }
                }
            )*
        }
    };
}

context_wrappers! {
    /// Wraps a [`CommError`] with what this rank was doing.
    comm(CommError) => Comm;
    /// Wraps a [`DdpError`] with what this rank was doing.
    ddp(DdpError) => Ddp;
    /// Wraps a [`CheckpointError`] of the storage layer with what this rank was doing.
    storage(CheckpointError) => CheckpointStorage;
}

/// Result alias of this crate.
pub type Result<T, E = DdpTrainError> = std::result::Result<T, E>;
