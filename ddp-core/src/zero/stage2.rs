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
use crate::engine::hooks::{CommHook, GradBucket, HookError};
use crate::engine::model_sync::{read_values, write_values};
use crate::engine::module_tensors::TensorInfo;
use crate::engine::partition::Partition;
use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor, TensorData};
use ddp_comm::{ProcessGroup, ReduceOp};

/// How much of the training state [`ZeroRedundancyOptimizer`](super::ZeroRedundancyOptimizer)
/// shards across the ranks.
#[derive(burn::config::Config, Debug, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ZeroStage {
    /// Optimizer state only (PyTorch's `ZeroRedundancyOptimizer`). `step` takes gradients
    /// already averaged over the ranks (DDP's `backward`); each owner broadcasts its updated
    /// parameters, one broadcast per rank per step.
    One,
    /// Optimizer state and gradients (DeepSpeed's stage 2, FSDP's `SHARD_GRAD_OP`). `step`
    /// takes this rank's *local* gradients (DDP with [`LocalGradientsHook`], or plain
    /// `loss.backward()`), reduce-scatters them so each rank keeps the averaged gradients of its
    /// shard only, steps that shard, and all-gathers the parameters: two collectives per step.
    Two,
}

// Not derived: burn's `Config` derive rejects the `#[default]` variant attribute.
#[allow(clippy::derivable_impls)]
impl Default for ZeroStage {
    fn default() -> Self {
        ZeroStage::One
    }
}

/// A [`CommHook`] that leaves every bucket as it is, so DDP's `backward` returns this rank's
/// own (summed, not averaged) gradients: the input ZeRO stage 2 reduce-scatters itself.
/// Register it with
/// [`ZeroRedundancyOptimizer::stage2`](super::ZeroRedundancyOptimizer::stage2) or by hand with
/// [`DistributedDataParallel::register_comm_hook`](crate::DistributedDataParallel::register_comm_hook).
///
/// DDP still does everything else (replica sync at construction, buffers from rank 0, the
/// agreement on which parameters got a gradient), but copies no gradient into a bucket: they
/// stay tensors where backward left them ([`CommHook::leaves_gradients_local`]), and a
/// parameter this rank gave no gradient is absent, not zeros. Stage 2's flat buffers are f32,
/// so it refuses parameters of other dtypes at its step.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalGradientsHook;

impl CommHook for LocalGradientsHook {
    fn reduce(&mut self, _bucket: &mut GradBucket, _pg: &ProcessGroup) -> Result<(), HookError> {
        Ok(())
    }

    fn name(&self) -> &str {
        "zero-stage-2 local gradients"
    }

    fn leaves_gradients_local(&self) -> bool {
        true
    }
}

/// Bytes each rank contributes to one of stage 2's collectives at most, by default (DeepSpeed's
/// `reduce_bucket_size` and `allgather_bucket_size` play this part): each collective's buffer is
/// `world` times this, so the whole model is never staged in host memory at once.
pub const DEFAULT_ZERO_BUCKET_BYTES: usize = 32 << 20;

/// Where one owned tensor sits in its owner's block of its group.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) group: usize,
    pub(super) owner: usize,
    /// f32 offset of its values in the owner's block.
    pub(super) data_at: usize,
    /// f32 offset of its presence flag in the owner's block.
    flag_at: usize,
}

/// The tensors one reduce-scatter and one all-gather carry: a run of consecutive tensors in
/// module order.
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) tensors: std::ops::Range<usize>,
    /// f32 elements of each rank's block (the largest rank's gradients and flags).
    pub(super) block: usize,
}

/// How stage 2's collectives lay the gradients out: the tensors, in module order, cut into
/// groups of at most a bucket's bytes per rank; in each group, block `r` holds rank `r`'s
/// tensors, then one presence flag per tensor, then zero padding up to the largest rank's.
#[derive(Debug, Clone)]
pub(crate) struct GradLayout {
    /// f32 elements of every tensor, in module order (0 for untrained ones).
    pub(super) numels: Vec<usize>,
    /// Every tensor's place (`None`: not trained).
    pub(super) slots: Vec<Option<Slot>>,
    pub(super) groups: Vec<Group>,
}

impl GradLayout {
    /// Cuts a group where adding the next tensor would take some rank's block past
    /// `bucket_bytes` (a tensor larger than that gets a group of its own).
    pub(crate) fn new(
        layout: &[TensorInfo],
        partition: &Partition,
        world: usize,
        bucket_bytes: usize,
    ) -> Self {
        let numels: Vec<usize> = layout
            .iter()
            .map(|t| if t.trainable { t.bytes / 4 } else { 0 })
            .collect();
        let bucket = (bucket_bytes / 4).max(1);
        let mut plan = GradLayout {
            slots: vec![None; layout.len()],
            groups: Vec::new(),
            numels,
        };
        let mut open = OpenGroup::new(world);
        for (i, owner) in partition.owners().iter().enumerate() {
            let Some(r) = *owner else {
                continue;
            };
            if !open.members.is_empty() && open.block_with(r, plan.numels[i]) > bucket {
                open.close(&mut plan, i);
            }
            open.add(i, r, plan.numels[i]);
        }
        if !open.members.is_empty() {
            open.close(&mut plan, layout.len());
        }
        plan
    }

    /// f32 elements this rank receives over a step's reduce-scatters (its shard's gradients,
    /// one flag per tensor, padding up to the largest rank's in each group).
    pub(crate) fn received(&self) -> usize {
        self.groups.iter().map(|g| g.block).sum()
    }

    /// A visitor's walk over the module's tensors for group `group`.
    pub(super) fn walk(&self, group: usize) -> GroupWalk<'_> {
        GroupWalk {
            next: 0,
            group,
            plan: self,
        }
    }
}

/// The tensors a visitor of one group acts on: it steps once per tensor, in module order.
pub(super) struct GroupWalk<'a> {
    next: usize,
    group: usize,
    pub(super) plan: &'a GradLayout,
}

impl GroupWalk<'_> {
    /// Steps to the next tensor: its index and place if it is trained and in this group.
    pub(super) fn step(&mut self) -> Option<(usize, Slot)> {
        let index = self.next;
        self.next += 1;
        let slot = self.plan.slots.get(index).copied().flatten()?;
        (slot.group == self.group).then_some((index, slot))
    }
}

/// Stage 2 reduces f32 gradients only: the error for a gradient of parameter `parameter`
/// that is not its `numel` f32 elements (`got` elements of `dtype`).
pub(super) fn not_f32_gradient(
    parameter: ParamId,
    got: usize,
    dtype: DType,
    numel: usize,
) -> ZeroError {
    ZeroError::Unsupported {
        parameter: parameter.to_string(),
        reason: format!(
            "ZeRO stage 2 reduces f32 gradients; got {got} {dtype:?} elements for a parameter \
             of {numel} f32 elements"
        ),
    }
}

/// The group being filled while [`GradLayout::new`] walks the tensors.
struct OpenGroup {
    first: usize,
    /// The group's trained tensors: index and owner.
    members: Vec<(usize, usize)>,
    /// Per rank: its tensors' elements and their count (one flag each).
    data: Vec<usize>,
    count: Vec<usize>,
}

impl OpenGroup {
    fn new(world: usize) -> Self {
        OpenGroup {
            first: 0,
            members: Vec::new(),
            data: vec![0; world],
            count: vec![0; world],
        }
    }

    /// Rank `r`'s block if it also took a tensor of `numel` elements.
    fn block_with(&self, r: usize, numel: usize) -> usize {
        self.data[r] + self.count[r] + numel + 1
    }

    fn add(&mut self, index: usize, owner: usize, numel: usize) {
        self.data[owner] += numel;
        self.count[owner] += 1;
        self.members.push((index, owner));
    }

    /// Places the members in their owners' blocks and starts the next group at `end`.
    fn close(&mut self, plan: &mut GradLayout, end: usize) {
        let group = plan.groups.len();
        let world = self.data.len();
        let block = (0..world)
            .map(|r| self.data[r] + self.count[r])
            .max()
            .unwrap_or(0);
        let mut data_at = vec![0usize; world];
        // Each block: its owner's values, then their flags.
        let mut flag_at = self.data.clone();
        for &(i, owner) in &self.members {
            plan.slots[i] = Some(Slot {
                group,
                owner,
                data_at: data_at[owner],
                flag_at: flag_at[owner],
            });
            data_at[owner] += plan.numels[i];
            flag_at[owner] += 1;
        }
        plan.groups.push(Group {
            tensors: self.first..end,
            block,
        });
        *self = OpenGroup {
            first: end,
            ..OpenGroup::new(world)
        };
    }
}

/// Reduce-scatters this rank's local `grads` (`Avg`), one group of tensors at a time: returns
/// the averaged gradients of the tensors `rank` owns (those some rank had a gradient for) and
/// drops the rest as each group is sent.
///
/// # Collective
/// Every rank calls it at the same point with the same module layout.
pub(crate) fn reduce_scatter_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: &M,
    mut grads: GradientsParams,
    plan: &GradLayout,
) -> Result<GradientsParams, ZeroError> {
    let (world, rank) = (pg.world_size(), pg.rank());
    let mut into = GradientsParams::new();
    for (g, group) in plan.groups.iter().enumerate() {
        let mut flat = vec![0f32; group.block * world];
        let mut pack = Pack::<B> {
            walk: plan.walk(g),
            grads: &mut grads,
            flat: &mut flat,
            block: group.block,
            error: None,
            _backend: std::marker::PhantomData,
        };
        module.visit(&mut pack);
        if let Some(e) = pack.error {
            return Err(e);
        }
        let mut mine = vec![0f32; group.block];
        pg.reduce_scatter(&flat, &mut mine, ReduceOp::Avg)
            .map_err(|source| ZeroError::ReduceGradients { source })?;
        drop(flat);
        let mut unpack = Unpack::<B> {
            walk: plan.walk(g),
            rank,
            mine: &mine,
            into: &mut into,
            _backend: std::marker::PhantomData,
        };
        module.visit(&mut unpack);
    }
    Ok(into)
}

/// Copies each trained tensor's local gradient in one group (zeros if it has none) into its
/// owner's block, taking it out of burn's gradients.
struct Pack<'a, B> {
    walk: GroupWalk<'a>,
    grads: &'a mut GradientsParams,
    flat: &'a mut [f32],
    block: usize,
    error: Option<ZeroError>,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Pack<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some((index, slot)) = self.walk.step() else {
            return;
        };
        if self.error.is_some() {
            return;
        }
        let n = self.walk.plan.numels[index];
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let data = grad.into_data();
        let values = match (data.dtype, data.as_slice::<f32>()) {
            (DType::F32, Ok(v)) if v.len() == n => v,
            (dtype, _) => {
                self.error = Some(not_f32_gradient(param.id, data.num_elements(), dtype, n));
                return;
            }
        };
        let base = slot.owner * self.block;
        self.flat[base + slot.data_at..base + slot.data_at + n].copy_from_slice(values);
        self.flat[base + slot.flag_at] = 1.0;
    }
}

/// Turns this rank's reduced block of one group back into gradients keyed by `ParamId`.
struct Unpack<'a, B> {
    walk: GroupWalk<'a>,
    rank: usize,
    mine: &'a [f32],
    into: &'a mut GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unpack<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some((index, slot)) = self.walk.step() else {
            return;
        };
        if slot.owner != self.rank {
            return;
        }
        let n = self.walk.plan.numels[index];
        // The average of the flags is positive iff some rank had a gradient: only then does
        // the optimizer see one (as with DDP's averaged gradients).
        if self.mine[slot.flag_at] <= 0.0 {
            return;
        }
        let values = &self.mine[slot.data_at..slot.data_at + n];
        let value = param.val();
        let data = TensorData::new(values.to_vec(), value.shape());
        let grad = Tensor::<B::InnerBackend, D>::from_data(data, &value.device());
        self.into.register::<B::InnerBackend, D>(param.id, grad);
    }
}

/// Every owner's updated parameters to every rank, one `all_gather` per group of tensors (the
/// reduce-scatter's groups), byte for byte. On error the module is returned as it was.
///
/// # Collective
/// Every rank calls it at the same point with the same module layout.
pub(crate) fn all_gather_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: M,
    layout: &[TensorInfo],
    partition: &Partition,
    plan: &GradLayout,
) -> (M, Result<(), ZeroError>) {
    if pg.world_size() == 1 {
        return (module, Ok(()));
    }
    let before = module.clone();
    let mut module = module;
    for group in &plan.groups {
        let gathered =
            gathered_others::<B, M>(pg, &module, layout, partition, group.tensors.clone());
        let written = gathered.and_then(|(select, others)| {
            write_values::<B, M>(module.clone(), &select, false, &others).map_err(|e| {
                ZeroError::GatherParameters {
                    reason: e.to_string(),
                }
            })
        });
        match written {
            Ok(m) => module = m,
            Err(e) => return (before, Err(e)),
        }
    }
    (module, Ok(()))
}

/// One all-gather: which tensors of `tensors` other ranks own, and their bytes in module order
/// (as `write_values` reads them).
fn gathered_others<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: &M,
    layout: &[TensorInfo],
    partition: &Partition,
    tensors: std::ops::Range<usize>,
) -> Result<(Vec<bool>, Vec<u8>), ZeroError> {
    let (world, rank) = (pg.world_size(), pg.rank());
    // `read_values` writes each tensor as an 8-byte length and its bytes.
    let entry = |t: &TensorInfo| 8 + t.bytes;
    let owners = partition.owners();
    let in_group = |i: usize| tensors.contains(&i);
    let mut sizes = vec![0usize; world];
    for (i, (t, owner)) in layout.iter().zip(owners).enumerate() {
        if let (true, Some(r)) = (in_group(i), owner) {
            sizes[*r] += entry(t);
        }
    }
    let block = sizes.iter().copied().max().unwrap_or(0);
    let select_mine: Vec<bool> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| in_group(i) && *o == Some(rank))
        .collect();
    let mut mine = read_values::<B, M>(module, &select_mine, false);
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
            Some(r) if in_group(i) && *r != rank => {
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

    /// Five trained tensors and a buffer, their sizes (`None`: not trained), and their
    /// balanced partition over 2 ranks.
    fn five_trained_and_a_buffer() -> ([TensorInfo; 6], Vec<Option<usize>>, Partition) {
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
        (layout, sizes, partition)
    }

    #[test]
    fn blocks_hold_the_largest_shard_and_one_flag_per_tensor() {
        // 100 -> r0, 60 -> r1, 50 -> r1, 30 -> r0, 10 -> r1; the buffer is not trained.
        let (layout, sizes, partition) = five_trained_and_a_buffer();
        let plan = GradLayout::new(&layout, &partition, 2, DEFAULT_ZERO_BUCKET_BYTES);
        assert_eq!(plan.groups.len(), 1);
        assert_eq!(plan.received(), 132, "rank 0: 130 gradients + 2 flags");
        assert_eq!(plan.numels[3], 0, "buffers are not reduced");
        assert!(plan.slots[3].is_none());
        let single = GradLayout::new(&layout, &Partition::balanced(&sizes, 1), 1, 1 << 20);
        assert_eq!(single.received(), 250 + 5);
    }

    #[test]
    fn a_small_bucket_cuts_groups_and_every_tensor_keeps_its_owner_and_place() {
        let (layout, _, partition) = five_trained_and_a_buffer();
        // Module order: 10 (r1), 50 (r1), 100 (r0), a buffer, 30 (r0), 60 (r1); at most 62
        // elements (gradients and flags) per block: 10 and 50 share a group, 100 is alone (over
        // the cap by itself), 30 and 60 go to different ranks and share one.
        let plan = GradLayout::new(&layout, &partition, 2, 62 * 4);
        let ranges: Vec<_> = plan.groups.iter().map(|g| g.tensors.clone()).collect();
        assert_eq!(ranges, vec![0..2, 2..4, 4..6]);
        let blocks: Vec<_> = plan.groups.iter().map(|g| g.block).collect();
        assert_eq!(blocks, vec![62, 101, 61]);
        assert_eq!(plan.received(), 62 + 101 + 61);
        // Groups are consecutive and cover every tensor.
        assert_eq!(plan.groups[0].tensors.start, 0);
        for w in plan.groups.windows(2) {
            assert_eq!(w[0].tensors.end, w[1].tensors.start);
        }
        assert_eq!(
            plan.groups.last().map(|g| g.tensors.end),
            Some(layout.len())
        );
        for (i, slot) in plan.slots.iter().enumerate() {
            match slot {
                Some(s) => {
                    assert_eq!(Some(s.owner), partition.owners()[i]);
                    assert!(plan.groups[s.group].tensors.contains(&i));
                }
                None => assert!(!layout[i].trainable),
            }
        }
    }
}
