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

use crate::engine::reducible::reducible_dtype;
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
        let mut entries = see::<B, M>(module);
        flush_running_states::<B, M>(module);
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
        match self
            .entries
            .iter()
            .find(|e| e.kind == ParamKind::Trainable && !reducible_dtype(e.dtype))
        {
            Some(e) => Err(crate::DdpError::Unsupported(format!(
                "parameter '{}' has dtype {:?}; DDP reduces f32, f64, f16 and bf16 parameters",
                e.path, e.dtype
            ))),
            None => Ok(()),
        }
    }
}

impl<I: Backend> ParamTable<I> {
    /// The paths of this table's trainable parameters that hold a gradient in `grads`, burn's
    /// gradients of a backward through the taps. A tap takes its parameter's gradient and
    /// passes nothing on, so a trainable parameter has one there only when the loss used the
    /// wrapped `module` itself (`ddp.module()`, a clone of it) instead of the tapped copy.
    pub(crate) fn used_outside_taps<B, M>(&self, module: &M, grads: &B::Gradients) -> Vec<String>
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: AutodiffModule<B>,
    {
        let mut visit = UsedOutside::<B> {
            table: &self.entries,
            grads,
            next: 0,
            found: Vec::new(),
        };
        module.visit(&mut visit);
        visit.found
    }
}

struct UsedOutside<'a, B: AutodiffBackend> {
    table: &'a [ParamEntry<B::InnerBackend>],
    grads: &'a B::Gradients,
    next: usize,
    found: Vec<String>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for UsedOutside<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        let Some(entry) = self.table.get(index) else {
            return;
        };
        if entry.kind == ParamKind::Trainable && param.val().grad(self.grads).is_some() {
            self.found.push(entry.path.clone());
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

/// Every float tensor of `module` in module order, seen cheaply (no lazy initialisation
/// beyond reading values, no flush): a tensor's kind says only whether it is trained (a buffer
/// is [`ParamKind::Frozen`] here; [`ParamTable::describe`] tells them apart).
fn see<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> Vec<ParamEntry<B::InnerBackend>> {
    let mut describe = Describe::<B> {
        path: Vec::new(),
        entries: Vec::new(),
    };
    module.visit(&mut describe);
    describe.entries
}

/// The path of the first trained tensor whose parameter already appeared earlier in `module`
/// (a tied parameter, such as an embedding shared with the output layer), if there is one.
pub(crate) fn first_tied_trainable<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
) -> Option<String> {
    let mut ids = std::collections::HashSet::new();
    see::<B, M>(module)
        .into_iter()
        .find(|s| !ids.insert(s.id) && s.kind == ParamKind::Trainable)
        .map(|s| s.path)
}

impl<I: Backend> ParamTable<I> {
    /// Checks that `module` (a caller's copy of the wrapped model) has this table's layout, and
    /// returns this table keyed by `module`'s `ParamId`s, or `None` when they are this table's.
    ///
    /// The rule, so the caller's gradients land in the wrapped model's buckets: the same float
    /// tensors in the same order (paths, shapes, dtypes, trainable or not) and the same tied
    /// parameters (entries sharing an id here share one there). Ids themselves may differ (a
    /// module loaded from its own record), which is why gradients are keyed by the caller's.
    pub(crate) fn for_caller<B, M>(
        &self,
        module: &M,
        what: &str,
    ) -> Result<Option<ParamTable<I>>, crate::DdpError>
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: AutodiffModule<B>,
    {
        let seen = see::<B, M>(module);
        let rule = "it must have the wrapped module's parameter layout: the same float tensors in \
                    the same order (paths, shapes, dtypes, trainable or not) and the same tied \
                    parameters";
        let trained = |e: &ParamEntry<I>| e.kind == ParamKind::Trainable;
        let shown = |e: &ParamEntry<I>| {
            let kind = if trained(e) { "param" } else { "buffer/frozen" };
            format!("{}\t{:?}\t{:?}\t{kind}", e.path, e.shape, e.dtype)
        };
        let n = self.entries.len().max(seen.len());
        if let Some(i) = (0..n).find(|&i| match (self.entries.get(i), seen.get(i)) {
            (Some(e), Some(s)) => {
                e.path != s.path
                    || e.shape != s.shape
                    || e.dtype != s.dtype
                    || trained(e) != trained(s)
            }
            _ => true,
        }) {
            return Err(crate::DdpError::ModelMismatch(format!(
                "the module passed to {what} differs from the wrapped one ({rule}): tensor #{i} \
                 is {:?}, the wrapped module's is {:?}",
                seen.get(i).map(shown).unwrap_or_else(|| "missing".into()),
                self.entries
                    .get(i)
                    .map(shown)
                    .unwrap_or_else(|| "missing".into()),
            )));
        }
        if self.entries.iter().zip(&seen).all(|(e, s)| e.id == s.id) {
            return Ok(None);
        }
        // Tied parameters: entry i shares its id with an earlier entry j in both or in neither.
        let first = |ids: Vec<ParamId>| -> Vec<usize> {
            let mut at = std::collections::HashMap::new();
            ids.iter()
                .enumerate()
                .map(|(i, id)| *at.entry(*id).or_insert(i))
                .collect()
        };
        let here = first(self.entries.iter().map(|e| e.id).collect());
        let there = first(seen.iter().map(|s| s.id).collect());
        if let Some(i) = (0..here.len()).find(|&i| here[i] != there[i]) {
            return Err(crate::DdpError::ModelMismatch(format!(
                "the module passed to {what} ties its parameters differently ({rule}): tensor \
                 #{i} ('{}') shares its id with tensor #{} there and with tensor #{} in the \
                 wrapped module",
                seen[i].path, there[i], here[i]
            )));
        }
        let entries = self
            .entries
            .iter()
            .zip(seen)
            .map(|(e, s)| ParamEntry {
                id: s.id,
                path: e.path.clone(),
                shape: e.shape.clone(),
                dtype: e.dtype,
                kind: e.kind,
                device: e.device.clone(),
                register: e.register,
            })
            .collect();
        Ok(Some(ParamTable { entries }))
    }
}
