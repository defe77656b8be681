//! ZeRO stage 2: gradients reduce-scattered to their owners, parameters all-gathered.
//!
//! The ranks' shards (the [`Partition`] of stage 1, by whole tensors) are laid end to end in
//! one flat f32 buffer of `world` equal blocks, block `r` holding rank `r`'s tensors in module
//! order, then one presence flag per tensor, then zero padding up to the largest shard. One
//! `reduce_scatter(Avg)` of that buffer leaves each rank with the averaged gradients of its own
//! tensors only; after its step, one `all_gather` of the owners' updated values (block `r`:
//! rank `r`'s tensors as bytes) gives every rank every parameter. Both blocks are padded to the
//! largest shard, which the partition keeps within one tensor of `1/world` of the model.

use super::error::ZeroError;
use super::module_tensors::TensorInfo;
use super::partition::Partition;
use crate::ddp::hooks::{CommHook, GradBucket, HookError};
use crate::ddp::model_sync::{read_values, write_values};
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor, TensorData};
use ddp_comm::{ProcessGroup, ReduceOp};

/// How much of the training state [`ZeroRedundancyOptimizer`](super::ZeroRedundancyOptimizer)
/// shards across the ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ZeroStage {
    /// Optimizer state only (PyTorch's `ZeroRedundancyOptimizer`). `step` takes gradients
    /// already averaged over the ranks (DDP's `backward`); each owner broadcasts its updated
    /// parameters, one broadcast per rank per step.
    #[default]
    One,
    /// Optimizer state and gradients (DeepSpeed's stage 2, FSDP's `SHARD_GRAD_OP`). `step`
    /// takes this rank's *local* gradients (DDP with [`LocalGradientsHook`], or plain
    /// `loss.backward()`), reduce-scatters them so each rank keeps the averaged gradients of its
    /// shard only, steps that shard, and all-gathers the parameters: two collectives per step.
    Two,
}

/// A [`CommHook`] that leaves every bucket as it is, so DDP's `backward` returns this rank's
/// own (summed, not averaged) gradients: the input ZeRO stage 2 reduce-scatters itself.
/// Register it with
/// [`ZeroRedundancyOptimizer::stage2`](super::ZeroRedundancyOptimizer::stage2) or by hand with
/// [`DistributedDataParallel::register_comm_hook`](crate::DistributedDataParallel::register_comm_hook).
///
/// DDP still does everything else (replica sync at construction, buffers from rank 0, the
/// agreement on which parameters got a gradient); only f32 buckets go through hooks, so
/// stage 2 refuses parameters of other dtypes.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalGradientsHook;

impl CommHook for LocalGradientsHook {
    fn reduce(&mut self, _bucket: &mut GradBucket, _pg: &ProcessGroup) -> Result<(), HookError> {
        Ok(())
    }

    fn name(&self) -> &str {
        "zero-stage-2 local gradients"
    }
}

/// Where each rank's gradients go in the flat reduce-scatter buffer.
#[derive(Debug, Clone)]
pub(crate) struct GradLayout {
    /// f32 elements of every tensor, in module order (0 for untrained ones).
    numels: Vec<usize>,
    /// Owner of every tensor (`None`: not trained).
    owners: Vec<Option<usize>>,
    /// f32 elements of each rank's gradients (without flags).
    data: Vec<usize>,
    /// Elements per block: the largest shard's gradients plus its flags.
    block: usize,
}

impl GradLayout {
    pub(crate) fn new(layout: &[TensorInfo], partition: &Partition, world: usize) -> Self {
        let numels: Vec<usize> = layout
            .iter()
            .map(|t| if t.trainable { t.bytes / 4 } else { 0 })
            .collect();
        let owners = partition.owners().to_vec();
        let mut data = vec![0usize; world];
        let mut count = vec![0usize; world];
        for (n, owner) in numels.iter().zip(&owners) {
            if let Some(r) = owner {
                data[*r] += n;
                count[*r] += 1;
            }
        }
        let block = (0..world).map(|r| data[r] + count[r]).max().unwrap_or(0);
        GradLayout {
            numels,
            owners,
            data,
            block,
        }
    }

    /// Elements of the block each rank receives (its gradients, flags and padding).
    pub(crate) fn block(&self) -> usize {
        self.block
    }
}

/// Reduce-scatters this rank's local `grads` (`Avg`): returns the averaged gradients of the
/// tensors `rank` owns (those some rank had a gradient for) and drops the rest.
///
/// # Collective
/// Every rank calls it at the same point with the same module layout.
pub(crate) fn reduce_scatter_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: &M,
    mut grads: GradientsParams,
    plan: &GradLayout,
) -> Result<GradientsParams, ZeroError> {
    let world = pg.world_size();
    let mut flat = vec![0f32; plan.block * world];
    let mut pack = Pack::<B> {
        next: 0,
        plan,
        grads: &mut grads,
        flat: &mut flat,
        data_at: (0..world).map(|r| r * plan.block).collect(),
        flag_at: (0..world).map(|r| r * plan.block + plan.data[r]).collect(),
        error: None,
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut pack);
    if let Some(e) = pack.error {
        return Err(e);
    }
    drop(grads);
    let mut mine = vec![0f32; plan.block];
    pg.reduce_scatter(&flat, &mut mine, ReduceOp::Avg)
        .map_err(|source| ZeroError::ReduceGradients { source })?;
    drop(flat);
    let rank = pg.rank();
    let mut unpack = Unpack::<B> {
        next: 0,
        rank,
        plan,
        mine: &mine,
        data_at: 0,
        flag_at: plan.data[rank],
        into: GradientsParams::new(),
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut unpack);
    Ok(unpack.into)
}

/// Copies each trained tensor's local gradient (zeros if it has none) into its owner's block.
struct Pack<'a, B> {
    next: usize,
    plan: &'a GradLayout,
    grads: &'a mut GradientsParams,
    flat: &'a mut [f32],
    data_at: Vec<usize>,
    flag_at: Vec<usize>,
    error: Option<ZeroError>,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Pack<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        let Some(owner) = self.plan.owners.get(index).copied().flatten() else {
            return;
        };
        if self.error.is_some() {
            return;
        }
        let n = self.plan.numels[index];
        let at = self.data_at[owner];
        self.data_at[owner] += n;
        let flag = self.flag_at[owner];
        self.flag_at[owner] += 1;
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let data = grad.into_data();
        let values = match (data.dtype, data.as_slice::<f32>()) {
            (DType::F32, Ok(v)) if v.len() == n => v,
            (dtype, _) => {
                self.error = Some(ZeroError::Unsupported {
                    parameter: param.id.to_string(),
                    reason: format!(
                        "ZeRO stage 2 reduces f32 gradients; got {} {dtype:?} elements for a \
                         parameter of {n} f32 elements",
                        data.num_elements()
                    ),
                });
                return;
            }
        };
        self.flat[at..at + n].copy_from_slice(values);
        self.flat[flag] = 1.0;
    }
}

/// Turns this rank's reduced block back into gradients keyed by `ParamId`.
struct Unpack<'a, B> {
    next: usize,
    rank: usize,
    plan: &'a GradLayout,
    mine: &'a [f32],
    data_at: usize,
    flag_at: usize,
    into: GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unpack<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        if self.plan.owners.get(index).copied().flatten() != Some(self.rank) {
            return;
        }
        let n = self.plan.numels[index];
        let values = &self.mine[self.data_at..self.data_at + n];
        self.data_at += n;
        // The average of the flags is positive iff some rank had a gradient: only then does
        // the optimizer see one (as with DDP's averaged gradients).
        let present = self.mine[self.flag_at] > 0.0;
        self.flag_at += 1;
        if !present {
            return;
        }
        let value = param.val();
        let data = TensorData::new(values.to_vec(), value.shape());
        let grad = Tensor::<B::InnerBackend, D>::from_data(data, &value.device());
        self.into.register::<B::InnerBackend, D>(param.id, grad);
    }
}

/// Every owner's updated parameters to every rank in one `all_gather`, byte for byte. On
/// error the module is returned as it was.
///
/// # Collective
/// Every rank calls it at the same point with the same module layout.
pub(crate) fn all_gather_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: M,
    layout: &[TensorInfo],
    partition: &Partition,
) -> (M, Result<(), ZeroError>) {
    if pg.world_size() == 1 {
        return (module, Ok(()));
    }
    match gathered_others::<B, M>(pg, &module, layout, partition) {
        Ok((select, others)) => {
            let before = module.clone();
            match write_values::<B, M>(module, &select, false, &others) {
                Ok(module) => (module, Ok(())),
                Err(e) => (
                    before,
                    Err(ZeroError::GatherParameters {
                        reason: e.to_string(),
                    }),
                ),
            }
        }
        Err(e) => (module, Err(e)),
    }
}

/// The all-gather itself: which tensors other ranks own, and their bytes in module order (as
/// `write_values` reads them).
fn gathered_others<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: &M,
    layout: &[TensorInfo],
    partition: &Partition,
) -> Result<(Vec<bool>, Vec<u8>), ZeroError> {
    let (world, rank) = (pg.world_size(), pg.rank());
    // `read_values` writes each tensor as an 8-byte length and its bytes.
    let entry = |t: &TensorInfo| 8 + t.bytes;
    let owners = partition.owners();
    let mut sizes = vec![0usize; world];
    for (t, owner) in layout.iter().zip(owners) {
        if let Some(r) = owner {
            sizes[*r] += entry(t);
        }
    }
    let block = sizes.iter().copied().max().unwrap_or(0);
    let mut mine = read_values::<B, M>(module, &partition.mask(rank), false);
    if mine.len() != sizes[rank] {
        return Err(ZeroError::GatherParameters {
            reason: format!(
                "this rank's shard is {} bytes, its layout says {}; the module changed during \
                 the step",
                mine.len(),
                sizes[rank]
            ),
        });
    }
    mine.resize(block, 0);
    let mut all = vec![0u8; block * world];
    pg.all_gather(&mine, &mut all)
        .map_err(|e| ZeroError::GatherParameters {
            reason: e.to_string(),
        })?;
    drop(mine);
    // The other ranks' tensors, in module order, as `write_values` reads them.
    let mut at: Vec<usize> = (0..world).map(|r| r * block).collect();
    let mut others = Vec::with_capacity(block * (world - 1));
    let mut select = vec![false; layout.len()];
    for (i, (t, owner)) in layout.iter().zip(owners).enumerate() {
        match owner {
            Some(r) if *r != rank => {
                let n = entry(t);
                others.extend_from_slice(&all[at[*r]..at[*r] + n]);
                at[*r] += n;
                select[i] = true;
            }
            _ => {}
        }
    }
    Ok((select, others))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ParamId;

    fn tensor(elements: usize, trainable: bool) -> TensorInfo {
        TensorInfo {
            id: ParamId::new(),
            bytes: elements * 4,
            trainable,
        }
    }

    #[test]
    fn blocks_hold_the_largest_shard_and_one_flag_per_tensor() {
        // 100 -> r0, 60 -> r1, 50 -> r1, 30 -> r0, 10 -> r1; the buffer is not trained.
        let layout = [
            tensor(10, true),
            tensor(50, true),
            tensor(100, true),
            tensor(7, false),
            tensor(30, true),
            tensor(60, true),
        ];
        let sizes: Vec<Option<usize>> = layout
            .iter()
            .map(|t| t.trainable.then_some(t.bytes))
            .collect();
        let partition = Partition::balanced(&sizes, 2);
        let plan = GradLayout::new(&layout, &partition, 2);
        assert_eq!(plan.data, vec![130, 120]);
        assert_eq!(plan.block(), 132, "rank 0: 130 gradients + 2 flags");
        assert_eq!(plan.numels[3], 0, "buffers are not reduced");
        let single = GradLayout::new(&layout, &Partition::balanced(&sizes, 1), 1);
        assert_eq!(single.block(), 250 + 5);
    }
}
