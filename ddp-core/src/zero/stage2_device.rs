//! ZeRO stage 2 on a device communicator ([`ShardCollectives`]): the same groups and blocks
//! as the host path ([`GradLayout`]), assembled and taken apart with tensor operations on the
//! model's device, so no gradient or parameter is read to the host.
//!
//! Which tensors have a gradient on some rank (the host path's flags) is agreed over the CPU
//! process group instead, one byte per tensor, so that nothing is read back from the device to
//! decide what the optimizer sees; the flags' places in the blocks hold zeros.

use super::error::ZeroError;
use super::stage2::{GradLayout, GroupWalk, not_f32_gradient};
use crate::engine::partition::Partition;
use crate::engine::reducer::ShardCollectives;
use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};
use ddp_comm::{ProcessGroup, ReduceOp};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// [`reduce_scatter_grads`](super::stage2::reduce_scatter_grads) on `comm`: the averaged
/// gradients of the tensors this rank owns (those some rank had a gradient for).
///
/// # Collective
/// Every rank calls it at the same point with the same module layout.
pub(crate) fn reduce_scatter_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    comm: &dyn ShardCollectives<Inner<B>>,
    module: &M,
    mut grads: GradientsParams,
    plan: &GradLayout,
) -> Result<GradientsParams, ZeroError> {
    let (world, rank) = (pg.world_size(), pg.rank());
    let present = agree_on_gradients::<B, M>(pg, module, &grads, plan)?;
    let mut into = GradientsParams::new();
    for (g, group) in plan.groups.iter().enumerate() {
        let mut take = TakeGrads::<B> {
            walk: plan.walk(g),
            grads: &mut grads,
            taken: (0..plan.numels.len()).map(|_| None).collect(),
            device: None,
            error: None,
        };
        module.visit(&mut take);
        if let Some(e) = take.error {
            return Err(e);
        }
        let Some(device) = take.device.clone() else {
            continue;
        };
        // Block `r`: rank `r`'s tensors in module order (zeros where this rank has no
        // gradient), then zeros for the flags and the padding.
        let mut pieces = Vec::new();
        for owner in 0..world {
            let mut filled = 0;
            for i in group.tensors.clone() {
                match plan.slots[i] {
                    Some(slot) if slot.owner == owner => {
                        let n = plan.numels[i];
                        pieces.push(
                            take.taken[i]
                                .take()
                                .unwrap_or_else(|| Tensor::zeros([n], &device)),
                        );
                        filled += n;
                    }
                    _ => {}
                }
            }
            if group.block > filled {
                pieces.push(Tensor::zeros([group.block - filled], &device));
            }
        }
        let mine = comm.reduce_scatter(Tensor::cat(pieces, 0), group.block)?;
        module.visit(&mut PutGrads::<B> {
            walk: plan.walk(g),
            rank,
            present: &present,
            mine: &mine,
            into: &mut into,
        });
    }
    Ok(into)
}

/// Per tensor (module order): whether some rank has a gradient for it. One small all-reduce
/// over the CPU group.
fn agree_on_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: &M,
    grads: &GradientsParams,
    plan: &GradLayout,
) -> Result<Vec<bool>, ZeroError> {
    let mut has = HasGrads::<B> {
        grads,
        flags: Vec::with_capacity(plan.numels.len()),
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut has);
    let mut flags = has.flags;
    pg.all_reduce(&mut flags, ReduceOp::Max)
        .map_err(|source| ZeroError::ReduceGradients { source })?;
    Ok(flags.into_iter().map(|f| f > 0).collect())
}

struct HasGrads<'a, B> {
    grads: &'a GradientsParams,
    flags: Vec<u8>,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for HasGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let has = self.grads.get::<Inner<B>, D>(param.id).is_some();
        self.flags.push(u8::from(has));
    }
}

/// Takes the gradients of one group's tensors out of burn's gradients, flattened.
struct TakeGrads<'a, B: AutodiffBackend> {
    walk: GroupWalk<'a>,
    grads: &'a mut GradientsParams,
    taken: Vec<Option<Tensor<Inner<B>, 1>>>,
    device: Option<B::Device>,
    error: Option<ZeroError>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some((index, _)) = self.walk.step() else {
            return;
        };
        if self.error.is_some() {
            return;
        }
        if self.device.is_none() {
            self.device = Some(param.val().device());
        }
        let Some(grad) = self.grads.remove::<Inner<B>, D>(param.id) else {
            return;
        };
        let n = self.walk.plan.numels[index];
        if grad.dtype() != DType::F32 || grad.shape().num_elements() != n {
            self.error = Some(not_f32_gradient(
                param.id,
                grad.shape().num_elements(),
                grad.dtype(),
                n,
            ));
            return;
        }
        self.taken[index] = Some(grad.reshape([n]));
    }
}

/// Registers this rank's averaged gradients of one group, as views of its reduced block.
struct PutGrads<'a, B: AutodiffBackend> {
    walk: GroupWalk<'a>,
    rank: usize,
    present: &'a [bool],
    mine: &'a Tensor<Inner<B>, 1>,
    into: &'a mut GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some((index, slot)) = self.walk.step() else {
            return;
        };
        if slot.owner != self.rank || !self.present[index] {
            return;
        }
        let n = self.walk.plan.numels[index];
        let grad = self
            .mine
            .clone()
            .narrow(0, slot.data_at, n)
            .reshape(param.val().shape());
        self.into.register::<Inner<B>, D>(param.id, grad);
    }
}

/// [`all_gather_params`](super::stage2::all_gather_params) on `comm`: every owner's updated
/// parameters to every rank, one all-gather per group, on the device. On error the module is
/// returned as it was.
///
/// # Collective
/// Every rank calls it at the same point with the same module layout.
pub(crate) fn all_gather_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    comm: &dyn ShardCollectives<Inner<B>>,
    pg: &ProcessGroup,
    module: M,
    partition: &Partition,
    plan: &GradLayout,
) -> (M, Result<(), ZeroError>) {
    let (world, rank) = (pg.world_size(), pg.rank());
    if world == 1 {
        return (module, Ok(()));
    }
    let before = module.clone();
    let mut module = module;
    let owners = partition.owners();
    for group in &plan.groups {
        // Per tensor of the group: its offset in its owner's block; per rank: its block's size.
        let mut offset = vec![0usize; plan.numels.len()];
        let mut sizes = vec![0usize; world];
        for i in group.tensors.clone() {
            if let Some(r) = owners[i].filter(|&r| r < world) {
                offset[i] = sizes[r];
                sizes[r] += plan.numels[i];
            }
        }
        let block = sizes.iter().copied().max().unwrap_or(0);
        let mut mine = CollectOwned::<B> {
            next: 0,
            rank,
            group: group.tensors.clone(),
            owners,
            pieces: Vec::new(),
            device: None,
            error: None,
        };
        module.visit(&mut mine);
        if let Some(e) = mine.error {
            return (before, Err(e));
        }
        let Some(device) = mine.device.clone() else {
            continue;
        };
        let mut pieces = mine.pieces;
        if block > sizes[rank] {
            pieces.push(Tensor::zeros([block - sizes[rank]], &device));
        }
        let gathered = match comm.all_gather(Tensor::cat(pieces, 0)) {
            Ok(all) => all,
            Err(e) => return (before, Err(e.into())),
        };
        module = module.map(&mut WriteGathered::<B> {
            next: 0,
            rank,
            group: group.tensors.clone(),
            owners,
            offset: &offset,
            block,
            all: &gathered,
        });
    }
    (module, Ok(()))
}

/// This rank's tensors of one group, flattened, in module order.
struct CollectOwned<'a, B: AutodiffBackend> {
    next: usize,
    rank: usize,
    group: std::ops::Range<usize>,
    owners: &'a [Option<usize>],
    pieces: Vec<Tensor<Inner<B>, 1>>,
    device: Option<B::Device>,
    error: Option<ZeroError>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectOwned<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        if !self.group.contains(&index) || self.error.is_some() {
            return;
        }
        let value = param.val();
        if self.device.is_none() {
            self.device = Some(value.device());
        }
        if self.owners.get(index).copied().flatten() != Some(self.rank) {
            return;
        }
        if value.dtype() != DType::F32 {
            self.error = Some(ZeroError::Unsupported {
                parameter: param.id.to_string(),
                reason: format!(
                    "ZeRO stage 2 on the device gathers f32 parameters; this one is {:?} (use \
                     Collectives::Host)",
                    value.dtype()
                ),
            });
            return;
        }
        let n = value.shape().num_elements();
        self.pieces.push(value.inner().reshape([n]));
    }
}

/// Writes the other ranks' tensors of one group from the gathered buffer.
struct WriteGathered<'a, B: AutodiffBackend> {
    next: usize,
    rank: usize,
    group: std::ops::Range<usize>,
    owners: &'a [Option<usize>],
    offset: &'a [usize],
    block: usize,
    all: &'a Tensor<Inner<B>, 1>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for WriteGathered<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        let owner = match self.owners.get(index).copied().flatten() {
            Some(r) if r != self.rank && self.group.contains(&index) => r,
            _ => return param,
        };
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let start = owner * self.block + self.offset[index];
        let value = self
            .all
            .clone()
            .narrow(0, start, shape.num_elements())
            .reshape(shape);
        let value = Tensor::<B, D>::from_inner(value).set_require_grad(tensor.is_require_grad());
        Param::from_mapped_value(id, value, mapper)
    }
}
