//! Gradient taps: an identity autodiff op whose backward hands a parameter's gradient to DDP.
//!
//! DDP maps a clone of the model before each forward so that every trainable parameter passes
//! through [`TapBackend::tap`]. When backward reaches the tap, the gradient (on the inner,
//! non-autodiff backend) goes to a [`GradientSink`] and is *not* passed on to the parameter:
//! DDP builds the synchronised `GradientsParams` itself, so the local copy would only cost
//! memory.
//!
//! # Ordering and layer boundaries
//! burn runs backward by node depth, deepest first. A tap sits just above its parameter, so
//! plain taps fire at the end of backward. A *boundary* ([`TapBackend::boundary`], reached
//! through [`layer_boundary`](crate::layer_boundary)) is an identity op on an activation; its
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

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::ddp::params::ParamKind;
use burn::module::{ModuleMapper, Param};
use burn::tensor::{Tensor, TensorPrimitive};

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
    /// The anchor chain (untracked identity nodes of depth 0, 1, 2, ...), boxed because its
    /// element type depends on the checkpoint strategy of the autodiff backend.
    anchors: Mutex<Vec<Box<dyn Any + Send>>>,
    /// Parameter indices in the order their taps were created, for [`DepthPlan::learn`].
    first_use: Mutex<Vec<usize>>,
    pending: Mutex<Vec<PendingTap<I>>>,
    early: AtomicUsize,
    /// The plan this forward's lazy taps follow, and which forward of the step this is.
    plan: Option<(Arc<DepthPlan>, usize)>,
    /// Set when this forward's first uses left the plan's sequence: later taps are plain.
    diverged: AtomicBool,
    /// Taps created at a planned depth.
    anchored: AtomicUsize,
    /// Per parameter index: the deepest backward level (seen by a probe, see
    /// [`TapOps::probe_chain`](sealed::TapOps::probe_chain)) at which every consumer of its tap
    /// had run.
    done_at: Mutex<HashMap<usize, usize>>,
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

impl<I: Backend> TapScope<I> {
    /// A scope whose taps send gradients of forward `generation` to `sink`.
    pub(crate) fn new(sink: Arc<dyn GradientSink<I>>, generation: u64) -> Self {
        TapScope {
            sink,
            generation,
            anchors: Mutex::new(Vec::new()),
            first_use: Mutex::new(Vec::new()),
            pending: Mutex::new(Vec::new()),
            early: AtomicUsize::new(0),
            plan: None,
            diverged: AtomicBool::new(false),
            anchored: AtomicUsize::new(0),
            done_at: Mutex::new(HashMap::new()),
            outside_refs: 0,
        }
    }

    /// Lazy taps of this scope, the `forward`-th of its step, follow `plan` as long as the
    /// forward uses parameters in the order the plan was learned from.
    pub(crate) fn with_plan(mut self, plan: Option<Arc<DepthPlan>>, forward: usize) -> Self {
        self.plan = plan.map(|p| (p, forward));
        self
    }

    /// How many taps were created at a planned depth.
    pub(crate) fn anchored_taps(&self) -> usize {
        self.anchored.load(Ordering::Relaxed)
    }

    /// Whether this forward used its parameters exactly as the plan's forward did (same
    /// sequence of first uses), so every anchor was where the plan put it.
    fn followed(&self, plan: &DepthPlan, forward: usize) -> bool {
        let first_use = self
            .first_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        !self.diverged.load(Ordering::Relaxed)
            && plan
                .forwards
                .get(forward)
                .is_some_and(|f| f.len() == first_use.len())
    }

    /// The planned anchor depth for the tap of `index`, the next first use of this forward, or
    /// `None` (a plain tap): also when the forward has left the plan's sequence, from then on.
    fn planned_depth(&self, index: usize) -> Option<usize> {
        let position = {
            let mut first_use = self
                .first_use
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            first_use.push(index);
            first_use.len() - 1
        };
        let (plan, forward) = self.plan.as_ref()?;
        if self.diverged.load(Ordering::Relaxed) {
            return None;
        }
        match plan.forwards.get(*forward).and_then(|f| f.get(position)) {
            Some(&(planned, depth)) if planned == index => {
                if depth.is_some() {
                    self.anchored.fetch_add(1, Ordering::Relaxed);
                }
                depth
            }
            _ => {
                self.diverged.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Called by the probe of backward level `level`: notes the taps whose consumers have all
    /// run by now (their first note is the deepest level).
    fn note_done(&self, level: usize) {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let mut done_at = self.done_at.lock().unwrap_or_else(PoisonError::into_inner);
        for p in pending.iter() {
            if Arc::strong_count(&p.tensor.node) <= 2 + self.outside_refs {
                done_at.entry(p.index).or_insert(level);
            }
        }
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

/// An untracked identity: each one is one level deeper than its input, at no cost.
#[derive(Debug)]
struct Anchor;

impl<B: Backend> Backward<B, 1> for Anchor {
    type State = ();

    fn backward(self, _: Ops<(), 1>, _: &mut Gradients, _: &mut Checkpointer) {}
}

/// The scope's anchor of depth `depth`, extending the chain as needed (one node per level, on a
/// one-element tensor; shared by every tap of the forward).
fn anchor_at<B: Backend, C: CheckpointStrategy>(
    scope: &TapScope<B>,
    like: &FloatTensor<Autodiff<B, C>>,
    depth: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let mut chain = scope.anchors.lock().unwrap_or_else(PoisonError::into_inner);
    let typed = |b: &Box<dyn Any + Send>| b.downcast_ref::<FloatTensor<Autodiff<B, C>>>().cloned();
    let mut last = match chain.last().and_then(typed) {
        Some(t) => t,
        None => {
            use burn::tensor::ops::FloatTensorOps;
            let device = Autodiff::<B, C>::float_device(like);
            let data = burn::tensor::TensorData::new(vec![0.0f32], [1]);
            let root = Autodiff::<B, C>::float_from_data(data, &device);
            chain.clear();
            chain.push(Box::new(root.clone()));
            root
        }
    };
    while chain.len() <= depth {
        last = match Anchor
            .prepare::<C>([last.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::UnTracked(prep) => prep.finish(last.primitive.clone()),
            OpsKind::Tracked(prep) => prep.finish((), last.primitive.clone()),
        };
        chain.push(Box::new(last.clone()));
    }
    chain.get(depth).and_then(typed).unwrap_or(last)
}

/// The state of the probe of one backward level.
struct ProbeState<B: Backend> {
    scopes: Arc<Vec<Arc<TapScope<B>>>>,
    level: usize,
}

impl<B: Backend> Clone for ProbeState<B> {
    fn clone(&self) -> Self {
        ProbeState {
            scopes: self.scopes.clone(),
            level: self.level,
        }
    }
}

impl<B: Backend> fmt::Debug for ProbeState<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeState")
            .field("level", &self.level)
            .finish()
    }
}

/// A tracked identity on a one-element tensor: backward runs it in its level, where it notes
/// which taps are complete.
#[derive(Debug)]
struct Probe;

impl<B: Backend> Backward<B, 1> for Probe {
    type State = ProbeState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        for scope in ops.state.scopes.iter() {
            scope.note_done(ops.state.level);
        }
        unary::<B, _>(ops.parents, ops.node, grads, |grad| grad);
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
        let anchor = anchor_at::<B, C>(scope, &tensor, depth);
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
        let device = {
            use burn::tensor::ops::FloatTensorOps;
            Self::float_device(like)
        };
        // In the loss's dtype: the probes are added to it.
        let dtype = burn::tensor::TensorMetadata::dtype(like);
        let data = burn::tensor::TensorData::new(vec![0.0f32], [1]).convert_dtype(dtype);
        let root: Tensor<Self, 1> = {
            use burn::tensor::ops::FloatTensorOps;
            // The backend's op keeps the dtype (`Tensor::from_data` would take the default).
            Tensor::from_primitive(TensorPrimitive::Float(Self::float_from_data(data, &device)))
                .require_grad()
        };
        let scopes = Arc::new(scopes.to_vec());
        let mut last = root.into_primitive().tensor();
        for level in 1..=depth {
            let state = ProbeState {
                scopes: scopes.clone(),
                level,
            };
            last = match Probe
                .prepare::<C>([last.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, last.primitive.clone()),
                OpsKind::UnTracked(prep) => prep.finish(last.primitive.clone()),
            };
        }
        last
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

/// Where to anchor each lazy tap so that backward reaches it right after its parameter's
/// consumers *without moving any other node*: learned on one step with plain taps.
///
/// burn runs backward level by level, deepest first, and a node's depth is one more than its
/// deepest input's. A tap at depth `t`, with `t` below every consumer's depth, leaves each
/// consumer's depth, and so every other node's depth, level and order, exactly as with plain
/// taps: backward does the same floating-point sums in the same order (results are bitwise those
/// of plain taps), and the tap runs right below its shallowest consumer instead of at the end.
/// Estimating depths from the forward (an earlier design) cannot be exact: an anchor too deep
/// moves its consumer, and everything after it, deeper.
///
/// Learning: a probe in every backward level notes when each tap's consumers have all run. The
/// probe of a level runs first in it (burn collects the graph depth-first from the root, and the
/// probes are the root's last input), so first noted at level `r`, every consumer is deeper than
/// `r` and one is at `r + 1`: depth `r` is safe, and the tap runs in the level right below its
/// shallowest consumer. The plan
/// holds for a step whose forwards use the parameters in the same order and whose loss has the
/// learned depth (unchanged depths leave it unchanged); otherwise DDP learns again.
#[derive(Debug, Clone)]
pub(crate) struct DepthPlan {
    /// Per forward of the step: parameter indices in order of first use, each with the depth
    /// of its tap's anchor (`None`: a plain tap).
    forwards: Vec<Vec<(usize, Option<usize>)>>,
    /// The loss's depth when the plan was learned.
    loss_depth: usize,
}

impl DepthPlan {
    /// Learns from the forwards of one step, run with plain taps and a backward probed by
    /// [`TapOps::probe_chain`](sealed::TapOps::probe_chain), whose loss had depth `loss_depth`.
    pub(crate) fn learn<I: Backend>(scopes: &[Arc<TapScope<I>>], loss_depth: usize) -> DepthPlan {
        let forwards = scopes
            .iter()
            .map(|scope| {
                let first_use = scope
                    .first_use
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let done_at = scope.done_at.lock().unwrap_or_else(PoisonError::into_inner);
                first_use
                    .iter()
                    .map(|&index| {
                        // Tap depth r = anchor depth r - 1; plain taps already have depth 1.
                        let anchor = done_at
                            .get(&index)
                            .and_then(|r| r.checked_sub(1))
                            .filter(|&d| d >= 1);
                        (index, anchor)
                    })
                    .collect()
            })
            .collect();
        DepthPlan {
            forwards,
            loss_depth,
        }
    }

    /// How many taps the plan anchors.
    pub(crate) fn anchors(&self) -> usize {
        self.forwards
            .iter()
            .flatten()
            .filter(|(_, d)| d.is_some())
            .count()
    }

    /// Whether the step made of `scopes` (forwards that followed this plan) with a loss of depth
    /// `loss_depth` had the graph the plan was learned on, as far as DDP can see: the same
    /// forwards, the same first uses, the same loss depth.
    pub(crate) fn held<I: Backend>(&self, scopes: &[Arc<TapScope<I>>], loss_depth: usize) -> bool {
        loss_depth == self.loss_depth
            && scopes.len() == self.forwards.len()
            && scopes
                .iter()
                .enumerate()
                .all(|(forward, scope)| scope.followed(self, forward))
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
                        let out = match scope.planned_depth(index) {
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
