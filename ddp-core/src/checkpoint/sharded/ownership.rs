//! Which rank's shard holds which tensor: ZeRO's partition rule (largest trainable tensors
//! first, each to the lightest rank; `engine/partition.rs`), so under ZeRO every rank writes the
//! parameters and optimizer state it already owns, and plain DDP replicas each write about
//! `1/world` of the bytes. Tensors no optimizer steps (buffers, frozen parameters, integer and
//! boolean tensors) go to rank 0.

use crate::engine::module_tensors::describe;
use crate::engine::partition::Partition;
use burn::module::{AutodiffModule, ParamId};
use burn::tensor::backend::AutodiffBackend;
use std::collections::HashMap;

/// The owner of every trainable float tensor of a module, for one world size.
#[derive(Debug, Clone)]
pub(crate) struct Ownership {
    owners: HashMap<ParamId, usize>,
}

impl Ownership {
    /// The partition of `module`'s trainable tensors over `world` ranks: the same one a
    /// `ZeroRedundancyOptimizer` of that world size uses.
    pub(crate) fn of<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M, world: usize) -> Self {
        let (layout, _) = describe::<B, M>(module);
        let sizes: Vec<Option<usize>> = layout
            .iter()
            .map(|t| t.trainable.then_some(t.bytes))
            .collect();
        let partition = Partition::balanced(&sizes, world);
        let owners = layout
            .iter()
            .zip(partition.owners())
            .filter_map(|(t, o)| o.map(|o| (t.id, o)))
            .collect();
        Ownership { owners }
    }

    /// The rank whose shard holds the tensor with id `id` (rank 0 for untrained tensors).
    pub(super) fn owner(&self, id: ParamId) -> usize {
        self.owners.get(&id).copied().unwrap_or(0)
    }

    /// Whether `rank` owns the trainable tensor `id` (the optimizer state it keeps under ZeRO).
    pub(crate) fn owns(&self, rank: usize, id: ParamId) -> bool {
        self.owners.get(&id) == Some(&rank)
    }
}
