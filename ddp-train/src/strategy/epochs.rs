//! The epoch loop of a run, on every rank: ddp-core's engine set up from rank 0's weights,
//! then per epoch the training steps, the validation steps, and rank 0's checkpoint and
//! early-stopping decision, broadcast so that every rank stops in the same epoch. Apart from
//! the steps themselves (`train_epoch.rs`, `valid_epoch.rs`), which this only sequences.

use super::checkpointing::lock_failure;
use super::run::FitInputs;
use super::train_epoch::EpochEnd;
use super::{DdpStrategy, model_device};
use crate::checkpoint::FailureSlot;
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use crate::mid_epoch::{LoaderPosition, ResumePoint, StepCheckpointer};
use crate::params::verify_same_model;
use burn::data::dataloader::Progress;
use burn::module::Module;
use burn_train::{
    EventProcessorTraining, LearnerEvent, LearningCheckpointer, SupervisedTrainingEventProcessor,
};
use ddp_core::DistributedDataParallel;

impl DdpStrategy {
    /// The epochs, from `starting_epoch` on, on every rank: ddp-core's engine, then each
    /// epoch's training, validation and rank 0's checkpoint and early-stopping decision.
    pub(super) fn train_epochs<LC: DdpComponents>(
        &self,
        fit: &mut FitInputs<'_, LC>,
        resumed: Option<(ResumePoint, Option<LoaderPosition>)>,
        mut step_checkpointer: Option<&mut StepCheckpointer>,
        mut own_checkpointer: Option<&mut LearningCheckpointer<LC>>,
        failure: &FailureSlot,
    ) -> Result<()> {
        let (components, learner) = (&mut *fit.components, &mut *fit.learner);
        let starting_epoch = fit.starting_epoch;
        let pg = &self.pg;
        let rank0 = pg.rank() == 0;
        // Every rank starts from rank 0's weights and ids (burn initialises them randomly per
        // process): ddp-core's engine broadcasts them, the learner loads them.
        let model = learner.model();
        verify_same_model::<LC::Backend, _>(pg, &model)?;
        let mut ddp = DistributedDataParallel::new(model, pg.clone(), self.config.clone())
            .map_err(DdpTrainError::ddp("setting up data-parallel training"))?;
        learner.load_model(ddp.module().clone().into_record());
        // As burn-train's own strategies: the loaders create their batches on the model's
        // device (with one GPU per rank, not on the default one). Once: a moved
        // DistributedLoader keeps the epoch counter and resume point it was moved with.
        let device = model_device(&learner.model());
        let train = &fit.train.to_device(&device);
        let valid = &fit.valid.to_device(&device);
        tracing::info!(
            rank = pg.rank(),
            world = pg.world_size(),
            starting_epoch,
            epochs = components.num_epochs,
            "DDP training: every rank holds rank 0's model"
        );

        for epoch in starting_epoch..=components.num_epochs {
            let global = Progress::new(epoch, components.num_epochs);
            let resume_at = resumed
                .and_then(|(_, position)| position)
                .filter(|_| epoch == starting_epoch);
            let end = self.train_epoch(
                components,
                learner,
                &mut ddp,
                train,
                &global,
                resume_at,
                step_checkpointer.as_deref_mut(),
            )?;
            if matches!(end, EpochEnd::Interrupted) {
                self.lock().report.interrupted = true;
                tracing::info!(epoch, "training interrupted");
                break;
            }
            self.valid_epoch(&mut components.event_processor, learner, valid, &global)?;

            // 0: go on, 1: early stop, 2: rank 0 could not write a checkpoint.
            let mut stop = [0u8];
            if rank0 {
                flush_valid::<LC>(&mut components.event_processor);
                if let Some(checkpointer) = own_checkpointer.as_deref_mut() {
                    checkpointer.checkpoint(learner, epoch, &components.event_store);
                } else if let Some(checkpointer) = &mut components.checkpointer {
                    checkpointer.checkpoint(learner, epoch, &components.event_store);
                }
                if let Some(early) = &mut components.early_stopping
                    && early.should_stop(epoch, &components.event_store)
                {
                    stop[0] = 1;
                }
                // Writes run behind training: this sees the earlier epochs' failures.
                if lock_failure(failure).is_some() {
                    stop[0] = 2;
                }
            }
            // Rank 0 decides; everyone follows in the same epoch.
            if pg.world_size() > 1 {
                pg.broadcast(&mut stop, 0)
                    .map_err(DdpTrainError::comm(format!(
                        "receiving rank 0's early-stopping decision after epoch {epoch}"
                    )))?;
            }
            if stop[0] == 2 {
                return Err(lock_failure(failure).take().unwrap_or_else(|| {
                    DdpTrainError::Failed(
                        "rank 0 could not write a checkpoint (its log says why)".into(),
                    )
                }));
            }
            let mut state = self.lock();
            state.report.last_epoch = epoch;
            if stop[0] == 1 {
                state.report.stopped_early_at = Some(epoch);
                tracing::info!(epoch, "early stopping (rank 0's decision)");
                break;
            }
        }
        Ok(())
    }
}

/// Waits until burn-train's event thread has handled the validation epoch's end, so the
/// checkpointer and early stopping read this epoch's metrics. The processor's channel holds one
/// message and validation's `Start` is a no-op: the second `Start` is accepted only after the
/// event before it (the end of the epoch) was fully processed.
fn flush_valid<LC: DdpComponents>(processor: &mut SupervisedTrainingEventProcessor<LC>) {
    processor.process_valid(LearnerEvent::Start);
    processor.process_valid(LearnerEvent::Start);
}
