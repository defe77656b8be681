//! [`NcclDtype`]: the element type of a raw device buffer handed to NCCL by address.

use cudarc::nccl::sys::ncclDataType_t;

/// The element type of a buffer given to [`NcclBackend::all_reduce_raw_async`](super::NcclBackend::all_reduce_raw_async)
/// by device address (the typed methods take it from the buffer's type instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NcclDtype {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `half::f16`.
    F16,
    /// `half::bf16`.
    BF16,
}

impl NcclDtype {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            NcclDtype::F32 => 4,
            NcclDtype::F64 => 8,
            NcclDtype::F16 | NcclDtype::BF16 => 2,
        }
    }

    /// NCCL's name for the type.
    pub(crate) fn nccl(self) -> ncclDataType_t {
        match self {
            NcclDtype::F32 => ncclDataType_t::ncclFloat32,
            NcclDtype::F64 => ncclDataType_t::ncclFloat64,
            NcclDtype::F16 => ncclDataType_t::ncclFloat16,
            NcclDtype::BF16 => ncclDataType_t::ncclBfloat16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::nccl::NcclType;

    #[test]
    fn should_match_the_typed_path_for_every_dtype() {
        let pairs = [
            (NcclDtype::F32, f32::as_nccl_type(), 4),
            (NcclDtype::F64, f64::as_nccl_type(), 8),
            (NcclDtype::F16, half::f16::as_nccl_type(), 2),
            (NcclDtype::BF16, half::bf16::as_nccl_type(), 2),
        ];
        for (d, nccl, size) in pairs {
            assert_eq!(d.nccl(), nccl, "{d:?}");
            assert_eq!(d.size_bytes(), size, "{d:?}");
        }
    }
}
