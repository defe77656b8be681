//! Automatic overlap: where each lazy tap is anchored, and how that is learned.
//!
//! A plain tap sits right above its parameter, so backward (deepest first) reaches it only at
//! its end. An anchored tap has a second, untracked parent of a chosen depth (a chain of free
//! [`Anchor`] identities), which puts it one level below its shallowest consumer. The depths come
//! from a [`DepthPlan`], learned on one step with plain taps from the [`Probe`]s that backward
//! runs in every level. The taps themselves are in the parent module; this file only knows the
//! per-forward [`Anchoring`] state, so it does not depend on them.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// One forward's anchoring: its anchor chain, the order of its first uses, the plan it follows
/// and, while learning, what the probes saw.
pub(crate) struct Anchoring {
    /// The anchor chain (untracked identity nodes of depth 0, 1, 2, ...), boxed because its
    /// element type depends on the checkpoint strategy of the autodiff backend.
    chain: Mutex<Vec<Box<dyn Any + Send>>>,
    /// Parameter indices in the order their taps were created, for [`DepthPlan::learn`].
    first_use: Mutex<Vec<usize>>,
    /// The plan this forward's lazy taps follow, and which forward of the step this is.
    plan: Option<(Arc<DepthPlan>, usize)>,
    /// Set when this forward's first uses left the plan's sequence: later taps are plain.
    diverged: AtomicBool,
    /// Taps created at a planned depth.
    anchored: AtomicUsize,
    /// Per parameter index: the deepest backward level (seen by a probe, see [`probe_chain`])
    /// at which every consumer of its tap had run.
    done_at: Mutex<HashMap<usize, usize>>,
}

impl Anchoring {
    /// No plan (plain taps), nothing learned yet.
    pub(crate) fn new() -> Self {
        Anchoring {
            chain: Mutex::new(Vec::new()),
            first_use: Mutex::new(Vec::new()),
            plan: None,
            diverged: AtomicBool::new(false),
            anchored: AtomicUsize::new(0),
            done_at: Mutex::new(HashMap::new()),
        }
    }

    /// Lazy taps of the `forward`-th forward of its step follow `plan` as long as the forward
    /// uses parameters in the order the plan was learned from.
    pub(crate) fn set_plan(&mut self, plan: Option<Arc<DepthPlan>>, forward: usize) {
        self.plan = plan.map(|p| (p, forward));
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
    pub(crate) fn planned_depth(&self, index: usize) -> Option<usize> {
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

    /// Notes that the taps of `complete` (parameter indices) had no consumer left to run at
    /// backward level `level` (their first note is the deepest level).
    pub(crate) fn note_done(&self, level: usize, complete: impl IntoIterator<Item = usize>) {
        let mut done_at = self.done_at.lock().unwrap_or_else(PoisonError::into_inner);
        for index in complete {
            done_at.entry(index).or_insert(level);
        }
    }
}

/// What the probe of a backward level asks each forward's taps: note which of them have no
/// consumer left to run (implemented by the tap scope, which knows its pending taps).
pub(crate) trait ProbeTarget: Send + Sync {
    /// Called by the probe of backward level `level`.
    fn note_done(&self, level: usize);
}

/// An untracked identity: each one is one level deeper than its input, at no cost.
#[derive(Debug)]
struct Anchor;

impl<B: Backend> Backward<B, 1> for Anchor {
    type State = ();

    fn backward(self, _: Ops<(), 1>, _: &mut Gradients, _: &mut Checkpointer) {}
}

/// The forward's anchor of depth `depth`, extending the chain as needed (one node per level, on a
/// one-element tensor; shared by every tap of the forward).
pub(crate) fn anchor_at<B: Backend, C: CheckpointStrategy>(
    anchoring: &Anchoring,
    like: &FloatTensor<Autodiff<B, C>>,
    depth: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let mut chain = anchoring
        .chain
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
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
#[derive(Clone)]
struct ProbeState {
    targets: Arc<Vec<Arc<dyn ProbeTarget>>>,
    level: usize,
}

impl fmt::Debug for ProbeState {
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
    type State = ProbeState;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        for target in ops.state.targets.iter() {
            target.note_done(ops.state.level);
        }
        unary::<B, _>(ops.parents, ops.node, grads, |grad| grad);
    }
}

/// A tracked chain of one-element identity nodes of depth 0 to `depth` (on `like`'s device, in
/// its dtype), returning its last node: backward runs one of them in every level below `depth`,
/// each asking `targets` to note which taps have no consumer left to run.
pub(crate) fn probe_chain<B: Backend, C: CheckpointStrategy>(
    like: &FloatTensor<Autodiff<B, C>>,
    targets: Vec<Arc<dyn ProbeTarget>>,
    depth: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let device = {
        use burn::tensor::ops::FloatTensorOps;
        Autodiff::<B, C>::float_device(like)
    };
    // In the loss's dtype: the probes are added to it.
    let dtype = burn::tensor::TensorMetadata::dtype(like);
    let data = burn::tensor::TensorData::new(vec![0.0f32], [1]).convert_dtype(dtype);
    let root: Tensor<Autodiff<B, C>, 1> = {
        use burn::tensor::ops::FloatTensorOps;
        // The backend's op keeps the dtype (`Tensor::from_data` would take the default).
        Tensor::from_primitive(TensorPrimitive::Float(Autodiff::<B, C>::float_from_data(
            data, &device,
        )))
        .require_grad()
    };
    let targets = Arc::new(targets);
    let mut last = root.into_primitive().tensor();
    for level in 1..=depth {
        let state = ProbeState {
            targets: targets.clone(),
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
    /// [`probe_chain`], whose loss had depth `loss_depth`.
    pub(crate) fn learn<'a>(
        forwards: impl IntoIterator<Item = &'a Anchoring>,
        loss_depth: usize,
    ) -> DepthPlan {
        let forwards = forwards
            .into_iter()
            .map(|anchoring| {
                let first_use = anchoring
                    .first_use
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let done_at = anchoring
                    .done_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
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

    /// Whether the step made of `forwards` (which followed this plan) with a loss of depth
    /// `loss_depth` had the graph the plan was learned on, as far as DDP can see: the same
    /// forwards, the same first uses, the same loss depth.
    pub(crate) fn held<'a>(
        &self,
        forwards: impl ExactSizeIterator<Item = &'a Anchoring>,
        loss_depth: usize,
    ) -> bool {
        loss_depth == self.loss_depth
            && forwards.len() == self.forwards.len()
            && forwards
                .enumerate()
                .all(|(forward, anchoring)| anchoring.followed(self, forward))
    }
}
