//! [`ZeroRedundancyOptimizer`]: any burn optimizer, its state sharded across the ranks.

use super::consolidate::{encode, gather_on_rank0};
use super::device::shard_collectives;
use super::error::ZeroError;
use super::stage2::{
    DEFAULT_ZERO_BUCKET_BYTES, GradLayout, LocalGradientsHook, ZeroStage, all_gather_params,
    reduce_scatter_grads,
};
use super::stage2_device;
use crate::checkpoint::{
    FullCheckpointer, SavedCheckpoint, TrainingState, mark_partial_optimizer_record,
};
use crate::engine::model_sync::{broadcast_bytes, read_values, write_values};
use crate::engine::module_tensors::{TensorInfo, describe, keep_shard};
use crate::engine::params::first_tied_trainable;
use crate::engine::partition::Partition;
use crate::engine::reducer::ShardCollectives;
use crate::{Collectives, DistributedDataParallel, TapBackend};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::ProcessGroup;
use hashbrown::HashMap;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::Arc;

/// The partition of one module layout.
#[derive(Debug, Clone)]
struct Plan {
    layout: Vec<TensorInfo>,
    partition: Partition,
    owned: HashSet<ParamId>,
    /// Stage 2's reduce-scatter layout of the same partition.
    grads: GradLayout,
}

/// A record loaded before this rank kept its shard of it (split at the next step).
#[derive(Clone)]
struct Pending<R> {
    record: R,
    /// Every parameter's state (a full checkpoint's, through `load_record`), not only this
    /// rank's (a sharded checkpoint's): only a whole record may reach a plain full save.
    whole: bool,
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
///   the [`FullCheckpointer`]. [`FullCheckpointer::load_latest`] loads it on every rank; each rank keeps
///   the entries of its own shard at its next step, under the partition of the current world
///   size. So a run saved at one world size resumes at another, and a checkpoint of plain DDP
///   resumes with ZeRO and back.
///
/// - **Stage 2** ([`ZeroStage::Two`], built with [`stage2`](Self::stage2)): gradients are
///   sharded too. `step` then takes this rank's *local* gradients (DDP with
///   [`LocalGradientsHook`], which [`stage2`](Self::stage2) registers), reduce-scatters them
///   (`Avg`) so each rank keeps the averaged gradients of its own shard only
///   ([`gradient_bytes`](Self::gradient_bytes)), steps that shard, and all-gathers the updated
///   parameters (instead of one broadcast per rank); both in groups of at most
///   [`with_bucket_bytes`](Self::with_bucket_bytes) per rank, one collective each. The reduce-scatter runs
///   after backward, not overlapped with it: DDP's buckets do not follow the partition, and
///   DDP materialises every parameter's gradient, so the full local gradient exists until the
///   step begins (see the [module docs](super#stage-2)).
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
    /// A record loaded since the last step; split at the next one.
    pending: Option<Pending<O::Record>>,
    /// Rank 0 after [`Self::consolidate_state`]: every shard's state.
    consolidated: Option<O::Record>,
    poisoned: Option<String>,
    stage: ZeroStage,
    /// Bytes of averaged gradients this rank held in its last step.
    gradient_bytes: Option<usize>,
    /// Stage 2: bytes per rank in one reduce-scatter or all-gather at most.
    bucket_bytes: usize,
    /// Stage 2: which communicator carries its collectives.
    collectives: Collectives,
    /// Stage 2: the device communicator `collectives` chose (`None`: the process group's CPU
    /// transports), created at the first step (every rank reaches it together).
    shard_comm: Option<Option<Arc<dyn ShardCollectives<B::InnerBackend>>>>,
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
        crate::cpu_fast_path::prepare_once::<B::Device>(pg.rank());
        ZeroRedundancyOptimizer {
            inner,
            pg,
            plan: None,
            pending: None,
            consolidated: None,
            poisoned: None,
            stage: ZeroStage::One,
            gradient_bytes: None,
            bucket_bytes: DEFAULT_ZERO_BUCKET_BYTES,
            collectives: Collectives::Host,
            shard_comm: None,
            _module: PhantomData,
        }
    }

    /// Shards gradients too ([`ZeroStage::Two`]) or not ([`ZeroStage::One`], the default).
    /// At stage 2, pass this rank's local gradients to `step`: build it with
    /// [`stage2`](Self::stage2) when you train with DDP. Every rank uses the same stage.
    pub fn with_stage(mut self, stage: ZeroStage) -> Self {
        self.stage = stage;
        self
    }

    /// Stage 2 reduce-scatters the gradients and all-gathers the parameters in groups of
    /// consecutive tensors of at most `bytes` per rank each (default
    /// [`DEFAULT_ZERO_BUCKET_BYTES`]; a larger tensor travels alone), so a collective's buffer
    /// is `world * bytes` and the whole model is never staged at once (DeepSpeed's
    /// `reduce_bucket_size`). The result does not depend on it at world 1 and 2 (bitwise);
    /// from world 3 on the TCP ring's order of additions may differ in the last bit. Every
    /// rank uses the same value.
    pub fn with_bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes.max(1);
        self.plan = None;
        self
    }

    /// Which communicator carries stage 2's reduce-scatters and all-gathers (default
    /// [`Collectives::Host`] for [`new`](Self::new); [`stage2`](Self::stage2) takes DDP's):
    /// - [`Collectives::Auto`]: NCCL on the GPU when the model is on burn's CUDA backend, the
    ///   world size is above 1 and every rank can run NCCL on a GPU of its own (feature
    ///   `cuda`); otherwise the process group's CPU transports.
    /// - [`Collectives::Nccl`]: NCCL, or an error at the first step saying what is missing.
    /// - [`Collectives::Host`]: the CPU transports, through host memory.
    /// - [`Collectives::StandIn`]: the device engine's CPU stand-in (tests the device path on
    ///   machines without GPUs).
    ///
    /// On a device communicator the gradients and parameters stay tensors on the model's
    /// device (stage 2's f32 parameters only). Every rank uses the same value; set it before
    /// the first step.
    pub fn with_collectives(mut self, collectives: Collectives) -> Self {
        self.collectives = collectives;
        self.shard_comm = None;
        self
    }

    /// The device communicator stage 2 uses ("NCCL", "the stand-in"), once its first step
    /// has chosen one; `None` for the process group's CPU transports (or before the first
    /// step).
    pub fn device_communicator(&self) -> Option<&'static str> {
        self.shard_comm.as_ref()?.as_ref().map(|c| c.name())
    }

    /// The sharding stage.
    pub fn stage(&self) -> ZeroStage {
        self.stage
    }

    /// Bytes of averaged gradients this rank held in its last step, for diagnostics: at stage 1
    /// the whole model's (DDP's all-reduce gives every rank all of them), at stage 2 its block
    /// of the reduce-scatter only (its shard's gradients, one flag per tensor, padding up to
    /// the largest shard). `None` before the first step.
    pub fn gradient_bytes(&self) -> Option<usize> {
        self.gradient_bytes
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

    /// This rank's optimizer state: its shard's entries only (a record loaded before the
    /// partition is known is held as loaded).
    pub fn local_state(&self) -> O::Record {
        match (&self.pending, &self.plan) {
            (Some(pending), Some(plan)) => keep_owned(pending.record.clone(), &plan.owned),
            (Some(pending), None) => pending.record.clone(),
            (None, _) => self.inner.to_record(),
        }
    }

    /// Whether [`local_state`](Self::local_state) is every parameter's state: at world 1, or a
    /// whole loaded record the partition has not yet cut down to this rank's entries.
    pub(super) fn holds_whole_state(&self) -> bool {
        self.pg.world_size() == 1
            || matches!(
                (&self.pending, &self.plan),
                (Some(Pending { whole: true, .. }), None)
            )
    }

    /// Takes a sharded checkpoint's state: this rank's own parameters' entries (`whole`
    /// false), or every parameter's where the load read every shard because this optimizer
    /// held a whole state (`whole` true). Like [`load_record`](Optimizer::load_record), but
    /// presented as the whole state only when it is.
    pub(super) fn load_sharded_state(&mut self, record: O::Record, whole: bool) {
        self.inner = self.inner.clone().load_record(HashMap::new());
        self.pending = Some(Pending { record, whole });
        self.consolidated = None;
    }

    /// The size of [`local_state`](Self::local_state) serialised at full precision (burn's
    /// `BinBytesRecorder`): this rank's optimizer memory, for diagnostics. It serialises the
    /// state, so it costs about a copy of it.
    pub fn local_state_bytes(&self) -> Result<usize, ZeroError> {
        Ok(encode::<B, R>(self.local_state())?.len())
    }

    /// Steps this rank's shard with `grads` (stage 1: averaged over the ranks; stage 2: this
    /// rank's own), then shares every shard's updated parameters from its owner.
    ///
    /// # Collective
    /// Every rank calls it at the same point, with the same module layout.
    ///
    /// # Errors
    /// [`ZeroError::Broadcast`] (stage 1), [`ZeroError::ReduceGradients`],
    /// [`ZeroError::GatherParameters`], [`ZeroError::Unsupported`] (stage 2),
    /// [`ZeroError::TiedParameter`]; after any of these the process group is aborted.
    /// [`ZeroError::Poisoned`] after an earlier failure.
    pub fn try_step(&mut self, lr: f64, module: M, grads: GradientsParams) -> Result<M, ZeroError> {
        let (module, result) = self.step_shard(module, grads, |inner, module, grads| {
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
    /// [`ZeroError::Consolidate`], [`ZeroError::TiedParameter`]; after either the process group
    /// is aborted. [`ZeroError::Poisoned`] after an earlier failure.
    pub fn consolidate_state(&mut self, module: &M) -> Result<(), ZeroError> {
        self.check_usable()?;
        let settled = self.settle(module);
        let device = self.guard(settled)?;
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
    /// ([`consolidate_state`](Self::consolidate_state)), calls [`FullCheckpointer::save`], then
    /// frees the gathered copy.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Those of [`consolidate_state`](Self::consolidate_state) and [`FullCheckpointer::save`].
    pub fn save_checkpoint(
        &mut self,
        checkpointer: &FullCheckpointer,
        module: &M,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, ZeroError> {
        // Before gathering every rank's state on rank 0.
        checkpointer.config().writable("save a checkpoint")?;
        self.consolidate_state(module)?;
        let saved = checkpointer.save::<B, M, Self>(module, self, state);
        self.consolidated = None;
        Ok(saved?)
    }

    /// Partitions `module` (again if its layout changed) and splits a pending full record.
    /// Returns the device of the module's first tensor.
    ///
    /// # Errors
    /// [`ZeroError::TiedParameter`]: the partition gives each tensor of the module one owner,
    /// and a parameter that appears twice would get two.
    fn settle(&mut self, module: &M) -> Result<Option<B::Device>, ZeroError> {
        let (layout, device) = describe::<B, M>(module);
        let changed = self.plan.as_ref().map(|p| &p.layout) != Some(&layout);
        let had_plan = self.plan.is_some();
        if changed && let Some(path) = first_tied_trainable::<B, M>(module) {
            return Err(ZeroError::TiedParameter { path });
        }
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
            let grads =
                GradLayout::new(&layout, &partition, self.pg.world_size(), self.bucket_bytes);
            self.plan = Some(Plan {
                layout,
                partition,
                owned,
                grads,
            });
        }
        if let Some(plan) = &self.plan {
            if let Some(loaded) = self.pending.take() {
                self.inner = self
                    .inner
                    .clone()
                    .load_record(keep_owned(loaded.record, &plan.owned));
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
        Ok(device)
    }

    /// The common part of `step` and `step_multi`: `grads` narrowed to this rank's shard
    /// (stage 1: dropping the others; stage 2: reduce-scattering), `update` steps the shard,
    /// then the owners' parameters are shared (stage 1: a broadcast per owner; stage 2: one
    /// all-gather). On error the module is returned as far as it got.
    fn step_shard<G: ShardGrads>(
        &mut self,
        module: M,
        grads: G,
        update: impl FnOnce(&mut O, M, G) -> M,
    ) -> (M, Result<(), ZeroError>) {
        if let Err(e) = self.check_usable() {
            return (module, Err(e));
        }
        let settled = self.settle(&module);
        let device = match self.guard(settled) {
            Ok(device) => device,
            Err(e) => return (module, Err(e)),
        };
        self.consolidated = None;
        let Some(plan) = self.plan.clone() else {
            return (module, Ok(()));
        };
        let rank = self.pg.rank();
        if self.stage == ZeroStage::Two && self.shard_comm.is_none() {
            let chosen = match device {
                Some(d) => shard_collectives::<B::InnerBackend>(&self.pg, self.collectives, &d),
                None => Ok(None),
            };
            match self.guard(chosen) {
                Ok(c) => self.shard_comm = Some(c),
                Err(e) => return (module, Err(e)),
            }
        }
        let comm = self.shard_comm.as_ref().and_then(|c| c.as_deref());
        let grads = match self.stage {
            ZeroStage::One => Ok(grads.keep::<B, M>(&module, &plan.partition.mask(rank))),
            ZeroStage::Two => grads.reduce_scatter::<B, M>(&self.pg, comm, &module, &plan.grads),
        };
        let grads = match self.guard(grads) {
            Ok(grads) => grads,
            Err(e) => return (module, Err(e)),
        };
        self.gradient_bytes = Some(match self.stage {
            ZeroStage::One => plan
                .layout
                .iter()
                .filter(|t| t.trainable)
                .map(|t| t.bytes)
                .sum(),
            ZeroStage::Two => plan.grads.received() * std::mem::size_of::<f32>(),
        });
        let module = update(&mut self.inner, module, grads);
        let (module, result) = match self.stage {
            ZeroStage::One => share_shards::<B, M>(&self.pg, module, &plan.partition),
            ZeroStage::Two => match self.shard_comm.as_ref().and_then(|c| c.as_deref()) {
                Some(comm) => stage2_device::all_gather_params::<B, M>(
                    comm,
                    &self.pg,
                    module,
                    &plan.partition,
                    &plan.grads,
                ),
                None => all_gather_params::<B, M>(
                    &self.pg,
                    module,
                    &plan.layout,
                    &plan.partition,
                    &plan.grads,
                ),
            },
        };
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
            // The device communicator first, as DDP does: peers waiting in one of its
            // collectives fail with this reason, which the process group's abort cannot reach.
            if let Some(Some(comm)) = &self.shard_comm {
                comm.abort(&reason);
            }
            if self.pg.world_size() > 1 {
                self.pg.abort(&reason);
            }
            self.poisoned = Some(reason);
        }
        result
    }
}

impl<O, M, B, R> ZeroRedundancyOptimizer<O, M, B>
where
    B: TapBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
    R: Record<B> + Clone,
{
    /// ZeRO stage 2 over `ddp`: registers [`LocalGradientsHook`] on it, so its `backward`
    /// returns this rank's own gradients, and shards `inner` with gradients reduce-scattered
    /// at each step. Call it on every rank, before the first forward; use the result as any
    /// optimizer (`ddp.optimizer_step(&mut zero, lr, grads)`).
    ///
    /// # Errors
    /// [`ZeroError::Setup`] when DDP refuses the hook (after the first forward, with another
    /// hook or compression, or with `Collectives::Nccl`).
    pub fn stage2(inner: O, ddp: &mut DistributedDataParallel<B, M>) -> Result<Self, ZeroError> {
        ddp.register_comm_hook(LocalGradientsHook)
            .map_err(ZeroError::Setup)?;
        Ok(Self::new(inner, ddp.process_group().clone())
            .with_stage(ZeroStage::Two)
            .with_collectives(ddp.config().collectives))
    }
}

/// Gradients narrowed to one rank's shard: a single set ([`Optimizer::step`]) or one per
/// device ([`Optimizer::step_multi`], each reduced on its own, in order).
trait ShardGrads: Sized {
    /// Stage 1: keeps the gradients of the tensors selected by `keep`.
    fn keep<B: AutodiffBackend, M: AutodiffModule<B>>(self, module: &M, keep: &[bool]) -> Self;
    /// Stage 2: this rank's averaged shard of every rank's local gradients, on `comm` when
    /// there is a device communicator.
    fn reduce_scatter<B: AutodiffBackend, M: AutodiffModule<B>>(
        self,
        pg: &ProcessGroup,
        comm: Option<&dyn ShardCollectives<B::InnerBackend>>,
        module: &M,
        plan: &GradLayout,
    ) -> Result<Self, ZeroError>;
}

impl ShardGrads for GradientsParams {
    fn keep<B: AutodiffBackend, M: AutodiffModule<B>>(self, module: &M, keep: &[bool]) -> Self {
        keep_shard::<B, M>(module, self, keep)
    }

    fn reduce_scatter<B: AutodiffBackend, M: AutodiffModule<B>>(
        self,
        pg: &ProcessGroup,
        comm: Option<&dyn ShardCollectives<B::InnerBackend>>,
        module: &M,
        plan: &GradLayout,
    ) -> Result<Self, ZeroError> {
        match comm {
            Some(comm) => stage2_device::reduce_scatter_grads::<B, M>(pg, comm, module, self, plan),
            None => reduce_scatter_grads::<B, M>(pg, module, self, plan),
        }
    }
}

impl ShardGrads for MultiGradientsParams {
    fn keep<B: AutodiffBackend, M: AutodiffModule<B>>(mut self, module: &M, keep: &[bool]) -> Self {
        for (g, _) in self.grads.iter_mut() {
            *g = keep_shard::<B, M>(module, std::mem::take(g), keep);
        }
        self
    }

    fn reduce_scatter<B: AutodiffBackend, M: AutodiffModule<B>>(
        mut self,
        pg: &ProcessGroup,
        comm: Option<&dyn ShardCollectives<B::InnerBackend>>,
        module: &M,
        plan: &GradLayout,
    ) -> Result<Self, ZeroError> {
        for (g, _) in self.grads.iter_mut() {
            *g = std::mem::take(g).reduce_scatter::<B, M>(pg, comm, module, plan)?;
        }
        Ok(self)
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

/// The module after a step through burn's `Optimizer`, whose `step` cannot return an error:
/// `step` and `step_multi` log a failed step here.
fn logging_failure<M>((module, result): (M, Result<(), ZeroError>)) -> M {
    if let Err(e) = result {
        tracing::error!(error = %e, "ZeRO step failed");
    }
    module
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
        logging_failure(self.step_shard(module, grads, |inner, module, grads| {
            inner.step(lr, module, grads)
        }))
    }

    fn step_multi(&mut self, lr: f64, module: M, grads: MultiGradientsParams) -> M {
        logging_failure(self.step_shard(module, grads, |inner, module, grads| {
            inner.step_multi(lr, module, grads)
        }))
    }

    /// The full state on rank 0 after [`consolidate_state`](Self::consolidate_state) (what
    /// [`FullCheckpointer::save`] writes), or a full record [loaded](Self::load_record) before
    /// the first step that follows; otherwise this rank's shard only (also a loaded record once
    /// a partition exists, and a sharded checkpoint's part), with a warning when the state is
    /// sharded over several ranks. [`FullCheckpointer::save`] given such a shard fails on every
    /// rank ([`CheckpointError::PartialOptimizerState`]) and writes nothing.
    ///
    /// [`CheckpointError::PartialOptimizerState`]: crate::checkpoint::CheckpointError::PartialOptimizerState
    fn to_record(&self) -> Self::Record {
        if let Some(full) = &self.consolidated {
            return full.clone();
        }
        if !self.holds_whole_state() {
            tracing::warn!(
                rank = self.pg.rank(),
                "ZeroRedundancyOptimizer::to_record without consolidate_state: this is this \
                 rank's shard only; save checkpoints with ZeroRedundancyOptimizer::save_checkpoint"
            );
            mark_partial_optimizer_record(
                "a ZeroRedundancyOptimizer's shard of this rank only (its state is sharded over \
                 the ranks): save with ZeroRedundancyOptimizer::save_checkpoint, which gathers \
                 the whole state first, or call consolidate_state before FullCheckpointer::save",
            );
        }
        self.local_state()
    }

    /// Takes a full record (every parameter's state, as [`to_record`](Self::to_record) gives
    /// on rank 0 after consolidation); the next step keeps this rank's shard of it.
    fn load_record(mut self, record: Self::Record) -> Self {
        self.inner = self.inner.load_record(HashMap::new());
        self.pending = Some(Pending {
            record,
            whole: true,
        });
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
            stage: self.stage,
            gradient_bytes: self.gradient_bytes,
            bucket_bytes: self.bucket_bytes,
            collectives: self.collectives,
            shard_comm: self.shard_comm.clone(),
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
            .field("stage", &self.stage)
            .field(
                "shard_bytes",
                &self.plan.as_ref().map(|p| p.partition.loads().to_vec()),
            )
            .field("poisoned", &self.poisoned)
            .finish()
    }
}
