//! Reduction operators and the kernels that apply them to byte buffers.

use crate::dtype::DataType;
use crate::u8_enum::u8_enum;
use half::{bf16, f16};
use std::fmt;

u8_enum! {
    /// How `all_reduce`, `reduce` and `reduce_scatter` combine the ranks' values.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum ReduceOp {
        /// Element-wise sum.
        #[default]
        Sum = 1,
        /// Element-wise mean: the sum divided by the number of ranks. Integer types use
        /// truncating division, as NCCL does. f16 and bf16 scale each rank's value by 1/n (in
        /// f32) and sum those, as NCCL and PyTorch DDP's default hook do, so a mean that fits
        /// the type is not lost to a sum that overflows it (8 ranks of f16 10000).
        Avg = 2,
        /// Element-wise minimum.
        Min = 3,
        /// Element-wise maximum.
        Max = 4,
        /// Element-wise product.
        Product = 5,
    }
}

impl ReduceOp {
    /// The operator applied pairwise while data moves; `Avg` sums (after
    /// [`ReduceOp::prescale_if_avg`], before [`ReduceOp::divide_if_avg`]).
    pub(crate) fn combine_op(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            op => op,
        }
    }

    /// `Some(ranks)` for `Avg` over `ranks` ranks, `None` for every other operator: what a
    /// transport that defers the whole `Avg` to another layer (shared memory) is told.
    pub(crate) fn avg_ranks(self, ranks: usize) -> Option<usize> {
        (self == ReduceOp::Avg).then_some(ranks)
    }

    /// The `Avg` prologue on `buf`, one rank's input to a sum over `ranks` ranks: for f16 and
    /// bf16 scales it by `1 / ranks` (see [`prescale_bytes`]); leaves it alone for every other
    /// type and operator. Every transport that reduces with [`ReduceOp::combine_op`] calls it on
    /// each rank's input (or a copy of it) before the sum.
    pub(crate) fn prescale_if_avg(self, ranks: usize, dtype: DataType, buf: &mut [u8]) {
        if let Some(n) = self.avg_ranks(ranks) {
            prescale_bytes(dtype, buf, n);
        }
    }

    /// The `Avg` epilogue on `buf`, which holds the sum over `ranks` ranks: divides it by
    /// `ranks` for `Avg` on every type but f16 and bf16 (already scaled by
    /// [`ReduceOp::prescale_if_avg`]) and leaves it alone for every other operator. One place,
    /// so every transport that reduces with [`ReduceOp::combine_op`] finishes `Avg` the same way.
    pub(crate) fn divide_if_avg(self, ranks: usize, dtype: DataType, buf: &mut [u8]) {
        if let Some(n) = self.avg_ranks(ranks) {
            divide_bytes(dtype, buf, n);
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        };
        f.write_str(name)
    }
}

macro_rules! combine_native {
    ($t:ty, $dst:expr, $src:expr, $op:expr) => {{
        let dst: &mut [$t] = bytemuck::cast_slice_mut($dst);
        let src: &[$t] = bytemuck::cast_slice($src);
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = sum(*d, *s))
            }
            ReduceOp::Product => dst.iter_mut().zip(src).for_each(|(d, s)| *d = prod(*d, *s)),
            ReduceOp::Min => dst.iter_mut().zip(src).for_each(|(d, s)| {
                if *s < *d {
                    *d = *s
                }
            }),
            ReduceOp::Max => dst.iter_mut().zip(src).for_each(|(d, s)| {
                if *s > *d {
                    *d = *s
                }
            }),
        }
    }};
}

/// Wrapping arithmetic for integers (no overflow panic in a collective), plain for floats.
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}
macro_rules! arith_int {
    ($($t:ty),*) => {$(impl Arith for $t {
        fn add(self, o: Self) -> Self { self.wrapping_add(o) }
        fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
    })*};
}
macro_rules! arith_float {
    ($($t:ty),*) => {$(impl Arith for $t {
        fn add(self, o: Self) -> Self { self + o }
        fn mul(self, o: Self) -> Self { self * o }
    })*};
}
arith_int!(i32, i64, u8);
arith_float!(f32, f64, f16, bf16);

#[inline(always)]
fn sum<T: Arith>(a: T, b: T) -> T {
    a.add(b)
}
#[inline(always)]
fn prod<T: Arith>(a: T, b: T) -> T {
    a.mul(b)
}

/// `dst[i] = dst[i] (op) src[i]` over whole elements of `dtype`.
///
/// Both slices hold the same number of bytes, a multiple of the element size, and are aligned
/// for `dtype` (callers slice typed buffers at element boundaries).
pub(crate) fn combine_bytes(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    match dtype {
        DataType::F32 => combine_native!(f32, dst, src, op),
        DataType::F64 => combine_native!(f64, dst, src, op),
        DataType::I32 => combine_native!(i32, dst, src, op),
        DataType::I64 => combine_native!(i64, dst, src, op),
        DataType::U8 => combine_native!(u8, dst, src, op),
        DataType::F16 => combine_native!(f16, dst, src, op),
        DataType::BF16 => combine_native!(bf16, dst, src, op),
    }
}

/// Whether [`prescale_bytes`] changes elements of `dtype` (f16 and bf16), for callers that
/// would copy an input only to scale it.
pub(crate) fn avg_prescales(dtype: DataType) -> bool {
    matches!(dtype, DataType::F16 | DataType::BF16)
}

/// The `Avg` prologue for an input to a sum over `n` ranks: scales every element of f16 and
/// bf16 by `1 / n`, in f32, and leaves every other type alone. The sum of those types over the
/// ranks can overflow (8 ranks of f16 10000 sum to inf) or round (bf16 holds 257 as 256) where
/// the mean fits; NCCL's own average and PyTorch DDP's default hook (divide, then sum) avoid
/// that the same way. Other types keep sum-then-divide, bit for bit as before.
pub(crate) fn prescale_bytes(dtype: DataType, buf: &mut [u8], n: usize) {
    macro_rules! scale {
        ($t:ty) => {{
            let v: &mut [$t] = bytemuck::cast_slice_mut(buf);
            let n = n as f32;
            v.iter_mut()
                .for_each(|x| *x = <$t>::from_f32(x.to_f32() / n));
        }};
    }
    match dtype {
        DataType::F16 => scale!(f16),
        DataType::BF16 => scale!(bf16),
        DataType::F32 | DataType::F64 | DataType::I32 | DataType::I64 | DataType::U8 => {}
    }
}

/// The `Avg` epilogue on a sum over `n` ranks: divides every element by `n`, for every type
/// but f16 and bf16, whose inputs [`prescale_bytes`] scaled instead.
pub(crate) fn divide_bytes(dtype: DataType, buf: &mut [u8], n: usize) {
    macro_rules! div {
        ($t:ty, $conv:expr) => {{
            let v: &mut [$t] = bytemuck::cast_slice_mut(buf);
            let n: $t = $conv;
            v.iter_mut().for_each(|x| *x /= n);
        }};
    }
    match dtype {
        DataType::F32 => div!(f32, n as f32),
        DataType::F64 => div!(f64, n as f64),
        DataType::I32 => div!(i32, n as i32),
        DataType::I64 => div!(i64, n as i64),
        DataType::U8 => div!(u8, n.min(u8::MAX as usize) as u8),
        DataType::F16 | DataType::BF16 => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_applies_each_op_elementwise() {
        let cases = [
            (ReduceOp::Sum, [5.0f32, -1.0]),
            (ReduceOp::Product, [6.0, -6.0]),
            (ReduceOp::Min, [2.0, -3.0]),
            (ReduceOp::Max, [3.0, 2.0]),
        ];
        for (op, want) in cases {
            let mut a = [2.0f32, 2.0];
            let b = [3.0f32, -3.0];
            combine_bytes(
                DataType::F32,
                op,
                bytemuck::cast_slice_mut(&mut a),
                bytemuck::cast_slice(&b),
            );
            assert_eq!(a, want, "{op}");
        }
    }

    #[test]
    fn integer_sum_wraps_instead_of_panicking() {
        let mut a = [250u8];
        combine_bytes(DataType::U8, ReduceOp::Sum, &mut a, &[10u8]);
        assert_eq!(a, [4]);
    }

    #[test]
    fn avg_epilogue_divides_by_world_size() {
        let mut v = [9i64, -9];
        divide_bytes(DataType::I64, bytemuck::cast_slice_mut(&mut v), 2);
        assert_eq!(v, [4, -4]);
    }

    /// f16 averages by scaling each input and summing: the sum of 8 f16 12288s (98304) would
    /// overflow to inf. (12288 / 8 and its multiples are exact in f16, so the mean is too.)
    #[test]
    fn half_avg_scales_inputs_instead_of_dividing_the_sum() {
        assert!(avg_prescales(DataType::F16) && avg_prescales(DataType::BF16));
        assert!(!avg_prescales(DataType::F32) && !avg_prescales(DataType::I64));
        let mut acc = [f16::ZERO];
        for _ in 0..8 {
            let mut x = [f16::from_f32(12_288.0)];
            ReduceOp::Avg.prescale_if_avg(8, DataType::F16, bytemuck::cast_slice_mut(&mut x));
            combine_bytes(
                DataType::F16,
                ReduceOp::Avg.combine_op(),
                bytemuck::cast_slice_mut(&mut acc),
                bytemuck::cast_slice(&x),
            );
        }
        ReduceOp::Avg.divide_if_avg(8, DataType::F16, bytemuck::cast_slice_mut(&mut acc));
        assert_eq!(acc, [f16::from_f32(12_288.0)]);

        // Other types and operators are untouched by the prologue.
        let mut f = [3.0f32];
        ReduceOp::Avg.prescale_if_avg(2, DataType::F32, bytemuck::cast_slice_mut(&mut f));
        let mut h = [f16::from_f32(3.0)];
        ReduceOp::Sum.prescale_if_avg(2, DataType::F16, bytemuck::cast_slice_mut(&mut h));
        assert_eq!((f, h), ([3.0], [f16::from_f32(3.0)]));
    }
}
