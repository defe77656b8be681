//! The model's float tensors as DDP sees them: one [`ParamEntry`] per tensor, in module order.
//!
//! Each entry is one of three kinds, because DDP treats them differently:
//! - **trainable**: a `Param` that requires gradients: tapped, bucketed, all-reduced;
//! - **buffer**: a `RunningState` (batch norm's running mean and variance): forward updates it,
//!   so rank 0's value is broadcast every step (PyTorch's `broadcast_buffers`);
//! - **frozen**: a `Param` with `require_grad = false`: made equal at construction, never sent
//!   again.
//!
//! burn's visitors show buffers and frozen parameters the same way (a `Param` without
//! gradient), so [`ParamTable::describe`] tells them apart by what makes a `RunningState` one:
//! its clones share their value. It maps a clone of the module with placeholder values and looks
//! at which tensors changed in the original, then puts the original values back.

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use std::any::Any;

/// How DDP treats one float tensor of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParamKind {
    Trainable,
    Buffer,
    Frozen,
}

/// Registers a gradient (a float primitive of the inner backend) under `id`; one instance per
/// tensor rank, so the reducer needs no knowledge of `D`.
pub(crate) type RegisterGrad<I> = fn(&mut GradientsParams, ParamId, FloatTensor<I>);

fn register_grad<I: Backend, const D: usize>(
    grads: &mut GradientsParams,
    id: ParamId,
    grad: FloatTensor<I>,
) {
    grads.register::<I, D>(id, Tensor::from_primitive(TensorPrimitive::Float(grad)));
}

/// One float tensor of the model.
pub(crate) struct ParamEntry<I: Backend> {
    pub(crate) id: ParamId,
    /// Module path, e.g. `layers.1.weight`.
    pub(crate) path: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) kind: ParamKind,
    pub(crate) device: I::Device,
    pub(crate) register: RegisterGrad<I>,
}

impl<I: Backend> ParamEntry<I> {
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The line every rank compares at construction.
    pub(crate) fn signature(&self) -> String {
        let kind = match self.kind {
            ParamKind::Trainable => "param",
            ParamKind::Buffer => "buffer",
            ParamKind::Frozen => "frozen",
        };
        format!("{}\t{:?}\t{:?}\t{kind}", self.path, self.shape, self.dtype)
    }
}

/// Every float tensor of a module, in visit order (the index DDP uses everywhere).
pub(crate) struct ParamTable<I: Backend> {
    pub(crate) entries: Vec<ParamEntry<I>>,
}

impl<I: Backend> ParamTable<I> {
    /// Describes `module`, forcing lazy initialisation (a clone of an uninitialised burn module
    /// would draw new values) and flushing running states.
    pub(crate) fn describe<B, M>(module: &M) -> Self
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: AutodiffModule<B>,
    {
        // Visit first: it initialises lazy parameters in module order, drawing from burn's RNG
        // exactly as plain training would. Cloning an uninitialised module (as the flush below
        // does) would make the clone draw values of its own and shift every later draw.
        let mut describe = Describe::<B> {
            path: Vec::new(),
            entries: Vec::new(),
        };
        module.visit(&mut describe);
        flush_running_states::<B, M>(module);
        let mut entries = describe.entries;
        for index in shared_state_indices::<B, M>(module, &entries) {
            entries[index].kind = ParamKind::Buffer;
        }
        ParamTable { entries }
    }

    pub(crate) fn kinds(&self) -> Vec<ParamKind> {
        self.entries.iter().map(|e| e.kind).collect()
    }

    pub(crate) fn count(&self, kind: ParamKind) -> usize {
        self.entries.iter().filter(|e| e.kind == kind).count()
    }

    /// Checks that DDP can reduce every trainable dtype.
    pub(crate) fn check_dtypes(&self) -> Result<(), crate::DdpError> {
        match self.entries.iter().find(|e| {
            e.kind == ParamKind::Trainable && !crate::reducer::HostGrad::supports(e.dtype)
        }) {
            Some(e) => Err(crate::DdpError::Unsupported(format!(
                "parameter '{}' has dtype {:?}; DDP reduces f32, f64, f16 and bf16 parameters",
                e.path, e.dtype
            ))),
            None => Ok(()),
        }
    }
}

/// Applies pending `RunningState` updates (burn keeps each forward's update in a per-thread map
/// until the value is read with `value_sync` or recorded): `into_record` syncs, and a clone
/// shares the state, so recording a clone flushes the module itself.
pub(crate) fn flush_running_states<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) {
    drop(module.clone().into_record());
}

struct Describe<B: AutodiffBackend> {
    path: Vec<String>,
    entries: Vec<ParamEntry<B::InnerBackend>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Describe<B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val(); // initialises a lazy parameter
        let kind = if value.is_require_grad() {
            ParamKind::Trainable
        } else {
            ParamKind::Frozen // or a buffer: `shared_state_indices` decides
        };
        self.entries.push(ParamEntry {
            id: param.id,
            path: self.path.join("."),
            shape: value.dims().to_vec(),
            dtype: value.dtype(),
            kind,
            device: value.device(),
            register: register_grad::<B::InnerBackend, D>,
        });
    }
}

/// Indices of the non-trainable tensors whose value is shared between clones of the module
/// (`RunningState`s), found by mapping a clone with placeholders of another shape.
fn shared_state_indices<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    entries: &[ParamEntry<B::InnerBackend>],
) -> Vec<usize> {
    let candidates: Vec<bool> = entries
        .iter()
        .map(|e| e.kind != ParamKind::Trainable)
        .collect();
    if !candidates.iter().any(|&c| c) {
        return Vec::new();
    }
    let mut place = Placeholders {
        next: 0,
        candidates: &candidates,
        originals: Vec::new(),
    };
    let probe = module.clone().map(&mut place);
    let mut look = ShapeProbe {
        next: 0,
        shapes: Vec::new(),
    };
    module.visit(&mut look);
    let shared: Vec<usize> = (0..entries.len())
        .filter(|&i| candidates[i] && look.shapes.get(i) != Some(&entries[i].shape))
        .collect();
    // Put the original values back (through the probe, which shares them).
    let originals = std::mem::take(&mut place.originals);
    drop(probe.map(&mut Restore {
        next: 0,
        originals: originals.into_iter().map(Some).collect(),
    }));
    shared
}

/// A shape that differs from `shape` (same rank).
fn placeholder_shape(shape: &[usize]) -> Vec<usize> {
    let mut out = vec![1; shape.len()];
    if out == shape {
        out[0] = 2;
    }
    out
}

struct Placeholders<'a> {
    next: usize,
    candidates: &'a [bool],
    originals: Vec<Option<Box<dyn Any>>>,
}

impl<B: Backend> ModuleMapper<B> for Placeholders<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        if !self.candidates.get(index).copied().unwrap_or(false) {
            self.originals.push(None);
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let shape: [usize; D] = placeholder_shape(&tensor.dims())
            .try_into()
            .unwrap_or([1; D]);
        let placeholder = Tensor::<B, D>::zeros(shape, &tensor.device());
        self.originals.push(Some(Box::new(tensor)));
        Param::from_mapped_value(id, placeholder, mapper)
    }
}

struct Restore {
    next: usize,
    originals: Vec<Option<Option<Box<dyn Any>>>>,
}

impl<B: Backend> ModuleMapper<B> for Restore {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        let original = self
            .originals
            .get_mut(index)
            .and_then(Option::take)
            .flatten()
            .and_then(|b| b.downcast::<Tensor<B, D>>().ok());
        match original {
            Some(tensor) => {
                let (id, _, mapper) = param.consume();
                Param::from_mapped_value(id, *tensor, mapper)
            }
            None => param,
        }
    }
}

struct ShapeProbe {
    next: usize,
    shapes: Vec<Vec<usize>>,
}

impl<B: Backend> ModuleVisitor<B> for ShapeProbe {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.next += 1;
        self.shapes.push(param.val().dims().to_vec());
    }
}
