//! Gradient taps: an identity autodiff op whose backward hands a parameter's gradient to DDP.
//!
//! DDP maps a clone of the model before each forward so that every trainable parameter passes
//! through [`TapOps::tap`](sealed::TapOps::tap). When backward reaches the tap, the gradient (on
//! the inner, non-autodiff backend) goes to a [`GradientSink`] and is *not* passed on to the
//! parameter: DDP builds the synchronised `GradientsParams` itself, so the local copy would only
//! cost memory.
//!
//! # Ordering and layer boundaries
//! burn runs backward by node depth, deepest first. A tap sits just above its parameter, so
//! plain taps fire at the end of backward. A *boundary*
//! ([`TapOps::boundary`](sealed::TapOps::boundary), reached through
//! [`layer_boundary`](crate::layer_boundary)) is an identity op on an activation; its
//! backward runs right after everything computed from that activation, and hands over every
//! tapped gradient that is already complete (no consumer of the tap is still waiting to run,
//! which the tap node's reference count tells). Those gradients then reach their buckets in the
//! middle of backward instead of at its end.
//!
//! # Threads
//! The sink runs on the thread that called `backward()`, while autodiff holds its graph: it must
//! only hand the gradient off (copy it into a bucket), never run autodiff operations.
//!
//! # Generations
//! Every tap carries the generation of the forward that made it (the number of backwards before
//! it), so a loss built from an old forward's output is recognised instead of feeding this
//! step's buckets.
//!
//! Users only name [`TapBackend`] (in bounds such as `B: TapBackend`); the operations are behind
//! a sealed supertrait.
//!
//! Automatic overlap (anchored taps, learning their depths with probes) is in `anchor`; one
//! step's passes (tap a copy, forward, backward, learn the plan) in `passes`.

mod anchor;
mod in_backward;
mod passes;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::params::ParamKind;
pub(crate) use anchor::DepthPlan;
use anchor::{Anchoring, ProbeTarget, anchor_at, probe_chain};
use burn::module::{ModuleMapper, Param};
use burn::tensor::{Tensor, TensorPrimitive};
pub(crate) use in_backward::InWrapperBackward;
pub(crate) use passes::{BackwardPass, TappedCopy, TappedPasses};

/// Receives gradients from taps, identified by the parameter's index in DDP's parameter list.
pub(crate) trait GradientSink<B: Backend>: Send + Sync {
    /// Called once per tap when its gradient is complete.
    fn on_gradient(&self, param_index: usize, generation: u64, grad: FloatTensor<B>);
}

/// A tap whose gradient has not been handed over yet.
struct PendingTap<I: Backend> {
    index: usize,
    tensor: FloatTensor<Autodiff<I>>,
    handed: Arc<AtomicBool>,
}

/// The taps of one forward: where gradients go, and which are still pending (so a boundary can
/// hand them over early).
pub struct TapScope<I: Backend> {
    sink: Arc<dyn GradientSink<I>>,
    generation: u64,
    pending: Mutex<Vec<PendingTap<I>>>,
    early: AtomicUsize,
    /// Where this forward's lazy taps are anchored (automatic overlap).
    anchoring: Anchoring,
    /// References to each tap's node held outside the graph for the whole backward: 1 when the
    /// tapped copy outlives backward (`step_on`, whose closure holds it), else 0.
    outside_refs: usize,
}

impl<I: Backend> fmt::Debug for TapScope<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.pending.lock().map(|p| p.len()).unwrap_or(0);
        f.debug_struct("TapScope").field("pending", &n).finish()
    }
}

impl<I: Backend> ProbeTarget for TapScope<I> {
    /// Notes the taps whose consumers have all run by now.
    fn note_done(&self, level: usize) {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let complete = pending
            .iter()
            .filter(|p| Arc::strong_count(&p.tensor.node) <= 2 + self.outside_refs)
            .map(|p| p.index);
        self.anchoring.note_done(level, complete);
    }
}

impl<I: Backend> TapScope<I> {
    /// A scope whose taps send gradients of forward `generation` to `sink`.
    pub(crate) fn new(sink: Arc<dyn GradientSink<I>>, generation: u64) -> Self {
        TapScope {
            sink,
            generation,
            pending: Mutex::new(Vec::new()),
            early: AtomicUsize::new(0),
            anchoring: Anchoring::new(),
            outside_refs: 0,
        }
    }

    /// Lazy taps of this scope, the `forward`-th of its step, follow `plan` as long as the
    /// forward uses parameters in the order the plan was learned from.
    pub(crate) fn with_plan(mut self, plan: Option<Arc<DepthPlan>>, forward: usize) -> Self {
        self.anchoring.set_plan(plan, forward);
        self
    }

    /// How many taps were created at a planned depth.
    pub(crate) fn anchored_taps(&self) -> usize {
        self.anchoring.anchored_taps()
    }

    /// This forward's anchoring, for [`DepthPlan::learn`] and [`DepthPlan::held`].
    pub(crate) fn anchoring(&self) -> &Anchoring {
        &self.anchoring
    }

    /// For a tapped copy that stays alive during backward (its parameters hold each tap's
    /// output, one reference per tap: lazily or not, clones of the copy only add more, which
    /// merely delays a hand-over), so a boundary does not mistake that reference for a consumer
    /// still to run.
    pub(crate) fn copy_outlives_backward(mut self) -> Self {
        self.outside_refs = 1;
        self
    }

    /// How many gradients boundaries handed over before the end of backward.
    pub(crate) fn early_gradients(&self) -> usize {
        self.early.load(Ordering::Relaxed)
    }

    /// Forgets the pending taps (after backward), releasing their tensors.
    pub(crate) fn clear(&self) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Hands over every pending gradient whose tap has no consumer left to run.
    fn hand_over_complete(&self, grads: &mut Gradients) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|p| {
            // References to the tap's node: ours (in `pending`), the tap's own backward step, the
            // live copy's (see `outside_refs`), and one per consumer step that has not run yet.
            if Arc::strong_count(&p.tensor.node) > 2 + self.outside_refs {
                return true;
            }
            if !p.handed.swap(true, Ordering::AcqRel)
                && let Some(grad) = grads.remove::<I>(&p.tensor)
            {
                self.early.fetch_add(1, Ordering::Relaxed);
                self.sink.on_gradient(p.index, self.generation, grad);
            }
            false
        });
    }
}

/// `loss` plus zero times a probe chain down from `loss_depth` (see
/// [`TapOps::probe_chain`](sealed::TapOps::probe_chain)): the same loss and gradients, with
/// probes that note, level by level, which of `scopes`' taps are complete, so that
/// [`DepthPlan::learn`] can learn where to anchor them.
pub(crate) fn with_probes<B: TapBackend, const D: usize>(
    loss: Tensor<B, D>,
    scopes: &[Arc<TapScope<B::InnerBackend>>],
    loss_depth: usize,
) -> Tensor<B, D> {
    let probes = B::probe_chain(&loss.clone().into_primitive().tensor(), scopes, loss_depth);
    let probes: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(probes));
    loss + probes.mul_scalar(0.0).reshape([1usize; D])
}

/// Backends on which DDP can tap gradients: every `Autodiff<B, C>`. Name it in bounds
/// (`fn train<B: TapBackend>(..)`); its operations are DDP's own.
pub trait TapBackend: AutodiffBackend + sealed::TapOps {}

impl<B: Backend, C: CheckpointStrategy> TapBackend for Autodiff<B, C> {}

pub(crate) mod sealed {
    use super::*;

    /// The tap operations, sealed so that only DDP calls them.
    pub trait TapOps: AutodiffBackend {
        /// Returns `tensor` unchanged; in backward, its gradient goes to the scope's sink under
        /// `param_index`.
        fn tap(
            tensor: FloatTensor<Self>,
            param_index: usize,
            scope: &Arc<TapScope<Self::InnerBackend>>,
        ) -> FloatTensor<Self>;

        /// As [`tap`](Self::tap), but the tap node sits at autodiff depth `depth + 1` (it has
        /// an untracked anchor of depth `depth` as a second parent), so backward, which runs
        /// deepest first, reaches it right after the consumers of the parameter when `depth` is
        /// about the depth of the layer's input.
        fn tap_at(
            tensor: FloatTensor<Self>,
            param_index: usize,
            scope: &Arc<TapScope<Self::InnerBackend>>,
            depth: usize,
        ) -> FloatTensor<Self>;

        /// The autodiff depth of `tensor` (its node's order).
        fn depth(tensor: &FloatTensor<Self>) -> usize;

        /// A tracked chain of one-element identity nodes of depth 0 to `depth` (on `like`'s
        /// device), returning its last node: backward runs one of them in every level below
        /// `depth`, each noting in `scopes` which taps have no consumer left to run
        /// ([`DepthPlan::learn`] reads that). Add it, times zero, to the loss.
        fn probe_chain(
            like: &FloatTensor<Self>,
            scopes: &[Arc<TapScope<Self::InnerBackend>>],
            depth: usize,
        ) -> FloatTensor<Self>;

        /// Returns `tensor` unchanged; in backward, once everything computed from it has run, hands
        /// over the scope's complete gradients.
        fn boundary(
            tensor: FloatTensor<Self>,
            scope: &Arc<TapScope<Self::InnerBackend>>,
        ) -> FloatTensor<Self>;
    }
}

struct TapState<B: Backend> {
    param_index: usize,
    generation: u64,
    sink: Arc<dyn GradientSink<B>>,
    handed: Arc<AtomicBool>,
}

impl<B: Backend> TapState<B> {
    /// Sends the tap's gradient to the sink (unless a boundary already did: the caller checks
    /// `handed`).
    fn hand_off(&self, grad: FloatTensor<B>) {
        self.sink
            .on_gradient(self.param_index, self.generation, grad);
    }
}

/// Finishes a prepared tap op (plain or anchored): its state, and its entry in the scope's
/// pending taps so that a boundary can hand it over early.
fn finish_tap<B, C, BO, const N: usize>(
    kind: OpsKind<BO, B, TapState<B>, C, N>,
    primitive: B::FloatTensorPrimitive,
    param_index: usize,
    scope: &TapScope<B>,
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    BO: Backward<B, N, State = TapState<B>>,
{
    match kind {
        OpsKind::Tracked(prep) => {
            let handed = Arc::new(AtomicBool::new(false));
            let state = TapState {
                param_index,
                generation: scope.generation,
                sink: scope.sink.clone(),
                handed: handed.clone(),
            };
            let out = prep.finish(state, primitive);
            scope
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(PendingTap {
                    index: param_index,
                    tensor: out.clone(),
                    handed,
                });
            out
        }
        OpsKind::UnTracked(prep) => prep.finish(primitive),
    }
}

impl<B: Backend> Clone for TapState<B> {
    fn clone(&self) -> Self {
        TapState {
            param_index: self.param_index,
            generation: self.generation,
            sink: self.sink.clone(),
            handed: self.handed.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for TapState<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TapState")
            .field("param_index", &self.param_index)
            .finish()
    }
}

/// The tap op: `Tap::<1>` sits on the parameter alone; `Tap::<2>` has a second, untracked
/// parent (an anchor) that only sets its depth.
#[derive(Debug)]
struct Tap<const N: usize>;

impl<B: Backend, const N: usize> Backward<B, N> for Tap<N> {
    type State = TapState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        // Unless a boundary already handed the gradient over.
        if !ops.state.handed.swap(true, Ordering::AcqRel) {
            let grad = grads.consume::<B>(&ops.node);
            ops.state.hand_off(grad);
        }
    }
}

struct BoundaryState<B: Backend>(Arc<TapScope<B>>);

impl<B: Backend> Clone for BoundaryState<B> {
    fn clone(&self) -> Self {
        BoundaryState(self.0.clone())
    }
}

impl<B: Backend> fmt::Debug for BoundaryState<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoundaryState")
    }
}

#[derive(Debug)]
struct Boundary;

impl<B: Backend> Backward<B, 1> for Boundary {
    type State = BoundaryState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let scope = ops.state.0.clone();
        unary::<B, _>(ops.parents, ops.node, grads, |grad| grad);
        scope.hand_over_complete(grads);
    }
}

impl<B: Backend, C: CheckpointStrategy> sealed::TapOps for Autodiff<B, C> {
    fn tap(
        tensor: FloatTensor<Self>,
        param_index: usize,
        scope: &Arc<TapScope<B>>,
    ) -> FloatTensor<Self> {
        let kind = Tap::<1>
            .prepare::<C>([tensor.node.clone()])
            .compute_bound()
            .stateful();
        finish_tap(kind, tensor.primitive, param_index, scope)
    }

    fn tap_at(
        tensor: FloatTensor<Self>,
        param_index: usize,
        scope: &Arc<TapScope<B>>,
        depth: usize,
    ) -> FloatTensor<Self> {
        let anchor = anchor_at::<B, C>(&scope.anchoring, &tensor, depth);
        let kind = Tap::<2>
            .prepare::<C>([tensor.node.clone(), anchor.node.clone()])
            .compute_bound()
            .stateful();
        finish_tap(kind, tensor.primitive, param_index, scope)
    }

    fn depth(tensor: &FloatTensor<Self>) -> usize {
        tensor.node.order
    }

    fn probe_chain(
        like: &FloatTensor<Self>,
        scopes: &[Arc<TapScope<B>>],
        depth: usize,
    ) -> FloatTensor<Self> {
        let targets = scopes
            .iter()
            .map(|scope| scope.clone() as Arc<dyn ProbeTarget>)
            .collect();
        probe_chain::<B, C>(like, targets, depth)
    }

    fn boundary(tensor: FloatTensor<Self>, scope: &Arc<TapScope<B>>) -> FloatTensor<Self> {
        match Boundary
            .prepare::<C>([tensor.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(BoundaryState(scope.clone()), tensor.primitive),
            OpsKind::UnTracked(prep) => prep.finish(tensor.primitive),
        }
    }
}

/// Inserts a tap on every trainable parameter (visit order = parameter index).
///
/// Without `lazy`, every tap is created now, directly above its parameter (it fires at the end
/// of backward unless a layer boundary hands it over). With `lazy`, the parameters of the copy
/// are uninitialised and each tap is created at the parameter's first use in the forward,
/// anchored where the scope's plan says (see [`DepthPlan`]).
pub(crate) struct TapMapper<B: TapBackend> {
    next: usize,
    kinds: Arc<Vec<ParamKind>>,
    scope: Arc<TapScope<B::InnerBackend>>,
    lazy: bool,
}

impl<B: TapBackend> TapMapper<B> {
    pub(crate) fn new(
        kinds: Arc<Vec<ParamKind>>,
        scope: Arc<TapScope<B::InnerBackend>>,
        lazy: bool,
    ) -> Self {
        TapMapper {
            next: 0,
            kinds,
            scope,
            lazy,
        }
    }
}

impl<B: TapBackend> ModuleMapper<B> for TapMapper<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        if self.kinds.get(index) != Some(&ParamKind::Trainable) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        if !self.lazy {
            let tapped = B::tap(tensor.into_primitive().tensor(), index, &self.scope);
            return Param::from_mapped_value(
                id,
                Tensor::from_primitive(TensorPrimitive::Float(tapped)),
                mapper,
            );
        }
        let (device, shape) = (tensor.device(), tensor.shape());
        let scope = self.scope.clone();
        // One tap however many clones of the copy initialise the parameter.
        let tapped: Arc<std::sync::OnceLock<Tensor<B, D>>> = Arc::default();
        Param::uninitialized(
            id,
            move |_, _| {
                tapped
                    .get_or_init(|| {
                        let primitive = tensor.clone().into_primitive().tensor();
                        let out = match scope.anchoring.planned_depth(index) {
                            Some(d) => B::tap_at(primitive, index, &scope, d),
                            None => B::tap(primitive, index, &scope),
                        };
                        Tensor::from_primitive(TensorPrimitive::Float(out))
                    })
                    .clone()
            },
            device,
            true,
            shape,
        )
    }
}
