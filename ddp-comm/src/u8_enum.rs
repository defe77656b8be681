//! One declaration for the enums that travel as a single byte (opcodes, statuses, collective
//! kinds, element types, reduction operators, hello kinds).

/// Declares a fieldless `#[repr(u8)]` enum, every variant with its code, and its decoder
/// `from_u8` (the inverse of `as u8`; `None` for any other byte). Each code is written once,
/// so a variant cannot be added to the enum and forgotten by the decoder.
macro_rules! u8_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $code:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(u8)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant = $code,)+
        }

        impl $name {
            /// The variant whose code is `v`, if any.
            pub(crate) fn from_u8(v: u8) -> Option<Self> {
                match v {
                    $($code => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

pub(crate) use u8_enum;

#[cfg(test)]
mod tests {
    u8_enum! {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Sample {
            A = 3,
            B = 7,
        }
    }

    #[test]
    fn from_u8_inverts_as_u8_and_rejects_other_bytes() {
        for v in [Sample::A, Sample::B] {
            assert_eq!(Sample::from_u8(v as u8), Some(v));
        }
        assert_eq!(Sample::from_u8(0), None);
        assert_eq!(Sample::from_u8(4), None);
    }
}
