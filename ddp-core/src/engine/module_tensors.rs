//! The module as the partitioned optimizers (ZeRO, sharded checkpoints) see it: every float tensor in module order (its id, its size, whether
//! the optimizer steps it), and gradients narrowed to one rank's shard.

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

/// One float tensor of the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TensorInfo {
    pub(crate) id: ParamId,
    pub(crate) bytes: usize,
    /// Requires a gradient, so an optimizer steps it (buffers and frozen parameters do not).
    pub(crate) trainable: bool,
}

/// Every float tensor of `module`, in module order, and the device of the first one.
pub(crate) fn describe<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
) -> (Vec<TensorInfo>, Option<B::Device>) {
    let mut visit = Describe::<B> {
        tensors: Vec::new(),
        device: None,
    };
    module.visit(&mut visit);
    (visit.tensors, visit.device)
}

struct Describe<B: AutodiffBackend> {
    tensors: Vec<TensorInfo>,
    device: Option<B::Device>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Describe<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if self.device.is_none() {
            self.device = Some(value.device());
        }
        self.tensors.push(TensorInfo {
            id: param.id,
            bytes: value.shape().num_elements() * value.dtype().size(),
            trainable: value.is_require_grad(),
        });
    }
}

/// The gradients of the tensors selected by `keep` (module order); the others are dropped.
pub(crate) fn keep_shard<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    keep: &[bool],
) -> GradientsParams {
    let mut visit = KeepShard::<B> {
        next: 0,
        keep,
        from: &mut grads,
        into: GradientsParams::new(),
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut visit);
    visit.into
}

struct KeepShard<'a, B> {
    next: usize,
    keep: &'a [bool],
    from: &'a mut GradientsParams,
    into: GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for KeepShard<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        if !self.keep.get(index).copied().unwrap_or(false) {
            return;
        }
        if let Some(grad) = self.from.remove::<B::InnerBackend, D>(param.id) {
            self.into.register::<B::InnerBackend, D>(param.id, grad);
        }
    }
}
