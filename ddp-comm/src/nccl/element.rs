//! Element types NCCL carries, and how [`ReduceOp`] maps onto NCCL's operators.

use crate::dtype::Element;
use crate::reduce_op::ReduceOp;
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::NcclType;
use cudarc::nccl::sys::ncclRedOp_t;

/// An [`Element`] that NCCL can reduce and move: `f32`, `f64`, `i32`, `i64`, `u8`, `f16` and
/// `bf16`. Implemented for every such type; nothing to implement yourself.
pub trait NcclElement: Element + NcclType + DeviceRepr + ValidAsZeroBits {}

impl<T: Element + NcclType + DeviceRepr + ValidAsZeroBits> NcclElement for T {}

/// NCCL's operator for `op`.
///
/// `Avg` maps to NCCL's own average (NCCL 2.10 or later): floats are scaled as they are summed,
/// integers summed and then divided with truncation, which is what [`ReduceOp::Avg`] promises.
pub(crate) fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Product => ncclRedOp_t::ncclProd,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carries<T: NcclElement>() {}

    #[test]
    fn every_element_type_is_an_nccl_element() {
        carries::<f32>();
        carries::<f64>();
        carries::<i32>();
        carries::<i64>();
        carries::<u8>();
        carries::<half::f16>();
        carries::<half::bf16>();
    }

    #[test]
    fn each_reduce_op_has_its_nccl_operator() {
        let pairs = [
            (ReduceOp::Sum, "Sum"),
            (ReduceOp::Avg, "Avg"),
            (ReduceOp::Min, "Min"),
            (ReduceOp::Max, "Max"),
            (ReduceOp::Product, "Prod"),
        ];
        for (op, name) in pairs {
            let got = match nccl_op(op) {
                ncclRedOp_t::ncclSum => "Sum",
                ncclRedOp_t::ncclAvg => "Avg",
                ncclRedOp_t::ncclMin => "Min",
                ncclRedOp_t::ncclMax => "Max",
                ncclRedOp_t::ncclProd => "Prod",
                _ => "other",
            };
            assert_eq!(got, name, "{op}");
        }
    }
}
