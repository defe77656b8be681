//! [`ShardedOptimizerState`]: what a sharded checkpoint asks of whatever holds the optimizer
//! state, so that the checkpointer knows nothing of DDP, ZeRO or FSDP. burn's optimizers
//! (replicated under DDP) implement it here; ZeRO's optimizer in `zero/sharded_checkpoint.rs`;
//! FSDP's chunked state in `fsdp/wrapper/checkpoint.rs`. A user's own sharded optimizer
//! implements it to be saved and resharded the same way.

use burn::module::{AutodiffModule, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{Optimizer, SimpleOptimizer};
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use hashbrown::HashMap;

/// Whose optimizer state a rank holds, which decides what it writes and what it reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateHolding {
    /// Every parameter's, identical on every rank (plain DDP). A save writes this rank's part
    /// of the partition; a load gives every rank every parameter's state.
    Replicated,
    /// Only the state of the parameters this rank owns at the current world size (ZeRO's and
    /// FSDP's partition). A save refuses state of parameters another rank owns
    /// ([`ForeignOptimizerState`](super::ShardedCheckpointError::ForeignOptimizerState)); a
    /// load reads only the shards holding this rank's parameters.
    Partitioned,
}

/// The optimizer side of a sharded checkpoint of a model `M`: the state this rank saves, keyed
/// by parameter, and where the loaded state goes. Passed to
/// [`ShardedCheckpointer::save_state`](super::ShardedCheckpointer::save_state) and
/// [`load_latest_state`](super::ShardedCheckpointer::load_latest_state).
///
/// The model type is part of the trait so that an optimizer of another module (FSDP's chunk
/// optimizer, whose "parameters" are units) cannot be saved as the model's.
///
/// A holder of your own (burn's optimizer records are keyed by `hashbrown`'s `HashMap`, as in
/// burn's `Optimizer::Record`):
///
/// ```
/// use burn::module::{AutodiffModule, ParamId};
/// use burn::optim::adaptor::OptimizerAdaptor;
/// use burn::optim::record::AdaptorRecord;
/// use burn::optim::{Adam, Optimizer};
/// use burn::tensor::backend::AutodiffBackend;
/// use ddp_core::checkpoint::sharded::{ShardedOptimizerState, StateHolding};
/// use hashbrown::HashMap;
///
/// /// Adam with a warm-up of its own; every rank holds every parameter's state.
/// struct WarmAdam<M: AutodiffModule<B>, B: AutodiffBackend> {
///     adam: OptimizerAdaptor<Adam, M, B>,
///     warmup_steps: usize,
/// }
///
/// impl<M: AutodiffModule<B>, B: AutodiffBackend> ShardedOptimizerState<B, M> for WarmAdam<M, B> {
///     type Record = AdaptorRecord<Adam, B>;
///
///     fn holding(&self) -> StateHolding {
///         StateHolding::Replicated
///     }
///
///     fn state_to_save(&self) -> HashMap<ParamId, Self::Record> {
///         self.adam.to_record()
///     }
///
///     fn install_loaded(&mut self, state: HashMap<ParamId, Self::Record>) {
///         self.adam = self.adam.clone().load_record(state);
///     }
/// }
/// ```
pub trait ShardedOptimizerState<B: AutodiffBackend, M: AutodiffModule<B>> {
    /// The state of one parameter.
    type Record: Record<B>;

    /// Whose state this rank holds.
    fn holding(&self) -> StateHolding;

    /// This rank's state, by parameter (cheap: burn tensors are shared handles).
    fn state_to_save(&self) -> HashMap<ParamId, Self::Record>;

    /// Takes the loaded state: every parameter's for [`StateHolding::Replicated`], this
    /// rank's parameters' for [`StateHolding::Partitioned`]. Called only once every rank has
    /// read its part.
    fn install_loaded(&mut self, state: HashMap<ParamId, Self::Record>);
}

/// burn's optimizers (`AdamConfig::new().init()` and the like), replicated on every rank.
impl<O, M, B> ShardedOptimizerState<B, M> for OptimizerAdaptor<O, M, B>
where
    O: SimpleOptimizer<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    type Record = AdaptorRecord<O, B>;

    fn holding(&self) -> StateHolding {
        StateHolding::Replicated
    }

    fn state_to_save(&self) -> HashMap<ParamId, Self::Record> {
        self.to_record()
    }

    fn install_loaded(&mut self, state: HashMap<ParamId, Self::Record>) {
        *self = self.clone().load_record(state);
    }
}
