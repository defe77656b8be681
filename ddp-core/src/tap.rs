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

/// Receives gradients from taps, identified by the parameter's index in DDP's parameter list.
pub trait GradientSink<B: Backend>: Send + Sync {
    /// Called once per tap when its gradient is complete.
    fn on_gradient(&self, param_index: usize, grad: FloatTensor<B>);
}

/// A tap whose gradient has not been handed over yet.
struct PendingTap<I: Backend> {
    index: usize,
    tensor: FloatTensor<Autodiff<I>>,
    handed: Arc<AtomicBool>,
}

/// The taps of one forward/backward: where gradients go, and which are still pending (so a
/// boundary can hand them over early).
pub struct TapScope<I: Backend> {
    sink: Arc<dyn GradientSink<I>>,
    pending: Mutex<Vec<PendingTap<I>>>,
    early: AtomicUsize,
}

impl<I: Backend> fmt::Debug for TapScope<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.pending.lock().map(|p| p.len()).unwrap_or(0);
        f.debug_struct("TapScope").field("pending", &n).finish()
    }
}

impl<I: Backend> TapScope<I> {
    /// A scope that sends gradients to `sink`.
    pub fn new(sink: Arc<dyn GradientSink<I>>) -> Self {
        TapScope {
            sink,
            pending: Mutex::new(Vec::new()),
            early: AtomicUsize::new(0),
        }
    }

    /// How many gradients boundaries handed over before the end of backward.
    pub fn early_gradients(&self) -> usize {
        self.early.load(Ordering::Relaxed)
    }

    /// Forgets the pending taps (after backward), releasing their tensors.
    pub fn clear(&self) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Hands over every pending gradient whose tap has no consumer left to run.
    fn hand_over_complete(&self, grads: &mut Gradients) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|p| {
            // References to the tap's node: ours (in `pending`), the tap's own backward step, and
            // one per consumer step that has not run yet.
            if Arc::strong_count(&p.tensor.node) > 2 {
                return true;
            }
            if !p.handed.swap(true, Ordering::AcqRel)
                && let Some(grad) = grads.remove::<I>(&p.tensor)
            {
                self.early.fetch_add(1, Ordering::Relaxed);
                self.sink.on_gradient(p.index, grad);
            }
            false
        });
    }
}

/// Backends on which DDP can tap gradients: every `Autodiff<B, C>`.
pub trait TapBackend: AutodiffBackend {
    /// Returns `tensor` unchanged; in backward, its gradient goes to the scope's sink under
    /// `param_index`.
    fn tap(
        tensor: FloatTensor<Self>,
        param_index: usize,
        scope: &Arc<TapScope<Self::InnerBackend>>,
    ) -> FloatTensor<Self>;

    /// Returns `tensor` unchanged; in backward, once everything computed from it has run, hands
    /// over the scope's complete gradients.
    fn boundary(
        tensor: FloatTensor<Self>,
        scope: &Arc<TapScope<Self::InnerBackend>>,
    ) -> FloatTensor<Self>;
}

struct TapState<B: Backend> {
    param_index: usize,
    sink: Arc<dyn GradientSink<B>>,
    handed: Arc<AtomicBool>,
}

impl<B: Backend> Clone for TapState<B> {
    fn clone(&self) -> Self {
        TapState {
            param_index: self.param_index,
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

#[derive(Debug)]
struct Tap;

impl<B: Backend> Backward<B, 1> for Tap {
    type State = TapState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        if ops.state.handed.swap(true, Ordering::AcqRel) {
            return; // a boundary already handed this gradient over
        }
        let grad = grads.consume::<B>(&ops.node);
        ops.state.sink.on_gradient(ops.state.param_index, grad);
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

impl<B: Backend, C: CheckpointStrategy> TapBackend for Autodiff<B, C> {
    fn tap(
        tensor: FloatTensor<Self>,
        param_index: usize,
        scope: &Arc<TapScope<B>>,
    ) -> FloatTensor<Self> {
        let handed = Arc::new(AtomicBool::new(false));
        let state = TapState {
            param_index,
            sink: scope.sink.clone(),
            handed: handed.clone(),
        };
        match Tap
            .prepare::<C>([tensor.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = prep.finish(state, tensor.primitive);
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
            OpsKind::UnTracked(prep) => prep.finish(tensor.primitive),
        }
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
