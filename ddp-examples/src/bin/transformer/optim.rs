//! The two optimizers the transformer trains with: Adam on every rank, or Adam sharded with
//! ZeRO (`--zero`). The training loop needs one thing besides burn's `Optimizer`: saving a
//! checkpoint, which ZeRO does by gathering its shards on rank 0 first.

use anyhow::Result;
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Optimizer, SimpleOptimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use ddp_core::checkpoint::{FullCheckpointer, SavedCheckpoint, TrainingState};
use ddp_core::zero::ZeroRedundancyOptimizer;

/// An optimizer the training loop can checkpoint and measure.
pub trait TrainingOptimizer<M: AutodiffModule<B>, B: AutodiffBackend>: Optimizer<M, B> {
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
    B: AutodiffBackend,
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
    B: AutodiffBackend,
{
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
