//! ZeRO's optimizer state in a [`ShardedCheckpointer`]'s checkpoints: each rank writes the
//! state it holds (its shard, no gathering; its part of a whole loaded state) and, on load, reads only the state of the
//! parameters it owns at the current world size. The checkpointer knows only whose state a
//! rank holds ([`ShardedOptimizerState`]); this is where ZeRO says so.

use super::ZeroRedundancyOptimizer;
use crate::checkpoint::sharded::{
    ShardedCheckpointError, ShardedCheckpointer, ShardedOptimizerState, StateHolding,
};
use crate::checkpoint::{LoadOutcome, SavedCheckpoint, TrainingState};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::Optimizer;
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use hashbrown::HashMap;

/// ZeRO's optimizer holds its partition: saved with no gathering, loaded by reading only the
/// shards holding this rank's parameters at the current world size (it keeps them at its next
/// step). A whole state loaded before the first step is saved as each rank's part of it.
impl<O, M, B, R> ShardedOptimizerState<B, M> for ZeroRedundancyOptimizer<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
    R: Record<B> + Clone,
{
    type Record = R;

    /// Partitioned, except while it holds a whole loaded state the partition has not cut down
    /// yet (a full checkpoint loaded before the first step): that state is every rank's, alike,
    /// so a save writes this rank's part of it instead of refusing the other ranks' entries.
    fn holding(&self) -> StateHolding {
        if self.holds_whole_state() {
            StateHolding::Replicated
        } else {
            StateHolding::Partitioned
        }
    }

    fn state_to_save(&self) -> HashMap<ParamId, R> {
        self.local_state()
    }

    fn install_loaded(&mut self, state: HashMap<ParamId, R>) {
        // What `holding` said before the load decided what the load read: every shard's
        // state while this optimizer held a whole one, else this rank's own.
        let whole = self.holds_whole_state();
        self.load_sharded_state(state, whole);
    }
}

impl ShardedCheckpointer {
    /// [`save_state`](Self::save_state) with a [`ZeroRedundancyOptimizer`].
    ///
    /// # Errors
    /// As [`save_state`](Self::save_state).
    #[deprecated(
        since = "0.1.0",
        note = "use save_state, the one save of every optimizer state holder"
    )]
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
        self.save_state(model, optim, state)
    }

    /// [`load_latest_state`](Self::load_latest_state) with a [`ZeroRedundancyOptimizer`].
    ///
    /// # Errors
    /// As [`load_latest_state`](Self::load_latest_state).
    #[deprecated(
        since = "0.1.0",
        note = "use load_latest_state, the one load of every optimizer state holder"
    )]
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
        self.load_latest_state(device, model, optim)
    }
}
