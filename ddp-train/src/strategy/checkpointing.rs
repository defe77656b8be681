//! Rank 0's epoch-end checkpointer for [`DdpStrategy::with_checkpoints`](crate::DdpStrategy::with_checkpoints):
//! burn-train's `LearningCheckpointer` over the crate's atomic file writers, and the slot
//! where a failed write waits for the epoch loop to see it. Apart from the run because it is
//! only wiring of burn-train's types.

use crate::checkpoint::{AtomicFileCheckpointer, FailureSlot};
use crate::components::DdpComponents;
use crate::error::DdpTrainError;
use burn_train::LearningCheckpointer;
use burn_train::checkpoint::{
    AsyncCheckpointer, ComposedCheckpointingStrategy, KeepLastNCheckpoints,
    MetricCheckpointingStrategy,
};
use burn_train::metric::LossMetric;
use burn_train::metric::store::{Aggregate, Direction, Split};
use std::path::Path;
use std::sync::PoisonError;

/// The failure a checkpoint write left in `slot`, if any (also after a panic while held).
pub(super) fn lock_failure(slot: &FailureSlot) -> std::sync::MutexGuard<'_, Option<DdpTrainError>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// burn-train's checkpointer over [`AtomicFileCheckpointer`]s (rank 0 only), with burn-train's
/// default choice of epochs to keep. A failed write stops training through `interrupter` (as
/// burn's own does) and is kept in `failure`.
pub(super) fn atomic_checkpointer<LC: DdpComponents>(
    dir: &Path,
    failure: &FailureSlot,
    interrupter: &burn_train::Interrupter,
) -> LearningCheckpointer<LC> {
    let file = |kind| AtomicFileCheckpointer::new(dir.to_path_buf(), kind, failure.clone());
    let keep = ComposedCheckpointingStrategy::builder()
        .add(KeepLastNCheckpoints::new(2))
        .add(MetricCheckpointingStrategy::new(
            &LossMetric::<LC::Backend>::new(),
            Aggregate::Mean,
            Direction::Lowest,
            Split::Valid,
        ))
        .build();
    LearningCheckpointer::new(
        AsyncCheckpointer::new(file("model")).with_interrupter(interrupter.clone()),
        AsyncCheckpointer::new(file("optim")).with_interrupter(interrupter.clone()),
        AsyncCheckpointer::new(file("scheduler")).with_interrupter(interrupter.clone()),
        Box::new(keep),
    )
}
