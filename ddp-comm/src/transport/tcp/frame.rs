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
        use crate::proptest_support::{config, fingerprint, mutated};
        use proptest::prelude::*;

        /// The header with the bytes `check` ignores (reserved: 5..8, and byte 3 of the
        /// packed word) cleared.
        fn significant(h: &[u8; HEADER_BYTES]) -> [u8; HEADER_BYTES] {
            let mut h = *h;
            h[5..8].fill(0);
            h[11] = 0;
            h
        }

        /// The expected fingerprint and payload length, and a header to check against them:
        /// the expected one or another rank's (half the time each), mutated.
        fn case() -> impl Strategy<Value = (Fingerprint, usize, [u8; HEADER_BYTES])> {
            (
                fingerprint(),
                any::<usize>(),
                fingerprint(),
                any::<usize>(),
                any::<bool>(),
            )
                .prop_flat_map(|(fp, payload, other, other_payload, same)| {
                    let base = if same {
                        encode(&fp, payload)
                    } else {
                        encode(&other, other_payload)
                    };
                    (Just(fp), Just(payload), mutated(base.to_vec()))
                })
                .prop_map(|(fp, payload, h)| {
                    let mut header = [0u8; HEADER_BYTES];
                    header.copy_from_slice(&h);
                    (fp, payload, header)
                })
        }

        proptest! {
            #![proptest_config(config())]

            /// Any 40 bytes (mostly valid headers, the expected one or not, with a few bytes
            /// flipped: random ones never get past the magic) are checked without panicking,
            /// and pass exactly when they are the expected header, reserved bytes aside.
            #[test]
            fn any_header_is_checked_safely((fp, payload, h) in case()) {
                let expected = significant(&encode(&fp, payload));
                prop_assert_eq!(
                    check(&h, &fp, payload, 0, 1).is_ok(),
                    significant(&h) == expected
                );
            }

            #[test]
            fn headers_round_trip(fp in fingerprint(), payload in any::<usize>()) {
                prop_assert!(check(&encode(&fp, payload), &fp, payload, 0, 1).is_ok());
            }
        }

        /// Fails if `case()` goes back to random bytes: some headers must pass and some must
        /// fail past the magic (as a mismatch), or the property above tests only the magic.
        #[test]
        fn the_header_generator_reaches_past_the_magic() {
            use proptest::strategy::ValueTree;
            use proptest::test_runner::TestRunner;
            let mut runner = TestRunner::deterministic();
            let (mut passed, mut mismatched) = (0, 0);
            for _ in 0..400 {
                let (fp, payload, h) = case().new_tree(&mut runner).expect("a case").current();
                match check(&h, &fp, payload, 0, 1) {
                    Ok(()) => passed += 1,
                    Err(CommError::Mismatch { .. }) => mismatched += 1,
                    Err(_) => {}
                }
            }
            assert!(
                passed >= 20 && mismatched >= 20,
                "{passed} passed, {mismatched} mismatched"
            );
        }
    }
}
