//! One run from burn-train's `fit`, around its epochs: the settings checked, rank 0's lock
//! on the checkpoint directory, the resume loaded, the checkpointers made, and at the end the
//! last checkpoint writes waited for (a failed one fails every rank). Apart from the epoch
//! loop (`epochs.rs`) because this is what a run owns and must release in order.

use super::DdpStrategy;
use super::checkpointing::{atomic_checkpointer, lock_failure};
use crate::checkpoint::{
    FailureSlot, lock_checkpoint_dir, rank0_failure_on_every_rank, set_aside_unfinished_epochs,
};
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use crate::mid_epoch::StepCheckpointer;
use burn_train::{Learner, TrainLoader, TrainingComponents, ValidLoader};
use ddp_core::checkpoint::storage::remove_temporary_files;
use std::sync::Arc;

/// burn-train's `fit` arguments, borrowed for one run: what the run's setup and its epochs
/// both work on.
pub(super) struct FitInputs<'a, LC: DdpComponents> {
    /// burn-train's components: the event processor, checkpointer, early stopping, ...
    pub(super) components: &'a mut TrainingComponents<LC>,
    /// The model, optimizer and LR scheduler.
    pub(super) learner: &'a mut Learner<LC>,
    /// The training loader (moved to the model's device by the epoch loop).
    pub(super) train: &'a TrainLoader<LC>,
    /// The validation loader (moved alike).
    pub(super) valid: &'a ValidLoader<LC>,
    /// The first epoch to train (burn-train counts from 1; later when resuming).
    pub(super) starting_epoch: usize,
}

impl DdpStrategy {
    /// The whole run; every `?` ends it on this rank, and [`fail`](Self::fail) ends it on the
    /// others.
    pub(super) fn run<LC: DdpComponents>(&self, fit: &mut FitInputs<'_, LC>) -> Result<()> {
        let pg = &self.pg;
        let rank0 = pg.rank() == 0;
        if self.every_n_steps.is_some() && self.checkpoints.is_none() {
            return Err(DdpTrainError::Settings(
                "with_checkpoint_every_n_steps needs with_checkpoints(dir): mid-epoch \
                 checkpoints are rank 0's atomic files"
                    .into(),
            ));
        }
        // One job per checkpoint directory: rank 0 holds its lock for the whole run, before
        // anything there is read or removed (a failure here aborts the other ranks).
        let _dir_lock = match &self.checkpoints {
            Some(dir) if rank0 && self.dir_lock => Some(lock_checkpoint_dir(dir)?),
            _ => None,
        };
        let resumed = self.resume(fit.components, fit.learner)?;
        self.lock().report.resumed_from = resumed.map(|(point, _)| point);
        let mut step_checkpointer = match (&self.checkpoints, self.every_n_steps) {
            (Some(dir), Some(_)) if rank0 => Some(StepCheckpointer::new(&dir.join("checkpoint"))),
            _ => None,
        };
        let failure: FailureSlot = Arc::default();
        let mut own_checkpointer = match &self.checkpoints {
            Some(dir) if rank0 => {
                if fit.components.checkpointer.is_some() {
                    tracing::warn!(
                        "both DdpStrategy::with_checkpoints and burn-train's checkpointer are set; using DdpStrategy's"
                    );
                }
                let dir = dir.join("checkpoint");
                remove_temporary_files(&dir);
                let start = resumed.map_or(0, |(point, _)| point.epochs_done);
                set_aside_unfinished_epochs(&dir, start)?;
                Some(atomic_checkpointer::<LC>(
                    &dir,
                    &failure,
                    &fit.components.interrupter,
                ))
            }
            _ => None,
        };
        // From here this rank owns threads (burn's checkpoint writers, the loaders') that an
        // error would join on the way out: the group is aborted first.
        self.abort_on_failure(|| {
            self.train_epochs(
                fit,
                resumed,
                step_checkpointer.as_mut(),
                own_checkpointer.as_mut(),
                &failure,
            )
        })?;
        // Waits for the last writes (dropping burn's asynchronous checkpointers joins them);
        // a failed one fails every rank.
        drop(own_checkpointer);
        let failed = lock_failure(&failure).take();
        rank0_failure_on_every_rank(pg, failed)
    }
}
