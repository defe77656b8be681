//! MPI datatypes and reduction operations for ddp-comm's element types.
//!
//! The native types map to MPI's predefined datatypes and operations. MPI has no half-precision
//! types, so `f16` and `bf16` travel as 16-bit integers and reduce with user-defined operations
//! that run ddp-comm's own arithmetic (the same as the TCP and shared-memory transports).
//! `Avg` is a sum here; the caller scales the inputs (f16, bf16) or divides the sum.

use super::call::check;
use crate::dtype::DataType;
use crate::error::Result;
use crate::reduce_op::{ReduceOp, combine_bytes};
use mpi::ffi;
use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;

/// The MPI datatype that carries one element of `dtype`.
pub(super) fn datatype(dtype: DataType) -> ffi::MPI_Datatype {
    // SAFETY: reading constants the MPI library exports.
    unsafe {
        match dtype {
            DataType::F32 => ffi::RSMPI_FLOAT,
            DataType::F64 => ffi::RSMPI_DOUBLE,
            DataType::I32 => ffi::RSMPI_INT32_T,
            DataType::I64 => ffi::RSMPI_INT64_T,
            DataType::U8 => ffi::RSMPI_UINT8_T,
            DataType::F16 | DataType::BF16 => ffi::RSMPI_UINT16_T,
        }
    }
}

/// The MPI operation reducing `dtype` with `op` (`Avg` as a sum).
pub(super) fn operation(dtype: DataType, op: ReduceOp) -> Result<ffi::MPI_Op> {
    let op = op.combine_op();
    if matches!(dtype, DataType::F16 | DataType::BF16) {
        let ops = half_ops()?;
        let by_type = if dtype == DataType::F16 {
            &ops.0[0]
        } else {
            &ops.0[1]
        };
        return Ok(by_type[op_index(op)]);
    }
    // SAFETY: reading constants the MPI library exports.
    Ok(unsafe {
        match op {
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Product => ffi::RSMPI_PROD,
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
        }
    })
}

/// Sum, Min, Max, Product: the slots of [`HalfOps`].
fn op_index(op: ReduceOp) -> usize {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => 0,
        ReduceOp::Min => 1,
        ReduceOp::Max => 2,
        ReduceOp::Product => 3,
    }
}

/// User-defined operations: `[f16, bf16]` x `[sum, min, max, product]`.
struct HalfOps([[ffi::MPI_Op; 4]; 2]);

// SAFETY: MPI operation handles are process-wide and may be used from any thread under
// MPI_THREAD_MULTIPLE; they are created once and never freed.
unsafe impl Send for HalfOps {}
// SAFETY: as above; the handles are only read.
unsafe impl Sync for HalfOps {}

/// Creates the half-precision operations on first use (MPI is initialised by then).
fn half_ops() -> Result<&'static HalfOps> {
    static OPS: OnceLock<std::result::Result<HalfOps, crate::error::CommError>> = OnceLock::new();
    let created = OPS.get_or_init(|| {
        let functions: [[ffi::MPI_User_function; 4]; 2] = [
            [
                Some(reduce_half::<6, 1>),
                Some(reduce_half::<6, 3>),
                Some(reduce_half::<6, 4>),
                Some(reduce_half::<6, 5>),
            ],
            [
                Some(reduce_half::<7, 1>),
                Some(reduce_half::<7, 3>),
                Some(reduce_half::<7, 4>),
                Some(reduce_half::<7, 5>),
            ],
        ];
        // SAFETY: a null handle, overwritten by MPI_Op_create below before any use.
        let mut ops: [[ffi::MPI_Op; 4]; 2] = unsafe { std::mem::zeroed() };
        for (t, row) in functions.iter().enumerate() {
            for (o, f) in row.iter().enumerate() {
                // SAFETY: `f` has MPI's user-function signature; the operation is commutative.
                check("MPI_Op_create", unsafe {
                    ffi::MPI_Op_create(*f, 1, &mut ops[t][o])
                })?;
            }
        }
        Ok(HalfOps(ops))
    });
    match created {
        Ok(ops) => Ok(ops),
        Err(e) => Err(crate::error::CommError::Aborted(format!(
            "creating MPI's half-precision reductions failed: {e}"
        ))),
    }
}

/// `inout[i] = in[i] (op) inout[i]` for `*len` elements of `DTYPE` (a [`DataType`] tag) with
/// `OP` (a [`ReduceOp`] tag). Copies into aligned buffers: MPI's scratch buffers carry no
/// alignment promise.
unsafe extern "C" fn reduce_half<const DTYPE: u8, const OP: u8>(
    input: *mut c_void,
    inout: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    let (Some(dtype), Some(op)) = (DataType::from_u8(DTYPE), ReduceOp::from_u8(OP)) else {
        return;
    };
    // SAFETY: MPI passes a valid count.
    let n = usize::try_from(unsafe { *len }).unwrap_or(0);
    if n == 0 {
        return;
    }
    let bytes = n * 2;
    let mut dst = vec![0u16; n];
    let mut src = vec![0u16; n];
    // SAFETY: MPI passes buffers of `*len` elements of 2 bytes each.
    unsafe {
        std::ptr::copy_nonoverlapping(inout.cast::<u8>(), dst.as_mut_ptr().cast(), bytes);
        std::ptr::copy_nonoverlapping(input.cast::<u8>(), src.as_mut_ptr().cast(), bytes);
    }
    combine_bytes(
        dtype,
        op,
        bytemuck::cast_slice_mut(&mut dst),
        bytemuck::cast_slice(&src),
    );
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(dst.as_ptr().cast(), inout.cast::<u8>(), bytes) };
}
