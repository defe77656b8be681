//! The reply to a `MultiGet` request (see `protocol`): status `Ok`, a `u32` count, then per key
//! a presence byte (0: not set, 1: set) followed, for a set key, by its value as a byte string.
//!
//! The server sizes the reply before copying any value, so one that would not fit in a frame
//! is answered with `TooLarge` (its size and the limit), never truncated. The client decodes
//! it as untrusted bytes: a count it did not ask for, or one the body cannot hold, allocates
//! nothing.

use super::protocol::{FrameReader, FrameWriter, Malformed, Status};

/// The reply to a `MultiGet` whose keys hold `values` (in the order asked): `Ok` with every
/// value, or `TooLarge` when its body would exceed `max_body` bytes (or the `u32::MAX` a
/// frame's length can announce). `values` is walked twice (once to size the reply, once to
/// write it), so the server builds no list of the values next to the list of keys.
pub(crate) fn encode<'v>(
    values: impl Iterator<Item = Option<&'v [u8]>> + Clone,
    max_body: usize,
) -> FrameWriter {
    let limit = max_body.min(u32::MAX as usize);
    let (count, len) = reply_len(values.clone());
    // Every entry takes at least a byte, so a reply within the limit has a count that fits.
    let count = match u32::try_from(count) {
        Ok(count) if len <= limit => count,
        _ => {
            return FrameWriter::new(Status::TooLarge as u8)
                .u64(len as u64)
                .u64(limit as u64);
        }
    };
    let mut w = FrameWriter::new(Status::Ok as u8).u32(count);
    for v in values {
        w = match v {
            None => w.raw(&[0]),
            Some(v) => w.raw(&[1]).bytes(v),
        };
    }
    w
}

/// How many values, and the body length of the `Ok` reply: status and count, then a presence
/// byte per key and a length and the bytes per value (saturating: a reply that large is
/// refused anyway).
fn reply_len<'v>(values: impl Iterator<Item = Option<&'v [u8]>>) -> (usize, usize) {
    values.fold((0, 1 + 4), |(count, n), v| {
        let entry = v.map_or(1, |v| v.len().saturating_add(1 + 4));
        (count + 1, n.saturating_add(entry))
    })
}

/// Decodes the fields of an `Ok` reply (what follows the status byte): one value per key,
/// `expected` of them, `None` for a key that is not set.
pub(crate) fn decode(fields: &[u8], expected: usize) -> Result<Vec<Option<Vec<u8>>>, Malformed> {
    let mut r = FrameReader::new(fields);
    let n = r.u32("value count")? as usize;
    // Every entry takes at least its presence byte, so the body bounds the count.
    if n != expected || n > r.remaining() {
        return Err(Malformed("value count"));
    }
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        values.push(match r.u8("presence byte")? {
            0 => None,
            1 => Some(r.bytes("value")?.to_vec()),
            _ => return Err(Malformed("presence byte")),
        });
    }
    if r.remaining() != 0 {
        return Err(Malformed("trailing bytes"));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status byte and the fields after it.
    fn split(w: FrameWriter) -> (u8, Vec<u8>) {
        let body = w.frame_body();
        (body[0], body[1..].to_vec())
    }

    #[test]
    fn should_round_trip_set_unset_and_empty_values_in_order() {
        let values: [Option<&[u8]>; 4] = [Some(b"a"), None, Some(b""), Some(b"a")];
        let (status, fields) = split(encode(values.iter().copied(), 1024));
        assert_eq!(status, Status::Ok as u8);
        assert_eq!(
            fields,
            [
                &4u32.to_le_bytes()[..],
                &[1, 1, 0, 0, 0, b'a', 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, b'a']
            ]
            .concat()
        );
        let decoded = decode(&fields, 4).expect("a well-formed reply");
        let want: Vec<Option<Vec<u8>>> = values.iter().map(|v| v.map(<[u8]>::to_vec)).collect();
        assert_eq!(decoded, want);
        let (_, none) = split(encode(std::iter::empty(), 1024));
        assert_eq!(decode(&none, 0), Ok(Vec::new()));
    }

    #[test]
    fn should_refuse_a_reply_over_the_limit_with_its_size_and_fit_one_exactly_at_it() {
        let value = [7u8; 100];
        let values = [Some(&value[..]), None];
        // Status, count, presence + length + 100 bytes, presence.
        let len = 1 + 4 + (1 + 4 + 100) + 1;
        let (status, fields) = split(encode(values.iter().copied(), len));
        assert_eq!(status, Status::Ok as u8);
        assert_eq!(1 + fields.len(), len);
        let (status, fields) = split(encode(values.iter().copied(), len - 1));
        assert_eq!(status, Status::TooLarge as u8);
        let mut r = FrameReader::new(&fields);
        assert_eq!(r.u64("len"), Ok(len as u64));
        assert_eq!(r.u64("max"), Ok(len as u64 - 1));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn should_reject_a_wrong_count_a_bad_presence_byte_and_trailing_bytes() {
        let (_, fields) = split(encode([Some(&b"v"[..]), None].into_iter(), 1024));
        assert_eq!(decode(&fields, 3), Err(Malformed("value count")));
        assert_eq!(decode(&fields, 1), Err(Malformed("value count")));
        let mut bad = fields.clone();
        bad[4] = 2;
        assert_eq!(decode(&bad, 2), Err(Malformed("presence byte")));
        let mut long = fields.clone();
        long.push(0);
        assert_eq!(decode(&long, 2), Err(Malformed("trailing bytes")));
        assert_eq!(
            decode(&fields[..fields.len() - 1], 2),
            Err(Malformed("presence byte"))
        );
    }

    #[test]
    fn should_refuse_a_lying_count_before_allocating() {
        // u32::MAX entries announced, three bytes to hold them; even a caller that asked for
        // that many keys gets an error, not a 4-billion-entry allocation.
        let fields = [&u32::MAX.to_le_bytes()[..], &[0, 0, 0]].concat();
        assert_eq!(
            decode(&fields, u32::MAX as usize),
            Err(Malformed("value count"))
        );
        assert_eq!(decode(&fields, 3), Err(Malformed("value count")));
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        fn values() -> impl Strategy<Value = Vec<Option<Vec<u8>>>> {
            proptest::collection::vec(
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
                0..12,
            )
        }

        proptest! {
            #![proptest_config(config())]

            /// Any bytes decode to exactly `expected` values held inside the body, or to a
            /// `Malformed`; never a panic.
            #[test]
            fn decode_never_panics(
                fields in proptest::collection::vec(any::<u8>(), 0..128),
                expected in prop_oneof![0usize..16, any::<usize>()],
            ) {
                if let Ok(values) = decode(&fields, expected) {
                    prop_assert_eq!(values.len(), expected);
                    let held: usize = values.iter().map(|v| 1 + v.as_ref().map_or(0, |v| 4 + v.len())).sum();
                    prop_assert_eq!(4 + held, fields.len());
                }
            }

            /// What the server encodes within its limit, the client decodes; over the limit,
            /// the server says how large the reply would have been, and never sends more than
            /// the limit.
            #[test]
            fn encode_respects_the_limit_and_round_trips(values in values(), max in 0usize..200) {
                let borrowed: Vec<Option<&[u8]>> = values.iter().map(|v| v.as_deref()).collect();
                let full = encode(borrowed.iter().copied(), usize::MAX).frame_body();
                let body = encode(borrowed.iter().copied(), max).frame_body();
                if full.len() <= max {
                    prop_assert_eq!(&body, &full);
                    prop_assert_eq!(body[0], Status::Ok as u8);
                    prop_assert_eq!(decode(&body[1..], values.len()), Ok(values));
                } else {
                    prop_assert_eq!(body[0], Status::TooLarge as u8);
                    let mut r = FrameReader::new(&body[1..]);
                    prop_assert_eq!(r.u64("len"), Ok(full.len() as u64));
                    prop_assert_eq!(r.u64("max"), Ok(max as u64));
                }
            }
        }
    }
}
