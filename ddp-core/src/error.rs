//! The errors of ddp-core's DDP wrapper.

use ddp_comm::CommError;

/// Failures of [`DistributedDataParallel`](crate::DistributedDataParallel).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DdpError {
    /// The ranks do not hold the same model.
    #[error("model mismatch across ranks: {0}")]
    ModelMismatch(String),
    /// A collective failed (a peer died, stalled, or disagreed).
    #[error("{context}: {source}")]
    Comm {
        /// What DDP was doing.
        context: &'static str,
        /// The communication error.
        #[source]
        source: CommError,
    },
    /// Serialising or loading the model record failed.
    #[error("{context}: {reason}")]
    Record {
        /// What DDP was doing.
        context: &'static str,
        /// The recorder's message.
        reason: String,
    },
    /// The wrapper was used in a way that cannot give correct gradients.
    #[error("{0}")]
    Misuse(String),
    /// The configuration is invalid.
    #[error("invalid DDP config: {0}")]
    InvalidConfig(String),
    /// Writing the timeline failed.
    #[error("writing the timeline to {path}: {source}")]
    Timeline {
        /// The trace file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl DdpError {
    pub(crate) fn comm(context: &'static str) -> impl FnOnce(CommError) -> DdpError {
        move |source| DdpError::Comm { context, source }
    }
}
