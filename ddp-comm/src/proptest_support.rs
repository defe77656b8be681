//! Shared setup of the crate's property tests.
//!
//! Decoders of untrusted bytes are tested as pure functions on arbitrary input (and, where
//! they read from a stream, on arbitrary splits of it): they must never panic, never allocate
//! beyond their limit, and never hang. The default case count is kept modest so that
//! `cargo test` stays fast; set `PROPTEST_CASES` to run more.

use proptest::prelude::ProptestConfig;
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
