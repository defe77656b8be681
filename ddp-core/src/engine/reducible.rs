//! Which gradient dtypes DDP reduces: one `HostGrad` (`reducer/host_grad.rs`) variant
//! each. Its own file so that the parameter table can check a model at construction without
//! depending on the reducer.

use burn::tensor::DType;

/// Whether DDP reduces gradients of `dtype`.
pub(crate) fn reducible_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}
