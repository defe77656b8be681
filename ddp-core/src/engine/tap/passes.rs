//! The tapped passes of one step, the part of a step that DDP's `backward`, its `step_on` and
//! FSDP's `backward` share: tap a copy of the module, run the forward with layer boundaries on,
//! back-propagate (with probes while the depth plan is being learned), learn or check the plan,
//! and forget the taps.

use super::{
    DepthPlan, GradientSink, InWrapperBackward, TapBackend, TapMapper, TapScope, with_probes,
};
use crate::engine::boundary::{BoundaryFn, with_boundary};
use crate::engine::params::ParamKind;
use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use std::sync::Arc;
use std::time::Instant;

/// Who holds the tapped copy while its backward runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TappedCopy {
    /// Dropped when the forward returns (DDP's and FSDP's `forward`).
    DroppedAfterForward,
    /// Alive through backward: the caller's closure runs forward *and* backward (`step_on`).
    AliveThroughBackward,
}

/// What one backward did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BackwardPass {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    /// Gradients that layer boundaries handed over before the end of backward.
    pub(crate) early_gradients: usize,
    /// Taps created at a learned depth (automatic overlap).
    pub(crate) anchored_taps: usize,
}

/// The taps of the forwards since the last backward, and where to anchor them.
pub(crate) struct TappedPasses<I: Backend> {
    kinds: Arc<Vec<ParamKind>>,
    /// Lazy taps, anchored where the learned plan says (`DdpConfig::automatic_overlap`).
    automatic_overlap: bool,
    scopes: Vec<Arc<TapScope<I>>>,
    /// `None`: the next backward learns it.
    depth_plan: Option<Arc<DepthPlan>>,
}

impl<I: Backend> TappedPasses<I> {
    /// Passes over a module whose parameters are of `kinds` (only trainable ones are tapped).
    pub(crate) fn new(kinds: Vec<ParamKind>, automatic_overlap: bool) -> Self {
        TappedPasses {
            kinds: Arc::new(kinds),
            automatic_overlap,
            scopes: Vec::new(),
            depth_plan: None,
        }
    }

    /// For a module of another layout (FSDP loading a checkpoint): the plan is learned again.
    pub(crate) fn relayout(&mut self, kinds: Vec<ParamKind>) {
        self.forget();
        self.kinds = Arc::new(kinds);
        self.depth_plan = None;
    }

    /// Whether a forward waits for its backward.
    pub(crate) fn forward_pending(&self) -> bool {
        !self.scopes.is_empty()
    }

    /// How many forwards wait for their backward.
    pub(crate) fn pending_forwards(&self) -> usize {
        self.scopes.len()
    }

    /// Runs `f` on a copy of `module` whose trainable parameters pass through taps that hand
    /// their gradients (of forward `generation`) to `sink`, with
    /// [`layer_boundary`](crate::layer_boundary) marks active.
    pub(crate) fn run<B, M, O>(
        &mut self,
        module: M,
        sink: Arc<dyn GradientSink<I>>,
        generation: u64,
        copy: TappedCopy,
        f: impl FnOnce(&M) -> O,
    ) -> O
    where
        B: TapBackend<InnerBackend = I>,
        M: AutodiffModule<B>,
    {
        let lazy = self.automatic_overlap;
        let plan = self.depth_plan.clone().filter(|_| lazy);
        let mut scope = TapScope::new(sink, generation).with_plan(plan, self.scopes.len());
        if copy == TappedCopy::AliveThroughBackward {
            scope = scope.copy_outlives_backward();
        }
        let scope = Arc::new(scope);
        let tapped = module.map(&mut TapMapper::<B>::new(
            self.kinds.clone(),
            scope.clone(),
            lazy,
        ));
        let boundary_scope = scope.clone();
        let boundary: BoundaryFn = Box::new(move |t| match t.downcast::<FloatTensor<B>>() {
            Ok(p) => Box::new(B::boundary(*p, &boundary_scope)),
            Err(other) => other,
        });
        self.scopes.push(scope);
        with_boundary(boundary, || f(&tapped))
    }

    /// Back-propagates `loss` through the pending forwards, then learns the depth plan (the
    /// first time, with probes that leave every gradient unchanged) or checks that it still
    /// holds, and forgets the taps.
    ///
    /// Also returns burn's gradients of what the taps did not take: the gradients of tensors
    /// the loss used directly (see [`ParamTable::used_outside_taps`]).
    ///
    /// [`ParamTable::used_outside_taps`]: crate::engine::params::ParamTable::used_outside_taps
    pub(crate) fn backward<B, const D: usize>(
        &mut self,
        loss: Tensor<B, D>,
    ) -> (BackwardPass, B::Gradients)
    where
        B: TapBackend<InnerBackend = I>,
    {
        let lazy = self.automatic_overlap;
        let loss_depth = B::depth(&loss.clone().into_primitive().tensor());
        let learn = lazy && self.depth_plan.is_none();
        let root = if learn {
            with_probes(loss, &self.scopes, loss_depth)
        } else {
            loss
        };
        let start = Instant::now();
        let inside = InWrapperBackward::enter();
        let leftover = root.backward();
        drop(inside);
        let end = Instant::now();
        let anchorings = || self.scopes.iter().map(|s| s.anchoring());
        if learn {
            let plan = DepthPlan::learn(anchorings(), loss_depth);
            tracing::debug!(anchors = plan.anchors(), "learned where to anchor the taps");
            self.depth_plan = Some(Arc::new(plan));
        } else if let Some(plan) = self.depth_plan.as_ref().filter(|_| lazy)
            && !plan.held(anchorings(), loss_depth)
        {
            // Still correct (anchors only move when a tap runs), but the graph changed: learn
            // again on the next backward.
            tracing::debug!("the graph changed; learning tap depths again");
            self.depth_plan = None;
        }
        (self.conclude(start, end), leftover)
    }

    /// The end of a pass whose backward ran inside the caller's closure (`step_on`): the plan
    /// is neither learned nor checked there, since the loss never left the closure.
    pub(crate) fn conclude(&mut self, start: Instant, end: Instant) -> BackwardPass {
        let pass = BackwardPass {
            start,
            end,
            early_gradients: self.scopes.iter().map(|s| s.early_gradients()).sum(),
            anchored_taps: self.scopes.iter().map(|s| s.anchored_taps()).sum(),
        };
        self.forget();
        pass
    }

    /// Forgets the pending taps, releasing their tensors; gradients of theirs that a later
    /// backward might still produce go nowhere (the sink checks generations).
    pub(crate) fn forget(&mut self) {
        for scope in self.scopes.drain(..) {
            scope.clear();
        }
    }
}
