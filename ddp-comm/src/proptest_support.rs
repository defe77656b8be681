//! Shared setup of the crate's property tests.
//!
//! Decoders of untrusted bytes are tested as pure functions on arbitrary input (and, where
//! they read from a stream, on arbitrary splits of it): they must never panic, never allocate
//! beyond their limit, and never hang. The default case count is kept modest so that
//! `cargo test` stays fast; set `PROPTEST_CASES` to run more.

use crate::collective::{CollectiveKind, Fingerprint};
use crate::dtype::DataType;
use crate::reduce_op::ReduceOp;
use proptest::prelude::*;
use proptest::sample::Index;
use std::io::{self, Read};

/// Cases per property when `PROPTEST_CASES` is not set.
pub(crate) const DEFAULT_CASES: u32 = 64;

/// [`DEFAULT_CASES`] cases, or `PROPTEST_CASES`; failures are not persisted to files.
pub(crate) fn config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = DEFAULT_CASES;
    }
    c.failure_persistence = None;
    c
}

/// Any valid fingerprint: every kind (1..=10), type (1..=7) and op (none, 1..=5).
pub(crate) fn fingerprint() -> impl Strategy<Value = Fingerprint> {
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

/// `valid` (bytes a decoder accepts) as is, with a few bytes flipped, or (one case in eight)
/// replaced by random bytes of the same length. Random bytes alone almost never get past a
/// magic number or a type tag, so a property fed only those would test the first check and
/// nothing behind it; these reach every check, and the code after them.
pub(crate) fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len();
    prop_oneof![
        7 => proptest::collection::vec((any::<Index>(), 1u8..=255), 0..=3).prop_map(
            move |flips| {
                let mut b = valid.clone();
                if !b.is_empty() {
                    for (at, xor) in flips {
                        b[at.index(len)] ^= xor;
                    }
                }
                b
            }
        ),
        1 => proptest::collection::vec(any::<u8>(), len..=len),
    ]
}

/// A reader that hands out `data` in pieces of the given sizes (cycling; a 0 is read as 1),
/// the way a socket may, and counts what it gave.
#[derive(Debug)]
pub(crate) struct Chunked {
    data: Vec<u8>,
    splits: Vec<usize>,
    pos: usize,
    next: usize,
}

impl Chunked {
    pub(crate) fn new(data: Vec<u8>, splits: Vec<usize>) -> Chunked {
        Chunked {
            data,
            splits,
            pos: 0,
            next: 0,
        }
    }

    /// Bytes handed out so far.
    pub(crate) fn consumed(&self) -> usize {
        self.pos
    }
}

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let piece = match self.splits.get(self.next % self.splits.len().max(1)) {
            Some(&n) => n.max(1),
            None => usize::MAX,
        };
        self.next += 1;
        let n = piece.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
