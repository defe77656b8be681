//! One epoch's training steps on every rank: per step, the all-reduce that says who has a
//! batch and whether anyone's interrupter fired, the user's `TrainStep` through ddp-core's
//! engine (gradients all-reduced during its backward; accumulated without sync between
//! optimizer steps), the output merged on rank 0 for burn-train's metrics, and rank 0's
//! mid-epoch checkpoint when one is due. The heart of the strategy, apart from the epoch
//! loop around it (`epochs.rs`).

use super::skip::skip_to;
use super::{DdpStrategy, MetricsSync, model_device};
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use crate::item::{Exchange, exchange};
use crate::loader::{loader_info, next_batch};
use crate::mid_epoch::{LoaderPosition, StepCheckpointer};
use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn_train::{
    EventProcessorTraining, Learner, LearnerEvent, TrainLoader, TrainStep, TrainingComponents,
    TrainingItem, TrainingModel,
};
use ddp_core::{DistributedDataParallel, comm::ReduceOp};

/// What one epoch's training loop ended with.
pub(super) enum EpochEnd {
    /// Every rank ran out of batches together.
    Completed,
    /// An interrupter (on any rank) fired; every rank stops at the same step.
    Interrupted,
}

impl DdpStrategy {
    /// One epoch's training steps on every rank, from `resume_at`'s step when the epoch
    /// resumes a mid-epoch checkpoint; rank 0 passes its `step_checkpointer`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn train_epoch<LC: DdpComponents>(
        &self,
        components: &mut TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        ddp: &mut DistributedDataParallel<LC::Backend, TrainingModel<LC>>,
        train: &TrainLoader<LC>,
        global: &Progress,
        resume_at: Option<LoaderPosition>,
        step_checkpointer: Option<&mut StepCheckpointer>,
    ) -> Result<EpochEnd> {
        let mut iter = train.iter();
        // Dropping the iterator joins its loader thread: on a failure the group is aborted
        // first.
        self.abort_on_failure(|| {
            self.train_steps(
                components,
                learner,
                ddp,
                &mut *iter,
                global,
                resume_at,
                step_checkpointer,
            )
        })
    }

    /// [`train_epoch`](Self::train_epoch)'s steps over `iter`.
    #[allow(clippy::too_many_arguments)]
    fn train_steps<LC: DdpComponents>(
        &self,
        components: &mut TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        ddp: &mut DistributedDataParallel<LC::Backend, TrainingModel<LC>>,
        iter: &mut dyn DataLoaderIterator<<TrainingModel<LC> as TrainStep>::Input>,
        global: &Progress,
        resume_at: Option<LoaderPosition>,
        mut step_checkpointer: Option<&mut StepCheckpointer>,
    ) -> Result<EpochEnd> {
        let pg = &self.pg;
        let (world, rank) = (pg.world_size(), pg.rank());
        let epoch = global.items_processed;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        let device = model_device(&learner.model());
        let mut accumulated = 0;
        let mut step = skip_to(&mut *iter, epoch, resume_at)?;
        let mut end = EpochEnd::Completed;
        loop {
            // A data error ends the run here (this rank's failure aborts the group, so the
            // others fail at the next collective, quoting it).
            let batch = next_batch(&mut *iter).map_err(|f| f.in_epoch(epoch))?;
            // Who has a batch, and did anyone's interrupter fire.
            let mut control = vec![0u8; world + 1];
            control[rank] = u8::from(batch.is_some());
            control[world] = u8::from(components.interrupter.should_stop());
            if world > 1 {
                pg.all_reduce(&mut control, ReduceOp::Max)
                    .map_err(DdpTrainError::comm(format!(
                        "epoch {epoch}: starting step {}",
                        step + 1
                    )))?;
            }
            if control[world] == 1 {
                end = EpochEnd::Interrupted;
                break;
            }
            let exhausted: Vec<usize> = (0..world).filter(|&r| control[r] == 0).collect();
            let Some(batch) = batch.filter(|_| exhausted.is_empty()) else {
                if exhausted.len() == world {
                    break;
                }
                return Err(DdpTrainError::UnevenBatches {
                    epoch,
                    step: step + 1,
                    exhausted,
                });
            };
            step += 1;
            // The LR scheduler steps once per optimizer step, as in PyTorch.
            if accumulated == 0 {
                learner.lr_step();
            }
            let progress = iter.progress();
            let items_done = progress.items_processed;
            accumulated += 1;
            // The user's step on a tapped copy of the learner's model: its backward feeds the
            // buckets. The gradients it returns are empty (the taps keep them): use DDP's.
            let model = learner.model();
            let context = || format!("epoch {epoch}, step {step}: training step");
            let output = if accumulated == accumulation {
                let (output, grads) = ddp
                    .step_on(&model, |m| m.step(batch))
                    .map_err(DdpTrainError::ddp(context()))?;
                learner.optimizer_step(grads);
                accumulated = 0;
                let mut state = self.lock();
                state.report.optimizer_steps += 1;
                if let Some(stats) = ddp.last_step_stats() {
                    state.report.buckets += stats.buckets as u64;
                    state.report.buckets_launched_during_backward +=
                        stats.buckets_launched_during_backward as u64;
                    state.report.early_gradients += stats.early_gradients as u64;
                }
                output
            } else {
                ddp.step_on_no_sync(&model, |m| m.step(batch))
                    .map_err(DdpTrainError::ddp(context()))?
            };
            self.lock().report.train_steps += 1;
            let global_batch = self.metrics == MetricsSync::Global;
            match exchange(pg, Some(output.item), global_batch, &device, step)? {
                Exchange::Step(Some(item)) => {
                    let item = TrainingItem::new(
                        item,
                        progress,
                        global.clone(),
                        Some(step),
                        Some(learner.lr_current()),
                    );
                    components
                        .event_processor
                        .process_train(LearnerEvent::ProcessedItem(item));
                }
                Exchange::Step(None) => {}
                Exchange::Done => {
                    return Err(DdpTrainError::ItemSync {
                        step,
                        reason: "no rank reported an output for a step every rank ran".into(),
                    });
                }
            }
            // Every rank counts the same steps, so all know a checkpoint is due; rank 0 alone
            // holds a checkpointer and writes (a failure ends the run on every rank).
            let due = accumulated == 0
                && self
                    .every_n_steps
                    .is_some_and(|n| (step / accumulation).is_multiple_of(n));
            if due && let Some(checkpointer) = step_checkpointer.as_deref_mut() {
                let position = LoaderPosition {
                    epoch,
                    step,
                    world,
                    items: items_done,
                    order: loader_info(&*iter).map(|info| info.order),
                };
                checkpointer.save(learner, &components.event_store, position)?;
                self.lock().report.step_checkpoints += 1;
            }
        }
        if accumulated > 0 {
            // As burn-train's own loop: micro-batches left at the end of an epoch are dropped
            // (every rank has the same count: the ranks step together).
            ddp.discard_no_sync_gradients().map_err(DdpTrainError::ddp(
                "dropping a partial gradient accumulation",
            ))?;
            tracing::debug!(
                epoch,
                accumulated,
                "dropping a partial gradient accumulation"
            );
        }
        if rank == 0 {
            components
                .event_processor
                .process_train(LearnerEvent::EndEpoch(epoch));
        }
        Ok(end)
    }
}
