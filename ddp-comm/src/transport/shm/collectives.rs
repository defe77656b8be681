//! The collectives of one host's ranks, as sequences of steps over their staging buffers.
//!
//! Buffers larger than a staging buffer stream through it: step `s` handles the `s`-th chunk.
//! Every collective takes at least one step, so even an empty one checks fingerprints.

use super::group::ShmGroup;
use crate::collective::Fingerprint;
use crate::collective::schedule::segments;
use crate::error::Result;
use crate::reduce_op::{ReduceOp, avg_prescales, combine_bytes, divide_bytes, prescale_bytes};
use crate::transport::Parts;
use crate::transport::aligned::{aligned_bytes, aligned_copy};
use std::ops::Range;
use std::time::Instant;

/// The `s`-th of the pieces of `per` units that cover `total` units.
fn piece(s: usize, per: usize, total: usize) -> Range<usize> {
    (s * per).min(total)..((s + 1) * per).min(total)
}

/// Number of steps for `total` units at `per` per step (at least one).
fn steps(total: usize, per: usize) -> usize {
    total.div_ceil(per).max(1)
}

impl ShmGroup {
    /// Elements of `esize` bytes that fit a staging buffer split `parts` ways.
    fn per_part(&self, esize: usize, parts: usize) -> usize {
        (self.chunk() / parts / esize).max(1)
    }

    /// How reduce-scatter, scatter and all-to-all stream blocks of `m` bytes (whole elements of
    /// `esize` bytes) through the staging buffers, each split into one part per slot: the bytes
    /// of a part, and the byte range of every block that each step handles.
    fn block_steps(
        &self,
        esize: usize,
        m: usize,
    ) -> (usize, impl Iterator<Item = Range<usize>> + use<>) {
        let per = self.per_part(esize, self.n());
        let total = m / esize;
        let ranges = (0..steps(total, per)).map(move |s| {
            let els = piece(s, per, total);
            els.start * esize..els.end * esize
        });
        (per * esize, ranges)
    }

    /// Begins a step and posts `range` of `buf` (this rank's input for it) in its staging
    /// buffer, gathered straight from the pieces; scaled there when `avg` (the ranks of an
    /// `Avg`) asks for the prologue, so the caller's `buf` is not touched.
    fn post_parts(
        &mut self,
        fp: &Fingerprint,
        deadline: Instant,
        buf: &Parts<'_, '_>,
        range: Range<usize>,
        avg: Option<usize>,
    ) -> Result<u64> {
        let k = self.begin(fp, deadline)?;
        let base = self.buf(self.me, k);
        let len = range.len();
        buf.for_each(range, |off, piece| self.seg.write(base + off, piece));
        if let Some(n) = avg {
            self.seg.prescale(base, len, fp.dtype, n);
        }
        self.post(k, fp);
        Ok(k)
    }

    /// Reduces `buf` over the host's ranks: reduce-scatter then all-gather through the staging
    /// buffers. Each step, every rank posts its chunk, reduces its own slice of the chunk in
    /// place in its staging buffer reading the peers' buffers directly, and then copies every
    /// reduced slice out. Steps are pipelined: a rank posts the next chunk before it waits for
    /// the peers' slices of the current one. `to`: `None` gives every rank the result
    /// (all-reduce); `Some(r)` gives it to slot `r` only and leaves the others' `buf`
    /// unchanged (reduce). `avg` is `Some(ranks)` for an `Avg` over `ranks` ranks: each rank's
    /// input is scaled as it is posted (the prologue, f16 and bf16) and each slice divided once,
    /// by the rank that reduced it (the epilogue, every other type). Every slice is combined in rank order (slot 0's values, then
    /// slot 1's, ...), whichever rank reduces it, so an element's result does not depend on
    /// where it sits in the buffer: DDP's sums are the same bit for bit whatever its bucket
    /// layout.
    pub(crate) fn reduce_to(
        &mut self,
        fp: &Fingerprint,
        buf: &mut [u8],
        op: ReduceOp,
        avg: Option<usize>,
        to: Option<usize>,
    ) -> Result<()> {
        let mut one = [buf];
        self.reduce_parts_to(fp, &mut Parts::new(&mut one), op, avg, to)
    }

    /// [`ShmGroup::reduce_to`] on a buffer in pieces: they are gathered into the staging
    /// buffers and the result is scattered back, with no flat copy in between.
    pub(crate) fn reduce_parts_to(
        &mut self,
        fp: &Fingerprint,
        buf: &mut Parts<'_, '_>,
        op: ReduceOp,
        avg: Option<usize>,
        to: Option<usize>,
    ) -> Result<()> {
        let deadline = self.deadline();
        let (n, me, e) = (self.n(), self.me, fp.dtype.size_bytes());
        let total = buf.len() / e;
        let per = self.per_part(e, 1);
        let combine = op.combine_op();
        let bytes = |s: usize| {
            let els = piece(s, per, total);
            els.start * e..els.end * e
        };
        let count = steps(total, per);
        let mut next = self.post_parts(fp, deadline, buf, bytes(0), avg)?;
        for s in 0..count {
            let k = next;
            let chunk = bytes(s);
            self.wait_posted(k, fp, deadline)?;
            let parts: Vec<Range<usize>> = segments(chunk.len() / e, n)
                .into_iter()
                .map(|p| p.start * e..p.end * e)
                .collect();
            let own = parts[me].clone();
            let mine = self.buf(me, k);
            if !own.is_empty() {
                if me == 0 {
                    for q in 1..n {
                        let src = self.buf(q, k) + own.start;
                        self.seg.combine_within(
                            mine + own.start,
                            src,
                            own.len(),
                            fp.dtype,
                            combine,
                        );
                    }
                } else {
                    // In rank order, as slot 0 does, so a sum never depends on which rank
                    // reduces it (and so on how a bucket is cut into slices).
                    let sources: Vec<usize> = (0..n).map(|q| self.buf(q, k) + own.start).collect();
                    // Word-backed, so typed views of it are aligned for every dtype.
                    let mut words = std::mem::take(&mut self.scratch);
                    let acc = aligned_bytes(&mut words, own.len());
                    self.seg.read(sources[0], acc);
                    for &src in &sources[1..] {
                        self.seg.combine_into(src, acc, fp.dtype, combine);
                    }
                    self.seg.write(mine + own.start, acc);
                    self.scratch = words;
                }
                if let Some(d) = avg {
                    self.seg.divide(mine + own.start, own.len(), fp.dtype, d);
                }
            }
            self.mark_reduced(k);
            if s + 1 < count {
                next = self.post_parts(fp, deadline, buf, bytes(s + 1), avg)?;
            }
            if to.is_none_or(|r| r == me) {
                self.wait_reduced(k, fp, deadline)?;
                for (q, part) in parts.iter().enumerate() {
                    let src = self.buf(q, k) + part.start;
                    let within = chunk.start + part.start..chunk.start + part.end;
                    buf.for_each_mut(within, |off, dst| self.seg.read(src + off, dst));
                }
            }
            self.finish(k);
        }
        Ok(())
    }

    /// Copies slot `root`'s `buf` into every other rank's `buf`.
    pub(crate) fn broadcast(
        &mut self,
        fp: &Fingerprint,
        buf: &mut [u8],
        root: usize,
    ) -> Result<()> {
        let deadline = self.deadline();
        let me = self.me;
        let per = self.chunk();
        for s in 0..steps(buf.len(), per) {
            let r = piece(s, per, buf.len());
            let k = self.begin(fp, deadline)?;
            if me == root {
                self.seg.write(self.buf(me, k), &buf[r.clone()]);
            }
            self.post(k, fp);
            self.wait_posted(k, fp, deadline)?;
            if me != root {
                self.seg.read(self.buf(root, k), &mut buf[r]);
            }
            self.finish(k);
        }
        Ok(())
    }

    /// Every rank's `input` into `output` (block `q` from slot `q`); on slot `root` only when
    /// `root` is `Some` (gather), on every rank otherwise (all-gather).
    pub(crate) fn gather_to(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        mut output: Option<&mut [u8]>,
        root: Option<usize>,
    ) -> Result<()> {
        let deadline = self.deadline();
        let (n, me, m) = (self.n(), self.me, input.len());
        let per = self.chunk();
        let reads = root.is_none_or(|r| r == me);
        for s in 0..steps(m, per) {
            let r = piece(s, per, m);
            let k = self.begin(fp, deadline)?;
            self.seg.write(self.buf(me, k), &input[r.clone()]);
            self.post(k, fp);
            self.wait_posted(k, fp, deadline)?;
            if let Some(out) = output.as_deref_mut().filter(|_| reads) {
                for q in 0..n {
                    let dst = &mut out[q * m + r.start..q * m + r.end];
                    if q == me {
                        dst.copy_from_slice(&input[r.clone()]);
                    } else {
                        self.seg.read(self.buf(q, k), dst);
                    }
                }
            }
            self.finish(k);
        }
        Ok(())
    }

    /// Reduces `input` (`n` blocks of `output.len()` bytes) so that slot `q` gets block `q`.
    /// Each step every rank posts its part of every block but its own; each rank reduces its
    /// own block straight into `output`. `avg` as in [`ShmGroup::reduce_to`].
    pub(crate) fn reduce_scatter(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: &mut [u8],
        op: ReduceOp,
        avg: Option<usize>,
    ) -> Result<()> {
        let deadline = self.deadline();
        let (n, me, e) = (self.n(), self.me, fp.dtype.size_bytes());
        let m = output.len();
        let (sub, step_ranges) = self.block_steps(e, m);
        let combine = op.combine_op();
        // This rank's own block, scaled for the `Avg` prologue (a copy: `input` is the
        // caller's), or `None` to read it straight from `input`.
        let prescale = avg.filter(|_| avg_prescales(fp.dtype));
        let mut own_scaled = Vec::new();
        for r in step_ranges {
            let k = self.post_blocks(fp, input, &r, sub, avg, deadline)?;
            let out = &mut output[r.clone()];
            let own_input = &input[me * m + r.start..me * m + r.end];
            let own: &[u8] = match prescale {
                Some(ranks) => {
                    let copy = aligned_copy(&mut own_scaled, own_input);
                    prescale_bytes(fp.dtype, copy, ranks);
                    copy
                }
                None => own_input,
            };
            // In rank order whatever block this rank owns, as in `reduce_parts_to`.
            if me == 0 {
                out.copy_from_slice(own);
            } else {
                self.seg.read(self.buf(0, k) + me * sub, out);
            }
            for q in 1..n {
                if q == me {
                    combine_bytes(fp.dtype, combine, out, own);
                } else {
                    self.seg
                        .combine_into(self.buf(q, k) + me * sub, out, fp.dtype, combine);
                }
            }
            if let Some(d) = avg {
                divide_bytes(fp.dtype, out, d);
            }
            self.finish(k);
        }
        Ok(())
    }

    /// Splits slot `root`'s `input` (`n` blocks of `output.len()` bytes): slot `q` gets block
    /// `q`. `input` is `Some` on `root` only.
    pub(crate) fn scatter(
        &mut self,
        fp: &Fingerprint,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()> {
        let deadline = self.deadline();
        let (n, me, e) = (self.n(), self.me, fp.dtype.size_bytes());
        let m = output.len();
        let (sub, step_ranges) = self.block_steps(e, m);
        for r in step_ranges {
            let k = self.begin(fp, deadline)?;
            if let Some(inp) = input.filter(|_| me == root) {
                for q in (0..n).filter(|&q| q != me) {
                    self.seg.write(
                        self.buf(me, k) + q * sub,
                        &inp[q * m + r.start..q * m + r.end],
                    );
                }
                output[r.clone()].copy_from_slice(&inp[me * m + r.start..me * m + r.end]);
            }
            self.post(k, fp);
            self.wait_posted(k, fp, deadline)?;
            if me != root {
                self.seg.read(self.buf(root, k) + me * sub, &mut output[r]);
            }
            self.finish(k);
        }
        Ok(())
    }

    /// Exchanges blocks between every pair of slots: `input` and `output` hold `n` blocks of
    /// `output.len() / n` bytes, and slot `q`'s block `me` lands in this rank's block `q`. Each
    /// step every rank posts its part of every block but its own, each in the part of its
    /// staging buffer set aside for the slot it goes to (as scatter does), and copies the part
    /// set aside for it straight out of every peer's staging buffer; its own block is a local
    /// copy.
    pub(crate) fn all_to_all(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<()> {
        let deadline = self.deadline();
        let (n, me, e) = (self.n(), self.me, fp.dtype.size_bytes());
        let m = output.len() / n;
        let (sub, step_ranges) = self.block_steps(e, m);
        output[me * m..(me + 1) * m].copy_from_slice(&input[me * m..(me + 1) * m]);
        for r in step_ranges {
            let k = self.post_blocks(fp, input, &r, sub, None, deadline)?;
            for q in (0..n).filter(|&q| q != me) {
                self.seg.read(
                    self.buf(q, k) + me * sub,
                    &mut output[q * m + r.start..q * m + r.end],
                );
            }
            self.finish(k);
        }
        Ok(())
    }

    /// One step of reduce-scatter and all-to-all: writes bytes `r` of every peer's block of
    /// `input` (`n` equal blocks) into this rank's next staging buffer, block `q` in the part
    /// set aside for slot `q` (`sub` bytes each), and waits until every rank has posted its
    /// own. `avg` as in [`ShmGroup::reduce_to`]: the blocks are scaled in the staging buffer
    /// (reduce-scatter's `Avg` prologue), leaving `input` alone. Returns the staging buffer's
    /// index, for reading the parts set aside for this rank and then [`finish`](Self::finish).
    fn post_blocks(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        r: &Range<usize>,
        sub: usize,
        avg: Option<usize>,
        deadline: Instant,
    ) -> Result<u64> {
        let (n, me) = (self.n(), self.me);
        let m = input.len() / n;
        let k = self.begin(fp, deadline)?;
        let mine = self.buf(me, k);
        for q in (0..n).filter(|&q| q != me) {
            self.seg
                .write(mine + q * sub, &input[q * m + r.start..q * m + r.end]);
            if let Some(d) = avg {
                self.seg.prescale(mine + q * sub, r.len(), fp.dtype, d);
            }
        }
        self.post(k, fp);
        self.wait_posted(k, fp, deadline)?;
        Ok(k)
    }

    /// Returns once every rank of the host has arrived (with the same fingerprint).
    pub(crate) fn barrier(&mut self, fp: &Fingerprint) -> Result<()> {
        let deadline = self.deadline();
        let k = self.begin(fp, deadline)?;
        self.post(k, fp);
        self.wait_posted(k, fp, deadline)?;
        self.finish(k);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_everything_in_at_least_one_step() {
        assert_eq!(steps(0, 4), 1);
        assert_eq!(piece(0, 4, 0), 0..0);
        assert_eq!(steps(9, 4), 3);
        assert_eq!(
            (0..3).map(|s| piece(s, 4, 9)).collect::<Vec<_>>(),
            vec![0..4, 4..8, 8..9]
        );
    }
}
