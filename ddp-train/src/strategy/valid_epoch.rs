//! One epoch's validation steps on every rank: evaluation shards may differ by one batch, so
//! a rank without a batch still takes part in each step's exchange until every rank is done;
//! rank 0 alone feeds the merged outputs to burn-train's metrics. Apart from training, which
//! steps the optimizer and must have every rank hold a batch.

use super::{DdpStrategy, MetricsSync, model_device};
use crate::components::DdpComponents;
use crate::error::Result;
use crate::item::{Exchange, exchange};
use crate::loader::next_batch;
use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn::module::AutodiffModule;
use burn_train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, SupervisedTrainingEventProcessor,
    TrainingItem, ValidLoader,
};

impl DdpStrategy {
    pub(super) fn valid_epoch<LC: DdpComponents>(
        &self,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
        learner: &Learner<LC>,
        valid: &ValidLoader<LC>,
        global: &Progress,
    ) -> Result<()> {
        let mut iter = valid.iter();
        // As in `train_epoch`: the group is aborted before the loader thread is joined. This
        // also covers a panic of the user's `InferenceStep`, which, unlike the training step,
        // runs outside ddp-core's guard.
        self.abort_on_failure(|| self.valid_steps(processor, learner, &mut *iter, global))
    }

    /// [`valid_epoch`](Self::valid_epoch)'s steps over `iter`.
    fn valid_steps<LC: DdpComponents>(
        &self,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
        learner: &Learner<LC>,
        iter: &mut dyn DataLoaderIterator<<LC::InferenceModel as InferenceStep>::Input>,
        global: &Progress,
    ) -> Result<()> {
        let epoch = global.items_processed;
        // Autodiff backends share their inner backend's device type.
        let device = model_device(&learner.model());
        let model = learner.model().valid();
        let global_batch = self.metrics == MetricsSync::Global;
        let mut step = 0;
        loop {
            // Shards may differ by one batch: a rank without one still takes part. A data
            // error fails the run (not a shorter validation set).
            let batch = next_batch(&mut *iter).map_err(|f| f.in_epoch(epoch))?;
            let output = batch.map(|batch| model.step(batch));
            let progress = iter.progress();
            match exchange(&self.pg, output, global_batch, &device, step + 1)? {
                Exchange::Done => break,
                Exchange::Step(item) => {
                    step += 1;
                    if let Some(item) = item {
                        let item =
                            TrainingItem::new(item, progress, global.clone(), Some(step), None);
                        processor.process_valid(LearnerEvent::ProcessedItem(item));
                    }
                }
            }
        }
        if self.pg.rank() == 0 {
            processor.process_valid(LearnerEvent::EndEpoch(epoch));
        }
        Ok(())
    }
}
