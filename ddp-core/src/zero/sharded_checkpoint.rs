//! ZeRO's optimizer state in a [`ShardedCheckpointer`]'s checkpoints: each rank writes the
//! state it holds (its shard, no gathering) and, on load, reads only the state of the
//! parameters it owns at the current world size. The checkpointer knows only whose state a
//! rank holds; this is where ZeRO says so.

use super::ZeroRedundancyOptimizer;
use crate::checkpoint::sharded::{Held, ShardedCheckpointError, ShardedCheckpointer};
use crate::checkpoint::{LoadOutcome, SavedCheckpoint, TrainingState};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::Optimizer;
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use hashbrown::HashMap;

impl ShardedCheckpointer {
    /// Saves like [`save`](Self::save), with the optimizer state of a
    /// [`ZeroRedundancyOptimizer`] of the same process group: each rank writes the state it
    /// holds (its ZeRO shard), with no gathering.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`save`](Self::save), plus [`ShardedCheckpointError::ForeignOptimizerState`] if the
    /// optimizer's partition is not this world size's (another process group).
    pub fn save_zero<B, M, O, R>(
        &self,
        model: &M,
        optim: &ZeroRedundancyOptimizer<O, M, B>,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B> + Clone,
    {
        self.save_record::<B, M, R>(model, optim.local_state(), Held::Sharded, state)
    }

    /// Restores the newest valid sharded checkpoint like [`load_latest`](Self::load_latest)
    /// into a [`ZeroRedundancyOptimizer`]: each rank reads only the optimizer shards holding
    /// the state of the parameters it owns at the current world size, which the optimizer
    /// keeps at its next step.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`load_latest`](Self::load_latest).
    pub fn load_latest_zero<B, M, O, R>(
        &self,
        device: &B::Device,
        model: &mut M,
        optim: &mut ZeroRedundancyOptimizer<O, M, B>,
    ) -> Result<LoadOutcome, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B> + Clone,
    {
        self.load_latest_owned::<B, M, R>(device, model, |record| {
            *optim = optim.clone().load_record(record);
        })
    }
}
