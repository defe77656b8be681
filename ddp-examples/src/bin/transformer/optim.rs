//! The optimizers the transformer trains with: Adam on every rank, or Adam sharded with ZeRO
//! (`--shard zero1|zero2`). The training loop needs two things besides burn's `Optimizer`:
//! setting DDP up for it (ZeRO-2 takes each rank's own gradients) and saving a checkpoint,
//! which ZeRO does by gathering its shards on rank 0 first (at either stage).

use anyhow::{Context, Result};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Optimizer, SimpleOptimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use ddp_core::checkpoint::{FullCheckpointer, SavedCheckpoint, TrainingState};
use ddp_core::zero::{LocalGradientsHook, ZeroRedundancyOptimizer, ZeroStage};
use ddp_core::{DistributedDataParallel, TapBackend};

/// An optimizer the training loop can checkpoint and measure.
pub trait TrainingOptimizer<M: AutodiffModule<B>, B: TapBackend>: Optimizer<M, B> {
    /// Sets `ddp` up to feed this optimizer, before the first forward.
    fn attach(&self, _ddp: &mut DistributedDataParallel<B, M>) -> Result<()> {
        Ok(())
    }

    /// Saves `module` and the whole optimizer state (collective).
    fn save(
        &mut self,
        checkpoints: &FullCheckpointer,
        module: &M,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint>;

    /// Bytes of optimizer state this rank holds (serialised at full precision).
    fn state_bytes(&self) -> Result<usize>;
}

impl<O, M, B> TrainingOptimizer<M, B> for OptimizerAdaptor<O, M, B>
where
    O: SimpleOptimizer<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: TapBackend,
{
    fn save(
        &mut self,
        checkpoints: &FullCheckpointer,
        module: &M,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint> {
        Ok(checkpoints.save(module, self, state)?)
    }

    fn state_bytes(&self) -> Result<usize> {
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        Ok(Recorder::<B>::record(&recorder, self.to_record(), ())?.len())
    }
}

impl<O, M, B> TrainingOptimizer<M, B> for ZeroRedundancyOptimizer<OptimizerAdaptor<O, M, B>, M, B>
where
    O: SimpleOptimizer<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: TapBackend,
{
    /// Stage 2 reduce-scatters each rank's own gradients in its step, so DDP must hand them
    /// over unaveraged ([`LocalGradientsHook`], what `ZeroRedundancyOptimizer::stage2` registers).
    fn attach(&self, ddp: &mut DistributedDataParallel<B, M>) -> Result<()> {
        if self.stage() == ZeroStage::Two {
            ddp.register_comm_hook(LocalGradientsHook)
                .context("setting DDP up for --shard zero2 (each rank's own gradients)")?;
        }
        Ok(())
    }

    fn save(
        &mut self,
        checkpoints: &FullCheckpointer,
        module: &M,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint> {
        Ok(self.save_checkpoint(checkpoints, module, state)?)
    }

    fn state_bytes(&self) -> Result<usize> {
        Ok(self.local_state_bytes()?)
    }
}
