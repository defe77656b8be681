//! Gradient taps: an identity autodiff op whose backward hands a parameter's gradient to DDP.
//!
//! DDP maps a clone of the model before each forward so that every trainable parameter passes
//! through [`TapBackend::tap`]. When backward reaches the tap, the gradient (on the inner,
//! non-autodiff backend) goes to a [`GradientSink`] and is *not* passed on to the parameter:
//! DDP builds the synchronised `GradientsParams` itself, so the local copy would only cost
//! memory.
//!
//! # Threads
//! The sink runs on the thread that called `backward()`, while autodiff holds its graph: it must
//! only hand the gradient off (copy it into a bucket), never run autodiff operations.
//!
//! # Ordering
//! burn runs backward by node depth, deepest first. A tap on a parameter sits just above the
//! leaf, so plain taps fire at the end of backward; see the crate docs on overlap.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use std::fmt;
use std::sync::Arc;

/// Receives gradients from taps, identified by the parameter's index in DDP's parameter list.
pub trait GradientSink<B: Backend>: Send + Sync {
    /// Called once per tap when backward reaches it.
    fn on_gradient(&self, param_index: usize, grad: FloatTensor<B>);
}

/// Backends on which DDP can tap gradients: every `Autodiff<B, C>`.
pub trait TapBackend: AutodiffBackend {
    /// Returns `tensor` unchanged; in backward, its gradient goes to `sink` under `param_index`.
    fn tap(
        tensor: FloatTensor<Self>,
        param_index: usize,
        sink: Arc<dyn GradientSink<Self::InnerBackend>>,
    ) -> FloatTensor<Self>;
}

struct TapState<B: Backend> {
    param_index: usize,
    sink: Arc<dyn GradientSink<B>>,
}

impl<B: Backend> Clone for TapState<B> {
    fn clone(&self) -> Self {
        TapState {
            param_index: self.param_index,
            sink: self.sink.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for TapState<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TapState").field("param_index", &self.param_index).finish()
    }
}

#[derive(Debug)]
struct Tap;

impl<B: Backend> Backward<B, 1> for Tap {
    type State = TapState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        ops.state.sink.on_gradient(ops.state.param_index, grad);
    }
}

impl<B: Backend, C: CheckpointStrategy> TapBackend for Autodiff<B, C> {
    fn tap(
        tensor: FloatTensor<Self>,
        param_index: usize,
        sink: Arc<dyn GradientSink<B>>,
    ) -> FloatTensor<Self> {
        match Tap.prepare::<C>([tensor.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(TapState { param_index, sink }, tensor.primitive),
            OpsKind::UnTracked(prep) => prep.finish(tensor.primitive),
        }
    }
}
