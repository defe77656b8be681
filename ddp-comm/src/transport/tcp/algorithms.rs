//! Collectives over the TCP mesh.
//!
//! - all-reduce: ring reduce-scatter then ring all-gather, `2(n-1)` steps of `1/n` of the buffer,
//!   each step sending right while receiving (and reducing, through a small scratch buffer) from
//!   the left. Every element is reduced by exactly one rank and copied to the others, so all ranks
//!   end bitwise identical.
//! - broadcast: a pipelined chain from the root; each link forwards bytes as they arrive.
//! - reduce: ring reduce-scatter, then every rank sends its reduced segment to the root.
//! - gather / scatter: direct transfers to / from the root.
//! - all-to-all: the pairwise exchange (`schedule::pairwise_step`), `n - 1` steps each sending
//!   one block to one peer while receiving one from another, over connections to every peer.
//! - barrier: a one-byte all-reduce.

use super::duplex::{Conn, Ctx, Exchange, Relay, Sink, run_step};
use super::mesh::{Mesh, MeshSpec};
use crate::collective::Fingerprint;
use crate::collective::schedule::{all_gather_step, pairwise_step, reduce_scatter_step, segments};
use crate::deadline::deadline_after;
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use crate::transport::aligned::aligned_copy;
use crate::transport::{AbortHandle, Transport};
use std::net::Shutdown;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Bytes of the scratch buffer that received data is reduced from: small enough to stay in cache.
const SCRATCH_BYTES: usize = 256 << 10;

/// A group's TCP connections and the state of its point-to-point sequences.
#[derive(Debug)]
pub(crate) struct TcpTransport {
    group_rank: usize,
    ranks: Vec<usize>,
    mesh: Mesh,
    send_seq: Vec<u64>,
    recv_seq: Vec<u64>,
    timeout: Duration,
    /// 8-byte aligned, so every element type can be reduced from it.
    scratch: Vec<u64>,
}

impl TcpTransport {
    pub(crate) fn connect(spec: &MeshSpec<'_>) -> Result<TcpTransport> {
        let mesh = Mesh::start(spec)?;
        let n = spec.ranks.len();
        Ok(TcpTransport {
            group_rank: spec.group_rank,
            ranks: spec.ranks.to_vec(),
            mesh,
            send_seq: vec![0; n],
            recv_seq: vec![0; n],
            timeout: spec.timeout,
            scratch: vec![0; SCRATCH_BYTES / 8],
        })
    }

    fn n(&self) -> usize {
        self.ranks.len()
    }

    /// The context of a collective that starts now: its deadline is one timeout away.
    fn ctx<'a>(&self, fp: &'a Fingerprint) -> Ctx<'a> {
        self.ctx_until(fp, deadline_after(self.timeout))
    }

    /// The context of a collective whose deadline is already running (it connected its peers
    /// first, within the same timeout).
    fn ctx_until<'a>(&self, fp: &'a Fingerprint, deadline: Instant) -> Ctx<'a> {
        Ctx {
            fp,
            my_rank: self.ranks[self.group_rank],
            deadline,
            timeout: self.timeout,
        }
    }

    fn conn(&self, group_rank: usize) -> &Conn {
        self.mesh.conn(group_rank)
    }

    /// Starts a collective rooted at `root`: connects, if not yet done, the ranks it talks to
    /// directly (every other rank on the root, the root elsewhere; nobody when alone) and
    /// returns its context, whose deadline is one timeout from now.
    fn start_rooted<'a>(&mut self, fp: &'a Fingerprint, root: usize, op: &str) -> Result<Ctx<'a>> {
        let deadline = deadline_after(self.timeout);
        if self.n() > 1 {
            if self.group_rank == root {
                let others: Vec<usize> = (0..self.n()).filter(|&p| p != root).collect();
                self.mesh.ensure(&others, op, deadline)?;
            } else {
                self.mesh.ensure(&[root], op, deadline)?;
            }
        }
        Ok(self.ctx_until(fp, deadline))
    }

    /// Starts a point-to-point message `seq` with `peer`: connects it if need be and returns
    /// the fingerprint the message travels under (its pair's sequence number, not the
    /// collective one) and the deadline already running.
    fn start_p2p(
        &mut self,
        fp: &Fingerprint,
        peer: usize,
        seq: u64,
        op: &str,
    ) -> Result<(Fingerprint, Instant)> {
        let deadline = deadline_after(self.timeout);
        self.mesh.ensure(&[peer], op, deadline)?;
        Ok((Fingerprint { seq, ..*fp }, deadline))
    }

    /// One step that only sends `bytes` to `peer`.
    fn send_to(&self, ctx: &Ctx<'_>, peer: usize, bytes: &[u8]) -> Result<()> {
        let mut step = Exchange::new(bytes, Sink::None);
        run_step(ctx, Some(self.conn(peer)), None, &mut step)
    }

    /// One step that only receives `into.len()` bytes from `peer`.
    fn recv_from(&self, ctx: &Ctx<'_>, peer: usize, into: &mut [u8]) -> Result<()> {
        let mut step = Exchange::new(&[], Sink::copy(into));
        run_step(ctx, None, Some(self.conn(peer)), &mut step)
    }

    fn right(&self) -> usize {
        (self.group_rank + 1) % self.n()
    }

    fn left(&self) -> usize {
        (self.group_rank + self.n() - 1) % self.n()
    }

    /// Ring reduce-scatter in place over `buf` split into `segs`; afterwards this rank owns the
    /// fully reduced segment `(rank + shift) mod n`.
    fn ring_reduce_scatter(
        &mut self,
        ctx: &Ctx<'_>,
        buf: &mut [u8],
        segs: &[Range<usize>],
        shift: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.n(), self.group_rank);
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = (|| {
            for step in 0..n - 1 {
                let (send, recv) = reduce_scatter_step(r, n, shift, step);
                let (tx, rx) = disjoint(buf, &segs[send], &segs[recv]);
                let sink = Sink::reduce(
                    rx,
                    bytemuck::cast_slice_mut(&mut scratch),
                    ctx.fp.dtype,
                    op.combine_op(),
                );
                run_step(
                    ctx,
                    Some(self.conn(self.right())),
                    Some(self.conn(self.left())),
                    &mut Exchange::new(tx, sink),
                )?;
            }
            Ok(())
        })();
        self.scratch = scratch;
        result
    }

    /// Ring all-gather in place; this rank starts owning segment `(rank + shift) mod n`.
    fn ring_all_gather(
        &self,
        ctx: &Ctx<'_>,
        buf: &mut [u8],
        segs: &[Range<usize>],
        shift: usize,
    ) -> Result<()> {
        let (n, r) = (self.n(), self.group_rank);
        for step in 0..n - 1 {
            let (send, recv) = all_gather_step(r, n, shift, step);
            let (tx, rx) = disjoint(buf, &segs[send], &segs[recv]);
            run_step(
                ctx,
                Some(self.conn(self.right())),
                Some(self.conn(self.left())),
                &mut Exchange::new(tx, Sink::copy(rx)),
            )?;
        }
        Ok(())
    }

    fn byte_segments(&self, fp: &Fingerprint, elements: usize) -> Vec<Range<usize>> {
        let e = fp.dtype.size_bytes();
        segments(elements, self.n())
            .into_iter()
            .map(|s| s.start * e..s.end * e)
            .collect()
    }

    fn blocks(&self, block_bytes: usize) -> Vec<Range<usize>> {
        (0..self.n())
            .map(|i| i * block_bytes..(i + 1) * block_bytes)
            .collect()
    }
}

/// Two non-overlapping ranges of one buffer, the first shared and the second mutable.
fn disjoint<'a>(buf: &'a mut [u8], a: &Range<usize>, b: &Range<usize>) -> (&'a [u8], &'a mut [u8]) {
    assert!(
        a.end <= b.start || b.end <= a.start,
        "ring segments overlap: {a:?} and {b:?}"
    );
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a.clone()], &mut hi[..b.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b.clone()])
    }
}

impl Transport for TcpTransport {
    fn all_reduce(&mut self, fp: &Fingerprint, buf: &mut [u8], op: ReduceOp) -> Result<()> {
        let n = self.n();
        if n == 1 {
            return Ok(());
        }
        let ctx = self.ctx(fp);
        let segs = self.byte_segments(fp, fp.count as usize);
        op.prescale_if_avg(n, fp.dtype, buf);
        self.ring_reduce_scatter(&ctx, buf, &segs, 1, op)?;
        let own = segs[(self.group_rank + 1) % n].clone();
        op.divide_if_avg(n, fp.dtype, &mut buf[own]);
        self.ring_all_gather(&ctx, buf, &segs, 1)
    }

    fn broadcast(&mut self, fp: &Fingerprint, buf: &mut [u8], root: usize) -> Result<()> {
        let n = self.n();
        if n == 1 {
            return Ok(());
        }
        let ctx = self.ctx(fp);
        // Chain order: root, root+1, ..., root+n-1 (mod n).
        let pos = (self.group_rank + n - root) % n;
        let prev = (pos > 0).then(|| self.conn((self.group_rank + n - 1) % n));
        let next = (pos + 1 < n).then(|| self.conn((self.group_rank + 1) % n));
        let mut relay = Relay::new(buf, prev.is_some(), next.is_some());
        run_step(&ctx, next, prev, &mut relay)
    }

    fn all_gather(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()> {
        let blocks = self.blocks(input.len());
        output[blocks[self.group_rank].clone()].copy_from_slice(input);
        if self.n() == 1 {
            return Ok(());
        }
        let ctx = self.ctx(fp);
        self.ring_all_gather(&ctx, output, &blocks, 0)
    }

    fn reduce_scatter(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: &mut [u8],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.n();
        let blocks = self.blocks(output.len());
        let own = blocks[self.group_rank].clone();
        if n > 1 {
            let ctx = self.ctx(fp);
            let mut work = Vec::new();
            let work_bytes = aligned_copy(&mut work, input);
            op.prescale_if_avg(n, fp.dtype, work_bytes);
            self.ring_reduce_scatter(&ctx, work_bytes, &blocks, 0, op)?;
            output.copy_from_slice(&work_bytes[own]);
        } else {
            output.copy_from_slice(&input[own]);
        }
        op.divide_if_avg(n, fp.dtype, output);
        Ok(())
    }

    fn reduce(
        &mut self,
        fp: &Fingerprint,
        buf: &mut [u8],
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.n();
        if n == 1 {
            return Ok(());
        }
        let ctx = self.start_rooted(fp, root, "reduce")?;
        let segs = self.byte_segments(fp, fp.count as usize);
        let me = self.group_rank;
        let own = segs[(me + 1) % n].clone();
        if me == root {
            op.prescale_if_avg(n, fp.dtype, buf);
            self.ring_reduce_scatter(&ctx, buf, &segs, 1, op)?;
            for peer in (0..n).filter(|&p| p != me) {
                let seg = segs[(peer + 1) % n].clone();
                self.recv_from(&ctx, peer, &mut buf[seg])?;
            }
            op.divide_if_avg(n, fp.dtype, buf);
        } else {
            // Work on a copy: PyTorch leaves non-root buffers unchanged.
            let mut work = Vec::new();
            let work_bytes = aligned_copy(&mut work, buf);
            op.prescale_if_avg(n, fp.dtype, work_bytes);
            self.ring_reduce_scatter(&ctx, work_bytes, &segs, 1, op)?;
            self.send_to(&ctx, root, &work_bytes[own])?;
        }
        Ok(())
    }

    fn gather(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: Option<&mut [u8]>,
        root: usize,
    ) -> Result<()> {
        let me = self.group_rank;
        let ctx = self.start_rooted(fp, root, "gather")?;
        match output {
            Some(out) => {
                let blocks = self.blocks(input.len());
                out[blocks[me].clone()].copy_from_slice(input);
                for peer in (0..self.n()).filter(|&p| p != me) {
                    self.recv_from(&ctx, peer, &mut out[blocks[peer].clone()])?;
                }
                Ok(())
            }
            None => self.send_to(&ctx, root, input),
        }
    }

    fn scatter(
        &mut self,
        fp: &Fingerprint,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()> {
        let me = self.group_rank;
        let ctx = self.start_rooted(fp, root, "scatter")?;
        match input {
            Some(inp) => {
                let blocks = self.blocks(output.len());
                for peer in (0..self.n()).filter(|&p| p != me) {
                    self.send_to(&ctx, peer, &inp[blocks[peer].clone()])?;
                }
                output.copy_from_slice(&inp[blocks[me].clone()]);
                Ok(())
            }
            None => self.recv_from(&ctx, root, output),
        }
    }

    fn all_to_all(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()> {
        let (n, me) = (self.n(), self.group_rank);
        let blocks = self.blocks(input.len() / n);
        output[blocks[me].clone()].copy_from_slice(&input[blocks[me].clone()]);
        if n == 1 {
            return Ok(());
        }
        let others: Vec<usize> = (0..n).filter(|&p| p != me).collect();
        let deadline = deadline_after(self.timeout);
        self.mesh.ensure(&others, "all_to_all", deadline)?;
        let ctx = self.ctx_until(fp, deadline);
        for step in 1..n {
            let (to, from) = pairwise_step(me, n, step);
            let rx = Sink::copy(&mut output[blocks[from].clone()]);
            run_step(
                &ctx,
                Some(self.conn(to)),
                Some(self.conn(from)),
                &mut Exchange::new(&input[blocks[to].clone()], rx),
            )?;
        }
        Ok(())
    }

    fn barrier(&mut self, fp: &Fingerprint) -> Result<()> {
        let mut token = [0u8; 1];
        self.all_reduce(fp, &mut token, ReduceOp::Sum)
    }

    fn send(&mut self, fp: &Fingerprint, buf: &[u8], dst: usize) -> Result<()> {
        let (fp, deadline) = self.start_p2p(fp, dst, self.send_seq[dst], "send")?;
        let ctx = self.ctx_until(&fp, deadline);
        self.send_to(&ctx, dst, buf)?;
        self.send_seq[dst] += 1;
        Ok(())
    }

    fn recv(&mut self, fp: &Fingerprint, buf: &mut [u8], src: usize) -> Result<()> {
        let (fp, deadline) = self.start_p2p(fp, src, self.recv_seq[src], "recv")?;
        let ctx = self.ctx_until(&fp, deadline);
        debug_assert_eq!(buf.len(), fp.count as usize * fp.dtype.size_bytes());
        self.recv_from(&ctx, src, buf)?;
        self.recv_seq[src] += 1;
        Ok(())
    }

    fn abort(&mut self) {
        for c in self.mesh.conns() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.mesh.live().abort();
    }

    fn abort_handle(&self) -> Result<AbortHandle> {
        Ok(AbortHandle::from_live(self.mesh.live()))
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.abort();
    }
}
