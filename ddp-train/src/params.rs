//! A module's parameters and gradients through collectives: flattened in module order (the same
//! on every rank, since the ranks hold the same architecture), reduced or broadcast, written back.
//!
//! Why module order and not `ParamId`s: ids are random per process until a module has been
//! loaded from rank 0's record, and a gradient map keyed by ids has no order; the visitor order
//! of one architecture is the same everywhere.

use crate::error::{DdpTrainError, Result};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use ddp_core::{ProcessGroup, ReduceOp};
use std::collections::HashSet;

/// Which float tensors of a module a broadcast carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    /// Every float tensor: parameters and buffers (at the start of training).
    All,
    /// Only tensors that take no gradient (buffers such as running statistics, frozen weights).
    Buffers,
}

impl Which {
    fn wants(self, trainable: bool) -> bool {
        match self {
            Which::All => true,
            Which::Buffers => !trainable,
        }
    }
}

/// One line per float tensor: path-free signature (index, shape, dtype, trainable), hashed.
///
/// Used to refuse training when the ranks built different models, which would otherwise reduce
/// unrelated numbers into each other.
pub(crate) fn fingerprint<B: Backend, M: Module<B>>(module: &M) -> (u64, usize) {
    struct Sig(Vec<String>);
    impl<B: Backend> ModuleVisitor<B> for Sig {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            self.0.push(format!(
                "{:?}:{:?}:{}",
                t.dims(),
                t.dtype(),
                t.is_require_grad()
            ));
        }
    }
    let mut sig = Sig(Vec::new());
    module.visit(&mut sig);
    // FNV-1a: stable across processes and platforms (std's hasher is seeded per process).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in sig.0.join("|").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash, sig.0.len())
}

/// Checks that every rank holds a model with the same tensors (shapes, dtypes, kinds).
///
/// # Collective
/// Every rank calls it at the same point.
pub(crate) fn verify_same_model<B: Backend, M: Module<B>>(
    pg: &ProcessGroup,
    module: &M,
) -> Result<()> {
    let (hash, count) = fingerprint::<B, M>(module);
    let mine = [hash as i64, count as i64];
    let mut all = vec![0i64; 2 * pg.world_size()];
    pg.all_gather(&mine, &mut all)
        .map_err(DdpTrainError::comm("comparing the ranks' models"))?;
    let differing: Vec<usize> = (0..pg.world_size())
        .filter(|&r| all[2 * r..2 * r + 2] != all[0..2])
        .collect();
    if differing.is_empty() {
        Ok(())
    } else {
        Err(DdpTrainError::ModelMismatch(format!(
            "rank 0 has {} float tensors (signature {:#x}); ranks {differing:?} differ \
             (this rank: {count} tensors, {hash:#x}); build the same architecture on every rank",
            all[1], all[0] as u64
        )))
    }
}

/// Makes the chosen float tensors of `module` equal to rank 0's, byte for byte, in their own
/// dtype. Returns the module unchanged when nothing is selected (no collective then: every rank
/// knows that from the same architecture).
///
/// # Collective
/// Every rank calls it at the same point.
pub(crate) fn broadcast_from_rank0<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: M,
    which: Which,
) -> Result<M> {
    struct Pack {
        which: Which,
        bytes: Vec<u8>,
        count: usize,
    }
    impl<B: Backend> ModuleVisitor<B> for Pack {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            if self.which.wants(t.is_require_grad()) {
                self.bytes.extend_from_slice(t.into_data().as_bytes());
                self.count += 1;
            }
        }
    }
    let mut pack = Pack {
        which,
        bytes: Vec::new(),
        count: 0,
    };
    module.visit(&mut pack);
    if pack.count == 0 || pg.world_size() == 1 {
        return Ok(module);
    }
    let mut bytes = pack.bytes;
    pg.broadcast(&mut bytes, 0)
        .map_err(DdpTrainError::comm("broadcasting rank 0's parameters"))?;
    struct Unpack {
        which: Which,
        bytes: Vec<u8>,
        offset: usize,
    }
    impl<B: Backend> ModuleMapper<B> for Unpack {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, t, mapper) = param.consume();
            let trainable = t.is_require_grad();
            if !self.which.wants(trainable) {
                return Param::from_mapped_value(id, t, mapper);
            }
            let (shape, dtype, device) = (t.shape(), t.dtype(), t.device());
            let len = shape.num_elements() * dtype.size();
            let end = self.offset + len;
            let data =
                TensorData::from_bytes_vec(self.bytes[self.offset..end].to_vec(), shape, dtype);
            self.offset = end;
            let value = Tensor::<B, D>::from_data(data, &device).set_require_grad(trainable);
            Param::from_mapped_value(id, value, mapper)
        }
    }
    let mut unpack = Unpack {
        which,
        bytes,
        offset: 0,
    };
    Ok(module.map(&mut unpack))
}

/// Where one gradient lives in the flat buffers.
struct Slot {
    id: ParamId,
    wide: bool,
    offset: usize,
    len: usize,
}

/// Averages `grads` (this rank's, keyed by its module's `ParamId`s) over every rank of `pg`,
/// as DDP does: each gradient is summed over the ranks and divided by the world size, so the
/// result equals the gradient of the mean loss over the global batch. A parameter that some
/// ranks did not use contributes zeros from them; one that no rank used gets no gradient (so
/// the optimizer leaves it alone, as in PyTorch).
///
/// f64 gradients travel as f64, every other float dtype as f32 (converted back afterwards).
///
/// # Collective
/// Every rank calls it once per optimizer step.
pub(crate) fn all_reduce_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: &M,
    grads: GradientsParams,
) -> Result<GradientsParams> {
    let world = pg.world_size();
    if world == 1 {
        return Ok(grads);
    }
    struct Pack<'a> {
        grads: &'a GradientsParams,
        seen: HashSet<ParamId>,
        narrow: Vec<f32>,
        wide: Vec<f64>,
        present: Vec<f32>,
        slots: Vec<Slot>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Pack<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            // A tied parameter appears twice in the module but has one gradient.
            if !t.is_require_grad() || !self.seen.insert(param.id) {
                return;
            }
            let len = t.shape().num_elements();
            let wide = t.dtype() == DType::F64;
            let grad = self.grads.get::<B::InnerBackend, D>(param.id);
            self.present.push(if grad.is_some() { 1.0 } else { 0.0 });
            let offset = if wide {
                self.wide.len()
            } else {
                self.narrow.len()
            };
            match (grad, wide) {
                (Some(g), true) => self
                    .wide
                    .extend(g.into_data().convert::<f64>().iter::<f64>()),
                (Some(g), false) => self
                    .narrow
                    .extend(g.into_data().convert::<f32>().iter::<f32>()),
                (None, true) => self.wide.resize(offset + len, 0.0),
                (None, false) => self.narrow.resize(offset + len, 0.0),
            }
            self.slots.push(Slot {
                id: param.id,
                wide,
                offset,
                len,
            });
        }
    }
    let mut pack = Pack {
        grads: &grads,
        seen: HashSet::new(),
        narrow: Vec::new(),
        wide: Vec::new(),
        present: Vec::new(),
        slots: Vec::new(),
    };
    module.visit(&mut pack);
    let Pack {
        mut narrow,
        mut wide,
        present,
        slots,
        ..
    } = pack;
    // Presence counts ride at the end of the f32 buffer: one collective for the common case.
    let n_narrow = narrow.len();
    narrow.extend_from_slice(&present);
    pg.all_reduce(&mut narrow, ReduceOp::Sum)
        .map_err(DdpTrainError::comm("all-reducing the gradients (f32)"))?;
    if !wide.is_empty() {
        pg.all_reduce(&mut wide, ReduceOp::Sum)
            .map_err(DdpTrainError::comm("all-reducing the gradients (f64)"))?;
    }
    let used: Vec<bool> = narrow[n_narrow..].iter().map(|&c| c > 0.0).collect();
    narrow.truncate(n_narrow);

    struct Unpack {
        slots: Vec<Slot>,
        used: Vec<bool>,
        next: usize,
        narrow: Vec<f32>,
        wide: Vec<f64>,
        world: usize,
        out: GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Unpack {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(slot) = self.slots.get(self.next) else {
                return;
            };
            if slot.id != param.id {
                return; // not trainable, or the second use of a tied parameter
            }
            let used = self.used[self.next];
            self.next += 1;
            if !used {
                return;
            }
            let t = param.val();
            let (shape, dtype) = (t.shape(), t.dtype());
            let range = slot.offset..slot.offset + slot.len;
            let data = if slot.wide {
                let scale = 1.0 / self.world as f64;
                let v: Vec<f64> = self.wide[range].iter().map(|x| x * scale).collect();
                TensorData::new(v, shape)
            } else {
                let scale = 1.0 / self.world as f32;
                let v: Vec<f32> = self.narrow[range].iter().map(|x| x * scale).collect();
                TensorData::new(v, shape).convert_dtype(dtype)
            };
            let device = t.inner().device();
            let grad = Tensor::<B::InnerBackend, D>::from_data(data, &device);
            self.out.register::<B::InnerBackend, D>(param.id, grad);
        }
    }
    let mut unpack = Unpack {
        slots,
        used,
        next: 0,
        narrow,
        wide,
        world,
        out: GradientsParams::new(),
    };
    module.visit(&mut unpack);
    Ok(unpack.out)
}
