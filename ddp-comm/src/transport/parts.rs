//! A buffer in several pieces, seen as their concatenation.
//!
//! Coalesced collectives ([`crate::ProcessGroup::all_reduce_coalesced`]) reduce many buffers as
//! one: the shared-memory transport gathers the pieces straight into its staging buffers and
//! scatters the result straight back, so a caller with many gradients never packs them into one
//! flat buffer of its own (a copy in and a copy out saved per step). Transports without such a
//! path flatten, reduce and split ([`Parts::through_flat`]).

use std::ops::Range;

/// Byte pieces addressed by offsets into their concatenation.
pub(crate) struct Parts<'a, 'b> {
    parts: &'a mut [&'b mut [u8]],
    /// Offset of each piece in the concatenation.
    starts: Vec<usize>,
    len: usize,
}

impl<'a, 'b> Parts<'a, 'b> {
    pub(crate) fn new(parts: &'a mut [&'b mut [u8]]) -> Self {
        let mut starts = Vec::with_capacity(parts.len());
        let mut len = 0;
        for p in parts.iter() {
            starts.push(len);
            len += p.len();
        }
        Parts { parts, starts, len }
    }

    /// Total bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The pieces covering `range` of the concatenation, as (index, range within the piece,
    /// offset of that sub-range relative to `range.start`).
    fn pieces(&self, range: Range<usize>) -> Vec<(usize, Range<usize>, usize)> {
        assert!(range.end <= self.len, "range past the end of the parts");
        let mut out = Vec::new();
        if range.is_empty() {
            return out;
        }
        // The last piece starting at or before `range.start` (skipping empty pieces).
        let mut i = self.starts.partition_point(|&s| s <= range.start) - 1;
        let mut at = range.start;
        while at < range.end {
            let (start, len) = (self.starts[i], self.parts[i].len());
            let end = (start + len).min(range.end);
            if end > at {
                out.push((i, at - start..end - start, at - range.start));
                at = end;
            }
            i += 1;
        }
        out
    }

    /// Calls `f(offset, bytes)` for each piece of `range`, in order; `offset` counts from
    /// `range.start`.
    pub(crate) fn for_each(&self, range: Range<usize>, mut f: impl FnMut(usize, &[u8])) {
        for (i, r, off) in self.pieces(range) {
            f(off, &self.parts[i][r]);
        }
    }

    /// Like [`Parts::for_each`], with the pieces writable.
    pub(crate) fn for_each_mut(
        &mut self,
        range: Range<usize>,
        mut f: impl FnMut(usize, &mut [u8]),
    ) {
        for (i, r, off) in self.pieces(range) {
            f(off, &mut self.parts[i][r]);
        }
    }

    /// Runs `f` on a flat, 8-byte aligned copy of the concatenation (so typed views of it are
    /// aligned for every element type), then copies the result back into the pieces.
    pub(crate) fn through_flat<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut words = Vec::new();
        let flat = super::aligned::aligned_bytes(&mut words, self.len);
        let len = self.len;
        self.for_each(0..len, |off, piece| {
            flat[off..off + piece.len()].copy_from_slice(piece)
        });
        let result = f(flat);
        self.for_each_mut(0..len, |off, dst| {
            dst.copy_from_slice(&flat[off..off + dst.len()])
        });
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cross_piece_boundaries_and_skip_empty_pieces() {
        let (mut a, mut b, mut c, mut d) = (vec![0u8, 1, 2], vec![], vec![3u8, 4], vec![5u8]);
        let mut pieces = [&mut a[..], &mut b[..], &mut c[..], &mut d[..]];
        let mut parts = Parts::new(&mut pieces);
        assert_eq!(parts.len(), 6);
        let flat = |parts: &mut Parts| parts.through_flat(|f| f.to_vec());
        assert_eq!(flat(&mut parts), vec![0, 1, 2, 3, 4, 5]);
        let mut seen = Vec::new();
        parts.for_each(2..6, |off, bytes| seen.push((off, bytes.to_vec())));
        assert_eq!(seen, vec![(0, vec![2]), (1, vec![3, 4]), (3, vec![5])]);
        parts.for_each_mut(1..4, |_, bytes| bytes.iter_mut().for_each(|x| *x += 10));
        assert_eq!(flat(&mut parts), vec![0, 11, 12, 13, 4, 5]);
        let aligned = parts.through_flat(|f| {
            f.copy_from_slice(&[9, 8, 7, 6, 5, 4]);
            f.as_ptr() as usize % 8
        });
        assert_eq!(aligned, 0);
        assert_eq!(flat(&mut parts), vec![9, 8, 7, 6, 5, 4]);
        let mut none = Vec::new();
        parts.for_each(3..3, |off, _| none.push(off));
        assert!(none.is_empty());
    }
}
