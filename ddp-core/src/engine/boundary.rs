//! [`layer_boundary`]: the opt-in way for a model to let each layer's gradients go out as soon as
//! that layer's backward is done.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use std::any::Any;
use std::cell::RefCell;

/// Applies a boundary to a boxed float primitive of DDP's backend; returns any other box as is.
pub(crate) type BoundaryFn = Box<dyn Fn(Box<dyn Any>) -> Box<dyn Any>>;

thread_local! {
    /// The boundary of the `DistributedDataParallel::forward` running on this thread.
    static CURRENT: RefCell<Option<BoundaryFn>> = const { RefCell::new(None) };
}

/// Marks a layer boundary on `x` and returns it unchanged: the opt-in way for a model to let
/// each layer's gradients go out as soon as that layer's backward is done.
///
/// Call it on the activation *entering* a layer (or a block of layers) in your forward:
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, Relu};
/// use burn::tensor::{Tensor, backend::Backend};
///
/// #[derive(Module, Debug)]
/// struct Mlp<B: Backend> {
///     fc1: Linear<B>,
///     fc2: Linear<B>,
///     out: Linear<B>,
///     act: Relu,
/// }
///
/// impl<B: Backend> Mlp<B> {
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
///         let x = self.act.forward(self.fc1.forward(x));
///         let x = ddp_core::layer_boundary(x); // fc2's and out's gradients leave after their backward
///         let x = self.act.forward(self.fc2.forward(x));
///         let x = ddp_core::layer_boundary(x);
///         self.out.forward(x)
///     }
/// }
/// ```
///
/// Outside [`DistributedDataParallel::forward`](crate::DistributedDataParallel::forward) it
/// returns the tensor unchanged, so the model runs the same everywhere.
///
/// # Trade-off
/// Each boundary adds one identity node to the graph and, in backward, a scan over the taps not
/// yet handed over (microseconds for models with hundreds of parameters). What it buys: buckets
/// fill, and their all-reduces start, while earlier layers are still computing their backward,
/// instead of all at the end. Mark the boundaries between large layers; marking every small op
/// buys nothing. Gradients are the same with or without boundaries (tested).
pub fn layer_boundary<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let active = CURRENT.with(|c| c.borrow().is_some());
    if !active {
        return x;
    }
    let boxed: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    let out = CURRENT.with(|c| match c.borrow().as_ref() {
        Some(f) => f(boxed),
        None => boxed,
    });
    match out.downcast::<burn::tensor::ops::FloatTensor<B>>() {
        Ok(p) => Tensor::from_primitive(TensorPrimitive::Float(*p)),
        // Cannot happen: the closure returns what it got unless it is DDP's own type.
        Err(_) => unreachable!("layer_boundary: the boundary returned another tensor type"),
    }
}

/// Installs `f` for the duration of `body` on this thread (nested calls restore the outer one).
pub(crate) fn with_boundary<O>(f: BoundaryFn, body: impl FnOnce() -> O) -> O {
    struct Restore(Option<BoundaryFn>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = CURRENT.with(|c| c.borrow_mut().replace(f));
    let _restore = Restore(prev);
    body()
}
