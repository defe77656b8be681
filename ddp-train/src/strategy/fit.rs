//! burn-train's entry points: [`DdpStrategy`] as a `SupervisedLearningStrategy`. `train`
//! sends rank 0's start and end events around `fit`; `fit` runs the run inside the abort
//! guard and records its error for `finish`, as burn's trait cannot return one. Apart because
//! this is the one place burn-train calls in.

use super::DdpStrategy;
use super::run::FitInputs;
use crate::components::DdpComponents;
use burn::module::AutodiffModule;
use burn_train::{
    EventProcessorTraining, Learner, LearnerEvent, LearningResult, SupervisedLearningStrategy,
    SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents, TrainingModel, ValidLoader,
};

impl<LC: DdpComponents> SupervisedLearningStrategy<LC> for DdpStrategy {
    /// burn-train's `train`, with events, summary and rendering on rank 0 only.
    fn train(
        &self,
        learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        mut components: TrainingComponents<LC>,
    ) -> LearningResult<LC::InferenceModel> {
        let rank0 = self.pg.rank() == 0;
        // The checkpoint itself is loaded inside `fit` (collectively, see `resume`), where a
        // failure ends the run on every rank instead of panicking.
        // (A contradictory resume point fails in `fit`, on every rank.)
        let starting_epoch = self
            .resume_point(components.checkpoint)
            .ok()
            .flatten()
            .map_or(1, |point| point.epochs_done + 1);
        let summary = components.summary.clone();
        if rank0 {
            components
                .event_processor
                .process_train(LearnerEvent::Start);
        }
        let (model, mut processor) = self.fit(
            components,
            learner,
            dataloader_train,
            dataloader_valid,
            starting_epoch,
        );
        if rank0 {
            let summary = summary.and_then(|s| s.init().ok());
            processor.process_train(LearnerEvent::End(summary));
        }
        LearningResult {
            model: model.valid(),
            renderer: processor.renderer(),
        }
    }

    fn fit(
        &self,
        mut components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        // A panic (the user's step or scheduler, burn's code) aborts the group before it
        // unwinds on, so the peers fail at once, quoting it, instead of at the timeout.
        let outcome = self.abort_on_failure(|| {
            self.run(&mut FitInputs {
                components: &mut components,
                learner: &mut learner,
                train: &dataloader_train,
                valid: &dataloader_valid,
                starting_epoch,
            })
        });
        if let Err(e) = outcome {
            self.fail(e);
        }
        (learner.model(), components.event_processor)
    }
}
