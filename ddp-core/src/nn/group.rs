//! [`SyncBatchNormGroup`]: the process group the statistics travel on.

use super::SyncBatchNormError;
use ddp_comm::ProcessGroup;

/// The group over which [`SyncBatchNorm`](super::SyncBatchNorm) layers sum their statistics: a
/// subgroup of every rank of the training group, with its own connections and communication
/// thread.
///
/// Why a group of its own: the statistics' gradients are all-reduced *during* backward, while
/// DDP's gradient buckets are in flight on the training group. On one group the two would have
/// to be queued in the same order on every rank, which holds only as long as burn visits the
/// graph in the same order everywhere and DDP launches buckets at the same points; on their own
/// group the statistics' collectives only need to agree among themselves (every rank runs the
/// same layers in the same order, forward and backward), and a bucket all-reduce never waits
/// behind a blocking statistics all-reduce. Create it once and share it between all layers
/// (clones share the connections).
///
/// A failure on it (in forward or backward) aborts the *training* group as well, with the
/// reason, so DDP's next collective fails on every rank instead of training on.
#[derive(Debug, Clone)]
pub struct SyncBatchNormGroup {
    stats: ProcessGroup,
    training: ProcessGroup,
}

impl SyncBatchNormGroup {
    /// A statistics group spanning every rank of `training` (the group DDP uses).
    ///
    /// # Collective
    /// Every rank of `training` calls it, in the same order relative to its other
    /// `new_group` calls (it creates a subgroup).
    ///
    /// # Errors
    /// The subgroup's rendezvous failed, or `training` was aborted.
    pub fn new(training: &ProcessGroup) -> Result<Self, SyncBatchNormError> {
        let ranks = training.ranks().to_vec();
        let stats = training
            .new_group(&ranks)
            .map_err(|source| SyncBatchNormError::Comm {
                context: "creating the statistics group",
                source,
            })?
            .ok_or(SyncBatchNormError::NotAMember { ranks })?;
        Ok(SyncBatchNormGroup {
            stats,
            training: training.clone(),
        })
    }

    /// The group the statistics are all-reduced on.
    pub fn stats_group(&self) -> &ProcessGroup {
        &self.stats
    }

    /// Number of ranks taking part.
    pub fn world_size(&self) -> usize {
        self.stats.world_size()
    }

    /// Aborts both groups with `reason` (used when a collective fails where no error can be
    /// returned, in backward).
    pub(crate) fn fail(&self, reason: &str) {
        tracing::error!(reason, "SyncBatchNorm: statistics all-reduce failed");
        self.stats.abort(reason);
        self.training.abort(reason);
    }
}
