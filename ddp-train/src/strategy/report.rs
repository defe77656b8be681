//! What a run did: the [`DdpReport`] `finish` returns, and the state every clone of a
//! [`DdpStrategy`](crate::DdpStrategy) shares while its run fills that report in or records
//! the error that ended it. Apart from the strategy's type because every stage of the run
//! counts into it.

use crate::error::DdpTrainError;
use crate::mid_epoch::ResumePoint;

/// What a finished run did, the same on every rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DdpReport {
    /// The last epoch that trained and validated (burn-train counts from 1).
    pub last_epoch: usize,
    /// The epoch after which rank 0's early-stopping strategy ended training.
    pub stopped_early_at: Option<usize>,
    /// Whether an interrupter (on any rank) ended training.
    pub interrupted: bool,
    /// Training steps (micro-batches) this rank ran.
    pub train_steps: u64,
    /// Optimizer steps (each one all-reduce of the gradients).
    pub optimizer_steps: u64,
    /// Gradient buckets all-reduced, summed over the optimizer steps.
    pub buckets: u64,
    /// Of [`buckets`](Self::buckets), those whose all-reduce was issued from inside the
    /// training step's backward (overlapped with it) rather than after it.
    pub buckets_launched_during_backward: u64,
    /// Gradients handed to their bucket at a [`layer_boundary`](ddp_core::layer_boundary)
    /// before the end of backward, summed over the optimizer steps (0 without boundaries).
    pub early_gradients: u64,
    /// Where this run resumed (an epoch end, or a step inside an epoch); `None` for a fresh
    /// start.
    pub resumed_from: Option<ResumePoint>,
    /// Mid-epoch checkpoints rank 0 wrote in this run
    /// ([`DdpStrategy::with_checkpoint_every_n_steps`](crate::DdpStrategy::with_checkpoint_every_n_steps); 0 on the other ranks).
    pub step_checkpoints: u64,
}

/// The report and the first failure of the last run, behind the strategy's lock.
#[derive(Debug, Default)]
pub(super) struct RunState {
    pub(super) report: DdpReport,
    pub(super) failure: Option<DdpTrainError>,
}
