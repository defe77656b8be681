//! [`ZeroRedundancyOptimizer`]: any burn optimizer, its state sharded across the ranks.

use super::consolidate::{encode, gather_on_rank0};
use super::error::ZeroError;
use super::layout::{TensorInfo, describe, keep_shard};
use super::partition::Partition;
use crate::checkpoint::{Checkpointer, SavedCheckpoint, TrainingState};
use crate::model_sync::{broadcast_bytes, read_values, write_values};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::ProcessGroup;
use hashbrown::HashMap;
use std::collections::HashSet;
use std::marker::PhantomData;

/// The partition of one module layout.
#[derive(Debug, Clone)]
struct Plan {
    layout: Vec<TensorInfo>,
    partition: Partition,
    owned: HashSet<ParamId>,
}

/// Wraps a burn optimizer so that each rank keeps the optimizer state of its shard of the
/// parameters only (ZeRO stage 1, PyTorch's `ZeroRedundancyOptimizer`).
///
/// - **Partition.** The trainable parameters are split across the ranks by size, largest
///   first, each to the rank whose shard is smallest so far; every rank computes the same
///   partition from the module, so it needs no communication. With Adam each rank then holds
///   about `1/world` of the two moment buffers.
/// - **Step.** Pass the averaged gradients from
///   [`DistributedDataParallel::backward`](crate::DistributedDataParallel::backward), e.g.
///   through `ddp.optimizer_step(&mut zero, lr, grads)`: each rank drops the gradients of the
///   parameters it does not own, steps its shard with the wrapped optimizer, then every owner
///   broadcasts its updated parameters, byte for byte, so all replicas stay bitwise identical.
///   The result equals the wrapped optimizer applied to every parameter on one rank, as long
///   as its update of a parameter depends on that parameter's gradient alone (Adam, AdamW,
///   SGD with momentum, per-tensor gradient clipping: every burn `OptimizerAdaptor`).
/// - **Checkpoints.** [`save_checkpoint`](Self::save_checkpoint) gathers the shards on rank 0
///   into the record the unsharded optimizer would have (keyed by `ParamId`) and saves it with
///   the [`Checkpointer`]. [`Checkpointer::load_latest`] loads it on every rank; each rank keeps
///   the entries of its own shard at its next step, under the partition of the current world
///   size. So a run saved at one world size resumes at another, and a checkpoint of plain DDP
///   resumes with ZeRO and back.
///
/// # Errors
/// A failed broadcast aborts the process group, so the peers fail at once with this rank's
/// reason; the optimizer is then unusable. [`step`](Optimizer::step) cannot return an error
/// (burn's trait): it logs it, leaves the module as the failed step left it, and the next DDP
/// call fails with the abort. [`try_step`](Self::try_step) returns it.
pub struct ZeroRedundancyOptimizer<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    inner: O,
    pg: ProcessGroup,
    plan: Option<Plan>,
    /// A full record loaded before the partition was known; split at the next step.
    pending: Option<O::Record>,
    /// Rank 0 after [`Self::consolidate_state`]: every shard's state.
    consolidated: Option<O::Record>,
    poisoned: Option<String>,
    _module: PhantomData<fn() -> (M, B)>,
}

impl<O, M, B, R> ZeroRedundancyOptimizer<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
    R: Record<B> + Clone,
{
    /// Shards `inner`'s state across the ranks of `pg` (the process group DDP uses:
    /// `ddp.process_group().clone()`).
    pub fn new(inner: O, pg: ProcessGroup) -> Self {
        ZeroRedundancyOptimizer {
            inner,
            pg,
            plan: None,
            pending: None,
            consolidated: None,
            poisoned: None,
            _module: PhantomData,
        }
    }

    /// The wrapped optimizer (holding this rank's shard of the state).
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// The process group the shards are spread over.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// Bytes of parameters each rank owns (index = rank), once the first step or
    /// [`consolidate_state`](Self::consolidate_state) has seen the module.
    pub fn shard_bytes(&self) -> Option<Vec<usize>> {
        self.plan.as_ref().map(|p| p.partition.loads().to_vec())
    }

    /// This rank's optimizer state: its shard's entries only.
    pub fn local_state(&self) -> O::Record {
        match (&self.pending, &self.plan) {
            (Some(pending), Some(plan)) => keep_owned(pending.clone(), &plan.owned),
            (Some(pending), None) => pending.clone(),
            (None, _) => self.inner.to_record(),
        }
    }

    /// The size of [`local_state`](Self::local_state) serialised at full precision (burn's
    /// `BinBytesRecorder`): this rank's optimizer memory, for diagnostics. It serialises the
    /// state, so it costs about a copy of it.
    pub fn local_state_bytes(&self) -> Result<usize, ZeroError> {
        Ok(encode::<B, R>(self.local_state())?.len())
    }

    /// Steps this rank's shard with `grads` (averaged over the ranks), then shares every
    /// shard's updated parameters from its owner.
    ///
    /// # Collective
    /// Every rank calls it at the same point, with the same module layout.
    ///
    /// # Errors
    /// [`ZeroError::Broadcast`] (the process group is then aborted), [`ZeroError::Poisoned`].
    pub fn try_step(&mut self, lr: f64, module: M, grads: GradientsParams) -> Result<M, ZeroError> {
        let (module, result) = self.step_shard(module, |inner, module, keep| {
            let grads = keep_shard::<B, M>(&module, grads, keep);
            inner.step(lr, module, grads)
        });
        result.map(|()| module)
    }

    /// Gathers every shard's state on rank 0, where [`to_record`](Optimizer::to_record) then
    /// returns the full record (until the next step). [`save_checkpoint`](Self::save_checkpoint)
    /// calls it for you.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// [`ZeroError::Consolidate`] (the process group is then aborted), [`ZeroError::Poisoned`].
    pub fn consolidate_state(&mut self, module: &M) -> Result<(), ZeroError> {
        self.check_usable()?;
        let device = self.settle(module);
        let mine = self.inner.to_record();
        let result = match device {
            Some(device) => gather_on_rank0::<B, R>(&self.pg, mine, &device),
            // A module without float tensors has no optimizer state.
            None => Ok((self.pg.rank() == 0).then(HashMap::new)),
        };
        self.consolidated = self.guard(result)?;
        Ok(())
    }

    /// Saves a checkpoint with the full optimizer state: gathers the shards on rank 0
    /// ([`consolidate_state`](Self::consolidate_state)), calls [`Checkpointer::save`], then
    /// frees the gathered copy.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Those of [`consolidate_state`](Self::consolidate_state) and [`Checkpointer::save`].
    pub fn save_checkpoint(
        &mut self,
        checkpointer: &Checkpointer,
        module: &M,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, ZeroError> {
        self.consolidate_state(module)?;
        let saved = checkpointer.save::<B, M, Self>(module, self, state);
        self.consolidated = None;
        Ok(saved?)
    }

    /// Partitions `module` (again if its layout changed) and splits a pending full record.
    /// Returns the device of the module's first tensor.
    fn settle(&mut self, module: &M) -> Option<B::Device> {
        let (layout, device) = describe::<B, M>(module);
        let changed = self.plan.as_ref().map(|p| &p.layout) != Some(&layout);
        let had_plan = self.plan.is_some();
        if changed {
            let sizes: Vec<Option<usize>> = layout
                .iter()
                .map(|t| t.trainable.then_some(t.bytes))
                .collect();
            let partition = Partition::balanced(&sizes, self.pg.world_size());
            let owned = layout
                .iter()
                .zip(partition.owners())
                .filter(|(_, o)| **o == Some(self.pg.rank()))
                .map(|(t, _)| t.id)
                .collect();
            self.plan = Some(Plan {
                layout,
                partition,
                owned,
            });
        }
        if let Some(plan) = &self.plan {
            if let Some(full) = self.pending.take() {
                self.inner = self
                    .inner
                    .clone()
                    .load_record(keep_owned(full, &plan.owned));
            } else if changed && had_plan {
                tracing::warn!(
                    rank = self.pg.rank(),
                    "the module's parameters changed: re-partitioning; the state of parameters \
                     this rank no longer owns is dropped"
                );
                let record = keep_owned(self.inner.to_record(), &plan.owned);
                self.inner = self.inner.clone().load_record(record);
            }
        }
        device
    }

    /// The common part of `step` and `step_multi`: `update` steps the shard selected by its
    /// mask; then every owner's parameters are broadcast. On error the module is returned as
    /// far as it got.
    fn step_shard(
        &mut self,
        module: M,
        update: impl FnOnce(&mut O, M, &[bool]) -> M,
    ) -> (M, Result<(), ZeroError>) {
        if let Err(e) = self.check_usable() {
            return (module, Err(e));
        }
        self.settle(&module);
        self.consolidated = None;
        let Some(plan) = self.plan.clone() else {
            return (module, Ok(()));
        };
        let keep = plan.partition.mask(self.pg.rank());
        let module = update(&mut self.inner, module, &keep);
        let (module, result) = share_shards::<B, M>(&self.pg, module, &plan.partition);
        let result = self.guard(result);
        (module, result)
    }

    fn check_usable(&self) -> Result<(), ZeroError> {
        match &self.poisoned {
            Some(first) => Err(ZeroError::Poisoned {
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Makes an error final: aborts the group (peers fail now, with this reason) and poisons
    /// the optimizer.
    fn guard<T>(&mut self, result: Result<T, ZeroError>) -> Result<T, ZeroError> {
        if let Err(e) = &result {
            let reason = e.to_string();
            tracing::error!(rank = self.pg.rank(), error = %reason, "ZeRO failed; aborting the process group");
            if self.pg.world_size() > 1 {
                self.pg.abort(&reason);
            }
            self.poisoned = Some(reason);
        }
        result
    }
}

/// The entries of `record` whose parameter is in `owned`.
fn keep_owned<R>(record: HashMap<ParamId, R>, owned: &HashSet<ParamId>) -> HashMap<ParamId, R> {
    record
        .into_iter()
        .filter(|(id, _)| owned.contains(id))
        .collect()
}

/// Every rank's shard of parameters from its owner to the others, byte for byte.
fn share_shards<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    mut module: M,
    partition: &Partition,
) -> (M, Result<(), ZeroError>) {
    for owner in 0..pg.world_size() {
        let select = partition.mask(owner);
        if pg.world_size() == 1 || !select.iter().any(|&s| s) {
            continue;
        }
        let bytes = if pg.rank() == owner {
            read_values::<B, M>(&module, &select, false)
        } else {
            Vec::new()
        };
        let error = |source| ZeroError::Broadcast { owner, source };
        let bytes = match broadcast_bytes(pg, bytes, owner) {
            Ok(bytes) => bytes,
            Err(e) => return (module, Err(error(e))),
        };
        if pg.rank() != owner {
            let before = module.clone();
            module = match write_values::<B, M>(module, &select, false, &bytes) {
                Ok(m) => m,
                Err(e) => return (before, Err(error(e))),
            };
        }
    }
    (module, Ok(()))
}

impl<O, M, B, R> Optimizer<M, B> for ZeroRedundancyOptimizer<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
    R: Record<B> + Clone,
{
    type Record = O::Record;

    fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        let (module, result) = self.step_shard(module, |inner, module, keep| {
            let grads = keep_shard::<B, M>(&module, grads, keep);
            inner.step(lr, module, grads)
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "ZeRO step failed");
        }
        module
    }

    fn step_multi(&mut self, lr: f64, module: M, mut grads: MultiGradientsParams) -> M {
        let (module, result) = self.step_shard(module, |inner, module, keep| {
            for (g, _) in grads.grads.iter_mut() {
                *g = keep_shard::<B, M>(&module, std::mem::take(g), keep);
            }
            inner.step_multi(lr, module, grads)
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "ZeRO step failed");
        }
        module
    }

    /// The full state on rank 0 after [`consolidate_state`](Self::consolidate_state) (what
    /// [`Checkpointer::save`] writes); otherwise this rank's shard only (with a warning when
    /// the state is sharded over several ranks).
    fn to_record(&self) -> Self::Record {
        if let Some(full) = &self.consolidated {
            return full.clone();
        }
        if self.pending.is_none() && self.pg.world_size() > 1 {
            tracing::warn!(
                rank = self.pg.rank(),
                "ZeroRedundancyOptimizer::to_record without consolidate_state: this is this \
                 rank's shard only; save checkpoints with ZeroRedundancyOptimizer::save_checkpoint"
            );
        }
        self.local_state()
    }

    /// Takes a full record (every parameter's state, as [`to_record`](Self::to_record) gives
    /// on rank 0 after consolidation); the next step keeps this rank's shard of it.
    fn load_record(mut self, record: Self::Record) -> Self {
        self.inner = self.inner.load_record(HashMap::new());
        self.pending = Some(record);
        self.consolidated = None;
        self
    }
}

impl<O, M, B> Clone for ZeroRedundancyOptimizer<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    O::Record: Clone,
{
    fn clone(&self) -> Self {
        ZeroRedundancyOptimizer {
            inner: self.inner.clone(),
            pg: self.pg.clone(),
            plan: self.plan.clone(),
            pending: self.pending.clone(),
            consolidated: self.consolidated.clone(),
            poisoned: self.poisoned.clone(),
            _module: PhantomData,
        }
    }
}

impl<O, M, B> std::fmt::Debug for ZeroRedundancyOptimizer<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroRedundancyOptimizer")
            .field("rank", &self.pg.rank())
            .field("world_size", &self.pg.world_size())
            .field(
                "shard_bytes",
                &self.plan.as_ref().map(|p| p.partition.loads().to_vec()),
            )
            .field("poisoned", &self.poisoned)
            .finish()
    }
}
