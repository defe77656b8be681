//! The examples' training loop, shared so that each program shows only its own step:
//! [`EpochLoop`] runs one epoch's batches with rank 0's progress line, the global step count
//! and the [`StepClock`]; [`digits_step`] is the DDP step of both digits classifiers.

use anyhow::Result;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLoss;
use burn::optim::Optimizer;
use burn::tensor::{ElementConversion, Tensor};
use ddp_core::checkpoint::TrainingState;
use ddp_core::comm::ProcessGroup;
use ddp_core::data::DistributedDataLoader;
use ddp_core::progress::EpochProgress;
use ddp_core::{DistributedDataParallel, TapBackend};
use std::time::Instant;

use crate::digits::DigitBatch;
use crate::warm_up::StepClock;

/// A run's epochs: the steps they take, counted from the resumed step and timed.
#[derive(Debug)]
pub struct EpochLoop<'a> {
    pg: &'a ProcessGroup,
    epochs: usize,
    /// When the loop was made: `started.elapsed()` is the training time so far.
    pub started: Instant,
    /// Optimizer steps taken so far, the resumed checkpoint's included.
    pub step: u64,
    /// The first step's time apart from the rest (checkpoints between epochs not counted).
    pub clock: StepClock,
}

impl<'a> EpochLoop<'a> {
    /// A loop over `epochs` epochs on `pg`'s ranks that has taken `step` steps already.
    pub fn new(pg: &'a ProcessGroup, epochs: usize, step: u64) -> Self {
        EpochLoop {
            pg,
            epochs,
            started: Instant::now(),
            step,
            clock: StepClock::new(),
        }
    }

    /// Trains epoch `epoch` on `loader`'s batches (from a restored mid-epoch position, if
    /// any): `train_step` takes one batch and returns this rank's loss and batch size, for the
    /// progress line. Returns the [`TrainingState`] to checkpoint after the epoch.
    ///
    /// # Collective
    /// Every rank calls it (the progress line averages each step's loss over the ranks).
    ///
    /// # Errors
    /// A batch that failed to load, `train_step`'s, or a failed all-reduce of the progress.
    pub fn run<B, I, O>(
        &mut self,
        loader: &mut DistributedDataLoader<B, I, O>,
        epoch: usize,
        mut train_step: impl FnMut(O) -> Result<(f32, usize)>,
    ) -> Result<TrainingState>
    where
        B: burn::tensor::backend::Backend,
        I: Send + 'static,
        O: Send + 'static,
    {
        // What came since the last step (a checkpoint) is not a training step.
        self.clock.pause_until_now();
        loader.set_epoch(epoch as u64); // keeps a restored mid-epoch position
        let mut progress = EpochProgress::new(self.pg, epoch, self.epochs, loader.remaining());
        for batch in loader.iter() {
            let (loss, n) = train_step(batch?)?;
            self.step += 1;
            self.clock.step();
            progress.step(loss, n)?;
        }
        progress.finish();
        Ok(TrainingState::new(epoch as u64 + 1, self.step).with_sampler(loader.state()))
    }
}

/// One DDP step of a digits classifier: the cross-entropy of `forward`'s logits for the
/// batch's images, backward and `optim`'s step at `lr`. Returns the loss and the batch size.
///
/// # Errors
/// DDP's forward or backward.
pub fn digits_step<B, M, O>(
    ddp: &mut DistributedDataParallel<B, M>,
    optim: &mut O,
    lr: f64,
    loss_fn: &CrossEntropyLoss<B>,
    batch: DigitBatch<B>,
    forward: impl FnOnce(&M, Tensor<B, 2>) -> Tensor<B, 2>,
) -> Result<(f32, usize)>
where
    B: TapBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let n = batch.targets.dims()[0];
    let logits = ddp.forward(|m| forward(m, batch.images))?;
    let loss = loss_fn.forward(logits, batch.targets);
    let loss_value: f32 = loss.clone().into_scalar().elem();
    let grads = ddp.backward(loss)?;
    ddp.optimizer_step(optim, lr, grads);
    Ok((loss_value, n))
}
