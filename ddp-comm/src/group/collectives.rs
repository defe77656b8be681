//! The typed collectives of [`ProcessGroup`], blocking and asynchronous.
//!
//! Blocking calls borrow the caller's buffers and return when the collective is done on this
//! rank. `*_async` calls take ownership of a `Vec`, return a [`Work`] at once, and hand the
//! buffer back from [`Work::wait`]. Both kinds share one queue, so they run in issue order.
//!
//! Validation errors (a wrong buffer length, a root out of range) are reported like any other
//! failure: this rank returns the error, tells its peers through the store, and closes its
//! connections, so the peers fail at once with this rank's message instead of waiting.

use super::process_group::ProcessGroup;
use crate::collective::{CollectiveKind, Fingerprint};
use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;
use crate::transport::{Parts, Transport};
use crate::work::Work;

/// `check`, after telling the transport of a failed one ([`Transport::refuse`]).
fn refused(t: &mut dyn Transport, fp: &Fingerprint, check: Result<()>) -> Result<()> {
    if check.is_err() {
        t.refuse(fp);
    }
    check
}

fn bytes<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn bytes_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(v)
}

impl ProcessGroup {
    pub(super) fn check_rank(&self, op: &'static str, what: &str, rank: usize) -> Result<()> {
        if rank >= self.world_size() {
            return Err(CommError::arg(
                op,
                format!(
                    "{what} {rank} is outside 0..{} (ranks are ranks in this group)",
                    self.world_size()
                ),
            ));
        }
        Ok(())
    }

    fn check_len(&self, op: &'static str, what: &str, got: usize, expected: usize) -> Result<()> {
        if got != expected {
            return Err(CommError::arg(
                op,
                format!(
                    "{what} has {got} elements, expected {expected} (world size {})",
                    self.world_size()
                ),
            ));
        }
        Ok(())
    }

    /// The root and the buffer only the root passes (gather's output, scatter's input): `root`
    /// in range, and `len` (the buffer's length, `None` without one) `Some(expected)` on `root`
    /// and `None` elsewhere.
    fn check_root_buffer(
        &self,
        op: &'static str,
        what: &str,
        root: usize,
        len: Option<usize>,
        expected: usize,
    ) -> Result<()> {
        self.check_rank(op, "root", root)?;
        match (len, self.rank() == root) {
            (Some(len), true) => self.check_len(op, what, len, expected),
            (None, false) => Ok(()),
            (None, true) => Err(CommError::arg(
                op,
                format!("the root must pass an {what} buffer"),
            )),
            (Some(_), false) => Err(CommError::arg(
                op,
                format!("only the root ({root}) passes an {what} buffer"),
            )),
        }
    }

    /// The fingerprint and length check of the collectives that move one block per rank
    /// (all-gather, reduce-scatter): `block` elements per rank, and the buffer holding every
    /// rank's block (`whole`, its length `whole_len`: all-gather's output, reduce-scatter's input)
    /// `world_size() * block` long.
    fn blocks_call<T: Element>(
        &self,
        kind: CollectiveKind,
        whole: &str,
        block: usize,
        whole_len: usize,
    ) -> (Fingerprint, Result<()>) {
        let fp = self.fingerprint(kind, T::DTYPE, block);
        let check = self.check_len(kind.name(), whole, whole_len, block * self.world_size());
        (fp, check)
    }

    /// [`ProcessGroup::blocks_call`] for the collectives whose whole buffer only `root` passes
    /// (gather's output, scatter's input; `whole_len` is `None` without one): the fingerprint
    /// names the root, and the check is [`ProcessGroup::check_root_buffer`]'s.
    fn rooted_blocks_call<T: Element>(
        &self,
        kind: CollectiveKind,
        whole: &str,
        block: usize,
        whole_len: Option<usize>,
        root: usize,
    ) -> (Fingerprint, Result<()>) {
        let fp = self.fingerprint(kind, T::DTYPE, block).with_root(root);
        let expected = block * self.world_size();
        let check = self.check_root_buffer(kind.name(), whole, root, whole_len, expected);
        (fp, check)
    }

    /// Runs one collective on the communication thread and waits for it. `check` is the
    /// caller's validation of its arguments (`Ok(())` when there is nothing to check): it runs
    /// there, in the collective's place, so a failed check fails the group and its peers hear
    /// of it (see the module docs).
    fn run_collective<'a>(
        &self,
        fp: Fingerprint,
        check: Result<()>,
        call: impl FnOnce(&mut dyn Transport) -> Result<()> + Send + 'a,
    ) -> Result<()> {
        self.inner.transport.run_blocking(move |s| {
            s.run(&fp, |t| {
                refused(t, &fp, check)?;
                call(t)
            })
        })
    }

    /// [`ProcessGroup::run_collective`] without waiting: `call` owns its buffers and returns
    /// what [`Work::wait`] hands back.
    fn submit_collective<R: Send + 'static>(
        &self,
        fp: Fingerprint,
        check: Result<()>,
        call: impl FnOnce(&mut dyn Transport) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        self.inner.transport.submit(move |s| {
            s.run(&fp, |t| {
                refused(t, &fp, check)?;
                call(t)
            })
        })
    }

    /// Reduces `buf` across all ranks with `op`; every rank ends with the same result, bitwise.
    ///
    /// # Collective
    /// Every rank calls it with the same length, type and `op`, in the same order as every other
    /// collective of this group.
    ///
    /// # Errors
    /// A peer that fails, stalls past the timeout, or called a different collective; the error
    /// names that rank.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let fp = self
            .fingerprint(CollectiveKind::AllReduce, T::DTYPE, buf.len())
            .with_op(op);
        let buf = bytes_mut(buf);
        self.run_collective(fp, Ok(()), move |t| t.all_reduce(&fp, buf, op))
    }

    /// [`ProcessGroup::all_reduce`] on the communication thread; `wait` returns the reduced buffer.
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        let fp = self
            .fingerprint(CollectiveKind::AllReduce, T::DTYPE, buf.len())
            .with_op(op);
        self.submit_collective(fp, Ok(()), move |t| {
            t.all_reduce(&fp, bytes_mut(&mut buf), op)?;
            Ok(buf)
        })
    }

    /// Reduces several buffers across all ranks as one: the result is that of
    /// [`ProcessGroup::all_reduce`] on their concatenation, written back into the pieces.
    ///
    /// For many small or scattered buffers (gradients): one collective instead of many, and on
    /// shared memory no flat copy is made; the pieces go straight to and from the transport.
    ///
    /// # Collective
    /// Every rank calls it with the same total length, type and `op`; how the total is split
    /// into pieces may differ between ranks.
    pub fn all_reduce_coalesced<T: Element>(
        &self,
        bufs: &mut [&mut [T]],
        op: ReduceOp,
    ) -> Result<()> {
        let count = bufs.iter().map(|b| b.len()).sum();
        let fp = self
            .fingerprint(CollectiveKind::AllReduce, T::DTYPE, count)
            .with_op(op);
        let mut pieces: Vec<&mut [u8]> = bufs.iter_mut().map(|b| bytes_mut(b)).collect();
        self.run_collective(fp, Ok(()), move |t| {
            t.all_reduce_parts(&fp, &mut Parts::new(&mut pieces), op)
        })
    }

    /// [`ProcessGroup::all_reduce_coalesced`] on the communication thread; `wait` returns the
    /// reduced buffers.
    pub fn all_reduce_coalesced_async<T: Element>(
        &self,
        mut bufs: Vec<Vec<T>>,
        op: ReduceOp,
    ) -> Work<Vec<Vec<T>>> {
        let count = bufs.iter().map(Vec::len).sum();
        let fp = self
            .fingerprint(CollectiveKind::AllReduce, T::DTYPE, count)
            .with_op(op);
        self.submit_collective(fp, Ok(()), move |t| {
            let mut pieces: Vec<&mut [u8]> = bufs.iter_mut().map(|b| bytes_mut(b)).collect();
            t.all_reduce_parts(&fp, &mut Parts::new(&mut pieces), op)?;
            Ok(bufs)
        })
    }

    /// Copies `root`'s `buf` into every other rank's `buf`.
    ///
    /// # Collective
    /// Every rank calls it with the same length, type and `root`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let fp = self
            .fingerprint(CollectiveKind::Broadcast, T::DTYPE, buf.len())
            .with_root(root);
        let check = self.check_rank("broadcast", "root", root);
        let buf = bytes_mut(buf);
        self.run_collective(fp, check, move |t| t.broadcast(&fp, buf, root))
    }

    /// [`ProcessGroup::broadcast`] on the communication thread.
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        let fp = self
            .fingerprint(CollectiveKind::Broadcast, T::DTYPE, buf.len())
            .with_root(root);
        let check = self.check_rank("broadcast", "root", root);
        self.submit_collective(fp, check, move |t| {
            t.broadcast(&fp, bytes_mut(&mut buf), root)?;
            Ok(buf)
        })
    }

    /// Concatenates every rank's `input` into `output` (`world_size() * input.len()` elements,
    /// rank `r`'s at `r * input.len()`), on every rank.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let (fp, check) = self.blocks_call::<T>(
            CollectiveKind::AllGather,
            "output",
            input.len(),
            output.len(),
        );
        let (input, output) = (bytes(input), bytes_mut(output));
        self.run_collective(fp, check, move |t| t.all_gather(&fp, input, output))
    }

    /// [`ProcessGroup::all_gather`] on the communication thread; `wait` returns the gathered
    /// `world_size() * input.len()` elements.
    pub fn all_gather_async<T: Element>(&self, input: Vec<T>) -> Work<Vec<T>> {
        let fp = self.fingerprint(CollectiveKind::AllGather, T::DTYPE, input.len());
        let mut output = vec![T::zeroed(); input.len() * self.world_size()];
        self.submit_collective(fp, Ok(()), move |t| {
            t.all_gather(&fp, bytes(&input), bytes_mut(&mut output))?;
            Ok(output)
        })
    }

    /// Exchanges equal chunks between every pair of ranks (PyTorch's `all_to_all_single` with
    /// equal splits): `input` holds `world_size()` chunks of `input.len() / world_size()`
    /// elements, and chunk `j` goes to rank `j`; `output`, as long as `input`, receives in its
    /// chunk `i` what rank `i` sent to this rank (its own chunk `rank()` is copied across).
    /// [`ProcessGroup::payload_bytes`] counts `input`.
    ///
    /// # Collective
    /// Every rank calls it with the same length and type.
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] when `input.len()` is not a multiple of `world_size()` or
    /// `output.len()` differs from it; [`CommError::Mismatch`] naming both ranks and both calls
    /// when ranks pass different lengths or types (or call another collective); a peer that
    /// fails or stalls past the timeout, named.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let fp = self.fingerprint(CollectiveKind::AllToAll, T::DTYPE, input.len());
        let check = self.check_all_to_all(input.len(), output.len());
        let (input, output) = (bytes(input), bytes_mut(output));
        self.run_collective(fp, check, move |t| t.all_to_all(&fp, input, output))
    }

    /// [`ProcessGroup::all_to_all`] on the communication thread; `input.len()` must be a
    /// multiple of the world size, and `wait` returns the received chunks, as many elements as
    /// `input`.
    pub fn all_to_all_async<T: Element>(&self, input: Vec<T>) -> Work<Vec<T>> {
        let fp = self.fingerprint(CollectiveKind::AllToAll, T::DTYPE, input.len());
        let check = self.check_all_to_all(input.len(), input.len());
        let mut output = vec![T::zeroed(); input.len()];
        self.submit_collective(fp, check, move |t| {
            t.all_to_all(&fp, bytes(&input), bytes_mut(&mut output))?;
            Ok(output)
        })
    }

    /// The lengths of an all-to-all: `input` in `world_size()` equal chunks, `output` as long.
    fn check_all_to_all(&self, input: usize, output: usize) -> Result<()> {
        let n = self.world_size();
        if !input.is_multiple_of(n) {
            return Err(CommError::arg(
                "all_to_all",
                format!(
                    "input has {input} elements, not a multiple of the world size {n} (one \
                     equal chunk per rank)"
                ),
            ));
        }
        self.check_len("all_to_all", "output", output, input)
    }

    /// Reduces `input` (`world_size() * output.len()` elements) across ranks and gives rank `r`
    /// block `r` of the result.
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let kind = CollectiveKind::ReduceScatter;
        let (fp, check) = self.blocks_call::<T>(kind, "input", output.len(), input.len());
        let fp = fp.with_op(op);
        let (input, output) = (bytes(input), bytes_mut(output));
        self.run_collective(fp, check, move |t| t.reduce_scatter(&fp, input, output, op))
    }

    /// [`ProcessGroup::reduce_scatter`] on the communication thread; `input.len()` must be a
    /// multiple of the world size, and `wait` returns this rank's block.
    pub fn reduce_scatter_async<T: Element>(&self, input: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        let block = input.len() / self.world_size();
        let kind = CollectiveKind::ReduceScatter;
        let (fp, check) = self.blocks_call::<T>(kind, "input", block, input.len());
        let fp = fp.with_op(op);
        let mut output = vec![T::zeroed(); block];
        self.submit_collective(fp, check, move |t| {
            t.reduce_scatter(&fp, bytes(&input), bytes_mut(&mut output), op)?;
            Ok(output)
        })
    }

    /// Reduces `buf` across ranks into `root`'s `buf`; other ranks' `buf` is left unchanged.
    pub fn reduce<T: Element>(&self, buf: &mut [T], root: usize, op: ReduceOp) -> Result<()> {
        let fp = self
            .fingerprint(CollectiveKind::Reduce, T::DTYPE, buf.len())
            .with_op(op)
            .with_root(root);
        let check = self.check_rank("reduce", "root", root);
        let buf = bytes_mut(buf);
        self.run_collective(fp, check, move |t| t.reduce(&fp, buf, root, op))
    }

    /// Collects every rank's `input` on `root`: `output` must be `Some` with
    /// `world_size() * input.len()` elements on `root`, and `None` elsewhere.
    pub fn gather<T: Element>(
        &self,
        input: &[T],
        output: Option<&mut [T]>,
        root: usize,
    ) -> Result<()> {
        let output_len = output.as_deref().map(<[T]>::len);
        let kind = CollectiveKind::Gather;
        let (fp, check) =
            self.rooted_blocks_call::<T>(kind, "output", input.len(), output_len, root);
        let input = bytes(input);
        let output = output.map(bytes_mut);
        self.run_collective(fp, check, move |t| t.gather(&fp, input, output, root))
    }

    /// Splits `root`'s `input` (`world_size() * output.len()` elements) and gives rank `r` block
    /// `r` in `output`; `input` is `Some` on `root` only.
    pub fn scatter<T: Element>(
        &self,
        input: Option<&[T]>,
        output: &mut [T],
        root: usize,
    ) -> Result<()> {
        let input_len = input.map(<[T]>::len);
        let kind = CollectiveKind::Scatter;
        let (fp, check) =
            self.rooted_blocks_call::<T>(kind, "input", output.len(), input_len, root);
        let input = input.map(bytes);
        let output = bytes_mut(output);
        self.run_collective(fp, check, move |t| t.scatter(&fp, input, output, root))
    }

    /// Returns once every rank of the group has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        let fp = self.fingerprint(CollectiveKind::Barrier, crate::DataType::U8, 1);
        self.run_collective(fp, Ok(()), move |t| t.barrier(&fp))
    }

    /// [`ProcessGroup::barrier`] on the communication thread.
    pub fn barrier_async(&self) -> Work<()> {
        let fp = self.fingerprint(CollectiveKind::Barrier, crate::DataType::U8, 1);
        self.submit_collective(fp, Ok(()), move |t| t.barrier(&fp))
    }

    /// Sends `buf` to group rank `dst`, which must call [`ProcessGroup::recv`] with the same
    /// length, type and `tag`. Returns when the data has been handed to the network.
    ///
    /// Point-to-point messages do not take part in the collective sequence: only the two ranks
    /// involved call them, in matching order.
    ///
    /// They do run in the group's one queue, in issue order with its collectives, and a send
    /// of more than the network buffers hold blocks that queue until the peer takes the data.
    /// So two ranks must not both send first and receive second (a swap of large messages
    /// waits until the timeout): let one of them receive first. And a receive posted early with `recv_async` waits in the queue ahead of
    /// this rank's later collectives: post it where the sender sends, in the same order
    /// relative to the collectives on both ranks.
    pub fn send<T: Element>(&self, buf: &[T], dst: usize, tag: u32) -> Result<()> {
        let (fp, check) = self.p2p::<T>("send", "destination", dst, buf.len(), tag);
        let buf = bytes(buf);
        self.run_collective(fp, check, move |t| t.send(&fp, buf, dst))
    }

    /// Receives into `buf` from group rank `src`, matching its [`ProcessGroup::send`].
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize, tag: u32) -> Result<()> {
        let (fp, check) = self.p2p::<T>("recv", "source", src, buf.len(), tag);
        let buf = bytes_mut(buf);
        self.run_collective(fp, check, move |t| t.recv(&fp, buf, src))
    }

    /// [`ProcessGroup::send`] on the communication thread.
    pub fn send_async<T: Element>(&self, buf: Vec<T>, dst: usize, tag: u32) -> Work<Vec<T>> {
        let (fp, check) = self.p2p::<T>("send", "destination", dst, buf.len(), tag);
        self.submit_collective(fp, check, move |t| {
            t.send(&fp, bytes(&buf), dst)?;
            Ok(buf)
        })
    }

    /// [`ProcessGroup::recv`] on the communication thread, into `buf` (its length is the message
    /// length).
    pub fn recv_async<T: Element>(&self, mut buf: Vec<T>, src: usize, tag: u32) -> Work<Vec<T>> {
        let (fp, check) = self.p2p::<T>("recv", "source", src, buf.len(), tag);
        self.submit_collective(fp, check, move |t| {
            t.recv(&fp, bytes_mut(&mut buf), src)?;
            Ok(buf)
        })
    }

    /// The fingerprint of a point-to-point message, and the check of its peer (in range, not
    /// this rank), for `send`/`recv` and their async forms.
    fn p2p<T: Element>(
        &self,
        op: &'static str,
        what: &str,
        peer: usize,
        len: usize,
        tag: u32,
    ) -> (Fingerprint, Result<()>) {
        let fp =
            Fingerprint::new(0, CollectiveKind::SendRecv, T::DTYPE, len).with_root(tag as usize);
        let check = self
            .check_rank(op, what, peer)
            .and_then(|()| self.check_not_self(op, peer));
        (fp, check)
    }

    fn check_not_self(&self, op: &'static str, peer: usize) -> Result<()> {
        if peer == self.rank() {
            return Err(CommError::arg(
                op,
                format!("rank {peer} cannot exchange a message with itself"),
            ));
        }
        Ok(())
    }
}
