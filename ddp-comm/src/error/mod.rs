//! The crate's error type: one variant per failure, each naming the op, rank, key or size; and
//! the NCCL errors it carries (`nccl.rs`).

#[cfg(feature = "cuda")]
mod nccl;

#[cfg(feature = "cuda")]
pub use nccl::NcclError;
#[cfg(feature = "cuda")]
pub(crate) use nccl::hint as nccl_hint;
use std::io;
use std::time::Duration;

/// Result alias for ddp-comm.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// Everything that can go wrong in the store, in rendezvous and in collectives.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A configuration value (environment variable, URL, argument) is invalid.
    #[error("{what}: {reason}")]
    InvalidConfig {
        /// Which setting, e.g. `RANK` or `init method`.
        what: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A collective was called with buffers of the wrong size or a rank out of range.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The collective, e.g. `all_gather`.
        op: &'static str,
        /// What is wrong, with the sizes involved.
        reason: String,
    },
    /// The store could not be reached before the deadline.
    #[error(
        "could not reach the store at {addr} within {timeout:?}: {source} (is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?)"
    )]
    StoreUnreachable {
        /// The address tried.
        addr: String,
        /// How long we kept trying.
        timeout: Duration,
        /// The last connection error.
        #[source]
        source: io::Error,
    },
    /// The port for the store (or a rank's listener) is taken.
    #[error(
        "cannot listen on {addr}: {source} (is another job using this port? pick another MASTER_PORT)"
    )]
    Bind {
        /// The address we tried to bind.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The peer does not hold this job's token.
    #[error("{peer} rejected the job token: {reason}")]
    Unauthorized {
        /// Who rejected us (store address or rank).
        peer: String,
        /// Why, as the other side said it.
        reason: String,
    },
    /// A store call did not complete before its deadline.
    #[error("store {op} timed out after {timeout:?} waiting for key(s) {keys}")]
    StoreTimeout {
        /// `get` or `wait`.
        op: &'static str,
        /// The missing keys, comma separated.
        keys: String,
        /// The timeout that ran out.
        timeout: Duration,
    },
    /// The store answered something the client did not expect.
    #[error("store {op}: {reason}")]
    StoreProtocol {
        /// The request.
        op: &'static str,
        /// What was wrong with the answer.
        reason: String,
    },
    /// A peer did not send or accept data before the collective's deadline.
    #[error("{op}: timed out after {timeout:?} waiting for rank {peer}{detail}")]
    Timeout {
        /// The collective, with its sequence number.
        op: String,
        /// The global rank we were waiting for.
        peer: usize,
        /// The timeout that ran out.
        timeout: Duration,
        /// What the peer reported, if it reported anything.
        detail: String,
    },
    /// A peer closed its connection in the middle of the job.
    #[error("{op}: rank {peer} closed its connection (did the process exit?){detail}")]
    PeerClosed {
        /// The collective, with its sequence number.
        op: String,
        /// The global rank that went away.
        peer: usize,
        /// What the peer reported before leaving, if anything.
        detail: String,
    },
    /// A peer left a collective before its data moved, and this rank knows it without waiting
    /// for the timeout: over TCP, a peer it had to connect to reported a failure to the group,
    /// or its listener refused us (its group or its process ended); over MPI, a peer rejected
    /// its own arguments to the collective.
    #[error("{op}: rank {peer} {reason}{detail}")]
    PeerGone {
        /// The collective, with its sequence number.
        op: String,
        /// The global rank that is gone.
        peer: usize,
        /// How we know.
        reason: String,
        /// What the peer reported, if anything.
        detail: String,
    },
    /// Two ranks issued different collectives at the same position in the sequence.
    #[error(
        "collective #{seq} mismatch: rank {rank} called {ours} but rank {peer} called {theirs} (every rank must issue the same collectives in the same order)"
    )]
    Mismatch {
        /// The sequence number.
        seq: u64,
        /// This rank.
        rank: usize,
        /// What this rank called.
        ours: String,
        /// The other rank.
        peer: usize,
        /// What the other rank called.
        theirs: String,
    },
    /// A peer sent bytes that are not a valid frame, or a frame that is too large.
    #[error("{from} sent an invalid frame: {reason}")]
    Protocol {
        /// Who sent it.
        from: String,
        /// What was wrong.
        reason: String,
    },
    /// An I/O error with what we were doing at the time.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An MPI call failed (the `mpi` transport); MPI's own message says why.
    #[error("MPI {op} failed: {message} (MPI error code {code})")]
    Mpi {
        /// The MPI function, e.g. `MPI_Allreduce`.
        op: &'static str,
        /// MPI's error code.
        code: i32,
        /// MPI's description of the code.
        message: String,
    },
    /// An earlier collective failed, so the group can no longer be used.
    #[error("process group is unusable after an earlier failure: {0}")]
    Aborted(String),
    /// The communication thread is gone (the group was destroyed).
    #[error("process group was destroyed")]
    Destroyed,
    /// A CUDA or NCCL failure, or a machine without them (feature `cuda`).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// The collective watchdog failed the group: a collective did not finish within the
    /// timeout, or failed; names the collective and the ranks that are behind.
    #[error("collective watchdog: {0}")]
    Watchdog(std::sync::Arc<crate::failure::WatchdogFailure>),
    /// A rank-tagged wrapper, used when several ranks' failures are collected.
    #[error("rank {rank}: {source}")]
    WithRank {
        /// The rank that failed.
        rank: usize,
        /// Its error.
        #[source]
        source: Box<CommError>,
    },
}

impl CommError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn config(what: impl Into<String>, reason: impl Into<String>) -> Self {
        CommError::InvalidConfig {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Checks that `rank` is one of `world_size` ranks; `what` names the setting.
    pub(crate) fn check_rank(what: &str, rank: usize, world_size: usize) -> Result<(), Self> {
        if rank >= world_size {
            return Err(CommError::config(
                what,
                format!("rank {rank} is outside 0..{world_size} (the world size is {world_size})"),
            ));
        }
        Ok(())
    }

    pub(crate) fn arg(op: &'static str, reason: impl Into<String>) -> Self {
        CommError::InvalidArgument {
            op,
            reason: reason.into(),
        }
    }

    /// The global rank this error blames, when it blames one.
    pub fn peer(&self) -> Option<usize> {
        match self {
            CommError::Timeout { peer, .. }
            | CommError::PeerClosed { peer, .. }
            | CommError::PeerGone { peer, .. }
            | CommError::Mismatch { peer, .. } => Some(*peer),
            CommError::WithRank { source, .. } => source.peer(),
            _ => None,
        }
    }
}

/// The text of a caught panic's payload (`&str` or `String`, as `panic!` makes them), for the
/// error that replaces the panic: a thread or a step that panicked fails with a reason the
/// peers can quote.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
