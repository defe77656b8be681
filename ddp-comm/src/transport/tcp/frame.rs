//! The 40-byte header in front of every payload between ranks.
//!
//! ```text
//! 0..4   magic "DDPC"       4  version     5..8 reserved (0)
//! 8..16  kind, type, op, root: `Fingerprint::packed` (the word shared memory carries too)
//! 16..24 sequence number    24..32 element count          32..40 payload bytes
//! ```
//! The receiver always knows how many bytes it expects, so a header that announces anything
//! else is rejected before a byte of payload is read.

use crate::collective::Fingerprint;
use crate::error::CommError;

pub(crate) const HEADER_BYTES: usize = 40;
const MAGIC: &[u8; 4] = b"DDPC";
const VERSION: u8 = 2;

pub(crate) fn encode(fp: &Fingerprint, payload_bytes: usize) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(MAGIC);
    h[4] = VERSION;
    h[8..16].copy_from_slice(&fp.packed().to_le_bytes());
    h[16..24].copy_from_slice(&fp.seq.to_le_bytes());
    h[24..32].copy_from_slice(&fp.count.to_le_bytes());
    h[32..40].copy_from_slice(&(payload_bytes as u64).to_le_bytes());
    h
}

fn u64_at(h: &[u8; HEADER_BYTES], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Checks a received header against what this rank expects from global rank `peer`.
pub(crate) fn check(
    h: &[u8; HEADER_BYTES],
    expected: &Fingerprint,
    expected_payload: usize,
    my_rank: usize,
    peer: usize,
) -> Result<(), CommError> {
    let from = || format!("rank {peer}");
    if &h[0..4] != MAGIC {
        return Err(CommError::Protocol {
            from: from(),
            reason: format!("bad magic {:02x?} (not a ddp-comm peer?)", &h[0..4]),
        });
    }
    if h[4] != VERSION {
        return Err(CommError::Protocol {
            from: from(),
            reason: format!("protocol version {} but this rank speaks {VERSION}", h[4]),
        });
    }
    let theirs =
        Fingerprint::unpack(u64_at(h, 16), u64_at(h, 24), u64_at(h, 8)).ok_or_else(|| {
            CommError::Protocol {
                from: from(),
                reason: format!(
                    "unknown collective kind {}, dtype {} or op {}",
                    h[8], h[9], h[10]
                ),
            }
        })?;
    expected.expect_same(&theirs, my_rank, peer)?;
    let payload = u64_at(h, 32);
    if payload != expected_payload as u64 {
        return Err(CommError::Protocol {
            from: from(),
            reason: format!(
                "{} announces {payload} payload bytes, expected {expected_payload}",
                expected.label()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::CollectiveKind;
    use crate::dtype::DataType;
    use crate::reduce_op::ReduceOp;

    fn fp() -> Fingerprint {
        Fingerprint::new(5, CollectiveKind::AllReduce, DataType::F32, 100).with_op(ReduceOp::Sum)
    }

    #[test]
    fn matching_header_passes() {
        let h = encode(&fp(), 200);
        check(&h, &fp(), 200, 0, 1).unwrap();
    }

    #[test]
    fn different_collective_is_a_mismatch_naming_both() {
        let theirs =
            Fingerprint::new(5, CollectiveKind::Broadcast, DataType::F32, 100).with_root(0);
        let err = check(&encode(&theirs, 200), &fp(), 200, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 0 called all_reduce(f32 x 100, sum)"),
            "{err}"
        );
        assert!(
            err.contains("rank 1 called broadcast(f32 x 100, root 0)"),
            "{err}"
        );
    }

    #[test]
    fn oversized_payload_is_rejected() {
        let err = check(&encode(&fp(), 1 << 40), &fp(), 200, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("announces 1099511627776 payload bytes, expected 200"),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_rejected() {
        let err = check(&[0xAB; HEADER_BYTES], &fp(), 200, 0, 3)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 3 sent an invalid frame: bad magic"),
            "{err}"
        );
    }

    mod properties {
        use super::super::*;
        use super::{CollectiveKind, DataType, ReduceOp};
        use crate::proptest_support::config;
        use proptest::prelude::*;

        /// Any valid fingerprint: every kind (1..=10), type (1..=7) and op (none, 1..=5).
        fn fingerprint() -> impl Strategy<Value = Fingerprint> {
            (
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
                1u8..=10,
                1u8..=7,
                0u8..=5,
            )
                .prop_filter_map(
                    "a valid kind, dtype and op",
                    |(seq, count, root, kind, dtype, op)| {
                        Some(Fingerprint {
                            seq,
                            kind: CollectiveKind::from_u8(kind)?,
                            dtype: DataType::from_u8(dtype)?,
                            op: if op == 0 {
                                None
                            } else {
                                Some(ReduceOp::from_u8(op)?)
                            },
                            count,
                            root,
                        })
                    },
                )
        }

        proptest! {
            #![proptest_config(config())]

            /// Any 40 bytes are checked without panicking, and pass only if they are exactly
            /// the expected header.
            #[test]
            fn any_header_is_checked_safely(
                h in any::<[u8; HEADER_BYTES]>(),
                fp in fingerprint(),
                payload in any::<usize>(),
            ) {
                if check(&h, &fp, payload, 0, 1).is_ok() {
                    prop_assert_eq!(h, encode(&fp, payload));
                }
            }

            #[test]
            fn headers_round_trip(fp in fingerprint(), payload in any::<usize>()) {
                prop_assert!(check(&encode(&fp, payload), &fp, payload, 0, 1).is_ok());
            }
        }
    }
}
