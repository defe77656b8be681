//! A differentiable all-reduce: [`SyncBatchNormBackend::sum_across_ranks`].
//!
//! Forward: the sum of the tensor over the ranks. Backward: the sum over the ranks of the
//! incoming gradient. That is the adjoint of the forward (`y = sum_r x_r` for every rank, so
//! `dL/dx_r = sum_s dL_s/dy_s`), and it is what makes the statistics' gradients of a
//! [`SyncBatchNorm`](super::SyncBatchNorm) reach the inputs of every rank.
//!
//! Values cross the host as f32 (the statistics are a few numbers per channel).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ddp_comm::{CommError, ReduceOp};

use super::SyncBatchNormGroup;

/// Backends on which a [`SyncBatchNorm`](super::SyncBatchNorm) can sum its statistics over
/// ranks: every `Autodiff<B>` whose inner backend is one (the sum is differentiable there), and
/// burn's `Flex` (and `NdArray`, `LibTorch`, `Cuda` with the features of those names)
/// themselves, which evaluation runs on. A model using `SyncBatchNorm` names it in its bounds
/// (`impl<B: SyncBatchNormBackend> Model<B>`).
pub trait SyncBatchNormBackend: Backend {
    /// The element-wise sum of `tensor` over the ranks of `group`'s statistics group. On an
    /// autodiff backend, its backward sums the incoming gradient over the ranks the same way
    /// (run during backward; a failure there aborts both groups, see
    /// [`SyncBatchNormGroup`]).
    ///
    /// # Collective
    /// Every rank of the group calls it with the same length, in the same order.
    ///
    /// # Errors
    /// The all-reduce's error.
    fn sum_across_ranks(
        tensor: Tensor<Self, 1>,
        group: &SyncBatchNormGroup,
    ) -> Result<Tensor<Self, 1>, CommError>;
}

/// Sums a 1-D tensor over the statistics group through the host.
fn host_sum<B: Backend>(
    tensor: FloatTensor<B>,
    group: &SyncBatchNormGroup,
) -> Result<FloatTensor<B>, CommError> {
    let tensor = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(tensor));
    let device = tensor.device();
    let len = tensor.dims()[0];
    let mut values: Vec<f32> = tensor.into_data().convert::<f32>().iter::<f32>().collect();
    group.stats_group().all_reduce(&mut values, ReduceOp::Sum)?;
    let summed = Tensor::<B, 1>::from_data(TensorData::new(values, [len]), &device);
    Ok(summed.into_primitive().tensor())
}

/// `sum_across_ranks` of a backend without autodiff: through the host.
fn host_sum_tensor<B: Backend>(
    tensor: Tensor<B, 1>,
    group: &SyncBatchNormGroup,
) -> Result<Tensor<B, 1>, CommError> {
    let summed = host_sum::<B>(tensor.into_primitive().tensor(), group)?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(summed)))
}

macro_rules! plain_backend {
    ($ty:ty) => {
        impl SyncBatchNormBackend for $ty {
            fn sum_across_ranks(
                tensor: Tensor<Self, 1>,
                group: &SyncBatchNormGroup,
            ) -> Result<Tensor<Self, 1>, CommError> {
                host_sum_tensor(tensor, group)
            }
        }
    };
}

plain_backend!(burn::backend::Flex);
#[cfg(feature = "ndarray")]
plain_backend!(burn::backend::NdArray);
#[cfg(feature = "tch")]
plain_backend!(burn::backend::LibTorch);

/// burn's CUDA backends, fused or not, whatever their element types (`burn::backend::Cuda` is
/// one or the other, as burn's `fusion` feature decides).
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
    use burn_fusion::Fusion;
    use cubecl::cuda::CudaRuntime;

    impl<F: FloatElement, I: IntElement, BT: BoolElement> SyncBatchNormBackend
        for CubeBackend<CudaRuntime, F, I, BT>
    {
        fn sum_across_ranks(
            tensor: Tensor<Self, 1>,
            group: &SyncBatchNormGroup,
        ) -> Result<Tensor<Self, 1>, CommError> {
            host_sum_tensor(tensor, group)
        }
    }

    impl<F: FloatElement, I: IntElement, BT: BoolElement> SyncBatchNormBackend
        for Fusion<CubeBackend<CudaRuntime, F, I, BT>>
    {
        fn sum_across_ranks(
            tensor: Tensor<Self, 1>,
            group: &SyncBatchNormGroup,
        ) -> Result<Tensor<Self, 1>, CommError> {
            host_sum_tensor(tensor, group)
        }
    }
}

/// The op's backward: sum the gradient over the ranks.
#[derive(Debug)]
struct SumAcrossRanks;

impl<B: Backend> Backward<B, 1> for SumAcrossRanks {
    type State = SyncBatchNormGroup;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let group = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            let local = grad.clone();
            match host_sum::<B>(grad, &group) {
                Ok(summed) => summed,
                Err(e) => {
                    // No error can be returned from inside burn's backward: abort the groups so
                    // that DDP's backward fails with this reason on every rank (the local
                    // gradient passed on here is never applied).
                    group.fail(&format!(
                        "all-reducing the statistics' gradient in backward: {e}"
                    ));
                    local
                }
            }
        });
    }
}

impl<B: SyncBatchNormBackend, C: CheckpointStrategy> SyncBatchNormBackend for Autodiff<B, C> {
    fn sum_across_ranks(
        tensor: Tensor<Self, 1>,
        group: &SyncBatchNormGroup,
    ) -> Result<Tensor<Self, 1>, CommError> {
        let tensor = tensor.into_primitive().tensor();
        let summed = host_sum::<B>(tensor.primitive.clone(), group)?;
        // Compute-bound: a checkpointing strategy keeps the result instead of recomputing it
        // (a recomputation would issue a collective the other ranks do not expect).
        let out = match SumAcrossRanks
            .prepare::<C>([tensor.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(group.clone(), summed),
            OpsKind::UnTracked(prep) => prep.finish(summed),
        };
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}
