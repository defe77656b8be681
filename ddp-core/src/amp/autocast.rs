//! [`autocast`]: a copy of a module whose float parameters are cast to a half-precision dtype
//! for one forward, the f32 parameters staying the masters.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive};

/// `module` with its float parameters cast to `dtype` (bf16 or f16), for the forward of one
/// step: PyTorch's `torch.autocast`, applied to weights instead of per operation.
///
/// The cast is an autodiff operation, so backward flows through it: each f32 parameter (the
/// master weight the optimizer steps) receives its gradient cast back to f32, while the
/// forward's matmuls, activations and their backward run in `dtype`. Cast the inputs too
/// (`x.cast(FloatDType::BF16)`) and the output back (`.cast(FloatDType::F32)`) before the
/// loss, as autocast keeps losses in f32.
///
/// Inside DDP, call it in the forward closure on the module DDP hands you:
/// `ddp.forward(|m| autocast(m.clone(), FloatDType::BF16).forward(x))`. DDP's gradient taps sit
/// on the f32 parameters, below the cast, so buckets carry f32 gradients. Apply it to a
/// submodule (`autocast(m.encoder.clone(), ..)`) to keep the other layers in f32.
///
/// # Buffers
/// Buffers (burn's `RunningState`: batch-norm statistics) keep their dtype and values: their
/// clones share one value, so casting one would cast the model's own statistics. burn's batch
/// norm then sees f32 statistics and a `dtype` input, which it does not accept: keep such
/// layers out of `autocast` and cast their input to f32 (PyTorch's autocast runs batch norm in
/// f32 too).
pub fn autocast<B: Backend, M: Module<B>>(module: M, dtype: FloatDType) -> M {
    // Buffers are found as DDP's parameter table finds them: mapping a module writes its
    // buffers back into the values every clone shares. Keep handles on the values first.
    let original = module.clone();
    let before = Snapshot::take(&original);
    let cast = module.map(&mut Cast { dtype });
    let after = Snapshot::take(&original);
    let buffers: Vec<bool> = before
        .dtypes
        .iter()
        .zip(&after.dtypes)
        .map(|(b, a)| b != a)
        .collect();
    if buffers.contains(&true) {
        // Put the buffers' own values back (shared with `cast` too); discard the rest.
        let _restored = original.map(&mut Restore {
            saved: before.values,
            buffers,
            next: 0,
        });
    }
    cast
}

struct Cast {
    dtype: FloatDType,
}

impl<B: Backend> ModuleMapper<B> for Cast {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.dtype;
        param.map(|tensor| tensor.cast(dtype))
    }
}

/// Every float tensor of a module, in visit order: its dtype and a handle on its value.
struct Snapshot<B: Backend> {
    dtypes: Vec<DType>,
    values: Vec<FloatTensor<B>>,
}

impl<B: Backend> Snapshot<B> {
    fn take<M: Module<B>>(module: &M) -> Self {
        let mut snapshot = Snapshot {
            dtypes: Vec::new(),
            values: Vec::new(),
        };
        module.visit(&mut snapshot);
        snapshot
    }
}

impl<B: Backend> ModuleVisitor<B> for Snapshot<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        self.dtypes.push(value.dtype());
        self.values.push(value.into_primitive().tensor());
    }
}

/// Writes the saved values back into the buffers (a buffer's `map` stores what it returns).
struct Restore<B: Backend> {
    saved: Vec<FloatTensor<B>>,
    buffers: Vec<bool>,
    next: usize,
}

impl<B: Backend> ModuleMapper<B> for Restore<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        match (self.buffers.get(index), self.saved.get(index)) {
            (Some(true), Some(saved)) => {
                let saved = Tensor::from_primitive(TensorPrimitive::Float(saved.clone()));
                param.map(|_| saved)
            }
            _ => param,
        }
    }
}
