//! Element types that collectives move and reduce.
//!
//! Collectives travel as bytes plus a [`DataType`] tag, so one transport implementation serves
//! every element type; [`Element`] connects a Rust type to its tag.

use crate::u8_enum::u8_enum;
use std::fmt;

u8_enum! {
    /// The element type of a collective's buffer, carried in every frame's fingerprint.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum DataType {
        /// `f32`
        F32 = 1,
        /// `f64`
        F64 = 2,
        /// `i32`
        I32 = 3,
        /// `i64`
        I64 = 4,
        /// `u8`
        U8 = 5,
        /// IEEE half precision (`half::f16`)
        F16 = 6,
        /// bfloat16 (`half::bf16`)
        BF16 = 7,
    }
}

impl DataType {
    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 => 4,
            DataType::F64 | DataType::I64 => 8,
            DataType::U8 => 1,
            DataType::F16 | DataType::BF16 => 2,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U8 => "u8",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
        };
        f.write_str(name)
    }
}

/// A Rust type that collectives can carry. Implemented for `f32`, `f64`, `i32`, `i64`, `u8`,
/// `half::f16` and `half::bf16`; it is sealed because reductions are written per type.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed {
    /// The tag sent on the wire.
    const DTYPE: DataType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $d;
        }
    };
}

element!(f32, DataType::F32);
element!(f64, DataType::F64);
element!(i32, DataType::I32);
element!(i64, DataType::I64);
element!(u8, DataType::U8);
element!(half::f16, DataType::F16);
element!(half::bf16, DataType::BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_round_trips_through_u8() {
        for d in [
            DataType::F32,
            DataType::F64,
            DataType::I32,
            DataType::I64,
            DataType::U8,
            DataType::F16,
            DataType::BF16,
        ] {
            assert_eq!(DataType::from_u8(d as u8), Some(d));
        }
        assert_eq!(DataType::from_u8(0), None);
        assert_eq!(DataType::from_u8(200), None);
    }
}
