//! [`MpiTransport`]: collectives over MPI (feature `mpi`, `DDP_TRANSPORT=mpi`), for jobs started
//! by `mpirun` or `srun`, where MPI drives the fabric (InfiniBand, RoCE, shared memory) better
//! than TCP sockets.
//!
//! - The process group's rank of each process must be its `MPI_COMM_WORLD` rank (true when the
//!   launcher takes ranks from `mpirun`/`srun`, as `ddp_core::launch` does). Each group gets its
//!   own communicator (`MPI_Comm_create_group` over its ranks), so groups never mix messages.
//! - Rendezvous still goes through the store: every member announces itself there first, so a
//!   rank that did not ask for `mpi` makes the others fail with the store's timeout instead of
//!   hanging in MPI.
//! - MPI calls cannot time out or be interrupted: the group's timeout does not apply to them,
//!   and [`Transport::abort`] only stops further calls. A failed or killed process ends the
//!   whole job through `mpirun`/`srun`, as usual with MPI.
//! - `f16`/`bf16` reduce with ddp-comm's own arithmetic (MPI has no half types), so results
//!   match the other transports; `Avg` is a sum, of inputs scaled by 1/n locally for f16 and
//!   bf16 and divided locally afterwards for every other type.
//! - Before any data moves, every collective compares its fingerprint (kind, type, op, root,
//!   sequence number and length) across the group in one small all-reduce (the maximum of the
//!   words and of their complements, so the minimum too), and point-to-point messages are
//!   preceded by the sender's fingerprint. Ranks that disagree get the same
//!   [`CommError::Mismatch`] as on the other transports, never truncated, overrun or mispaired
//!   data. A rank that rejects its own arguments (a scatter input off the root, a length that
//!   is not the world's multiple) still takes part in that comparison, with words no call has
//!   ([`Transport::refuse`]), so its peers fail naming it instead of waiting in MPI for ever.

mod call;
mod runtime;
mod types;

use super::aligned::aligned_copy;
use super::{AbortHandle, ConnectSpec, Connected, Transport};
use crate::collective::{CollectiveKind, Fingerprint};
use crate::error::{CommError, Result};
use crate::reduce_op::{ReduceOp, avg_prescales};
use call::{CHUNK_ELEMENTS, check, count};
use mpi::ffi;
use std::os::raw::{c_int, c_void};
use types::{datatype, operation};

/// Tag of point-to-point messages; MPI keeps them in order per sender and communicator.
const P2P_TAG: c_int = 0;
/// Tag of the fingerprint sent ahead of each point-to-point message.
const FP_TAG: c_int = 1;
/// Words of a fingerprint on the wire: `seq`, `count`, [`Fingerprint::packed`].
const FP_WORDS: usize = 3;
/// The `count` and packed words of a rank that rejected its arguments
/// ([`Transport::refuse`]): no collective has them.
const REFUSED: u64 = u64::MAX;

/// One group's MPI communicator.
struct Comm(ffi::MPI_Comm);

// SAFETY: the communicator is used by the one thread that owns the transport, under
// MPI_THREAD_MULTIPLE.
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        if runtime::finalized() {
            return;
        }
        // SAFETY: a communicator this transport created and nothing else uses.
        let rc = unsafe { ffi::MPI_Comm_free(&mut self.0) };
        if let Err(e) = check("MPI_Comm_free", rc) {
            tracing::warn!(error = %e, "freeing an MPI communicator failed");
        }
    }
}

/// A process group's transport over its own MPI communicator.
pub(crate) struct MpiTransport {
    comm: Comm,
    /// Group size.
    n: usize,
    /// Global rank of each group rank (its rank in this communicator), for errors.
    ranks: Vec<usize>,
    /// This process's group rank.
    me: usize,
    /// A copy of the input for the collectives MPI cannot run in place portably (MPI_IN_PLACE
    /// is not exported by rsmpi); `u64` keeps it aligned for every element type.
    scratch: Vec<u64>,
}

/// Connects a group over MPI: checks that MPI's ranks are the group's, meets the other members
/// in the store, and creates the group's communicator.
pub(crate) fn connect(spec: &ConnectSpec<'_>) -> Result<Connected> {
    runtime::ensure_initialized()?;
    let ranks = spec.mesh.ranks;
    let me = spec.mesh.group_rank;
    let (world_rank, world_size) = world_place()?;
    let mine = ranks[me];
    let largest = ranks.iter().copied().max().unwrap_or(0);
    if world_rank != mine || world_size <= largest {
        return Err(CommError::config(
            super::TRANSPORT_ENV,
            format!(
                "mpi: this process is rank {mine} of the job but rank {world_rank} of \
                 {world_size} in MPI_COMM_WORLD; start every rank with mpirun or srun and take \
                 the ranks from them (ddp_core::launch does)"
            ),
        ));
    }
    meet_in_store(spec)?;
    let comm = create_comm(ranks, spec.mesh.group_id)?;
    tracing::debug!(rank = mine, group_size = ranks.len(), "MPI transport ready");
    Ok(Connected {
        transport: Box::new(MpiTransport {
            comm,
            n: ranks.len(),
            ranks: ranks.to_vec(),
            me,
            scratch: Vec::new(),
        }),
        backend: "mpi",
        units: ranks.iter().map(|&r| vec![r]).collect(),
    })
}

/// This process's rank and the size of `MPI_COMM_WORLD`.
fn world_place() -> Result<(usize, usize)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: MPI is initialised; the world communicator always exists.
    unsafe {
        check(
            "MPI_Comm_rank",
            ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank),
        )?;
        check(
            "MPI_Comm_size",
            ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size),
        )?;
    }
    Ok((rank as usize, size as usize))
}

/// Every member says in the store that it is about to create the communicator, and waits for
/// the others there, where waits have a deadline (MPI_Comm_create_group has none).
fn meet_in_store(spec: &ConnectSpec<'_>) -> Result<()> {
    let store = spec.mesh.store;
    let deadline = std::time::Instant::now() + spec.mesh.timeout;
    store.set(&format!("mpi/hello/{}", spec.mesh.group_rank), b"mpi")?;
    for r in 0..spec.mesh.ranks.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        store
            .get_timeout(&format!("mpi/hello/{r}"), left)
            .map_err(|e| {
                CommError::config(
                    super::TRANSPORT_ENV,
                    format!(
                        "mpi: group rank {r} did not join over MPI ({e}); every rank must set \
                         DDP_TRANSPORT=mpi"
                    ),
                )
            })?;
    }
    Ok(())
}

/// A communicator over `ranks` (world ranks), created by the members only, with errors
/// returned instead of aborting the job.
fn create_comm(ranks: &[usize], group_id: u64) -> Result<Comm> {
    let members: Vec<c_int> = ranks
        .iter()
        .map(|&r| count("MPI_Group_incl", r))
        .collect::<Result<_>>()?;
    // Any tag up to 32767 is valid everywhere; it only separates concurrent creations.
    let tag = (group_id % 32_768) as c_int;
    // SAFETY: MPI is initialised; handles are created and freed here, the communicator is
    // returned owned.
    unsafe {
        let mut world_group: ffi::MPI_Group = std::mem::zeroed();
        check(
            "MPI_Comm_group",
            ffi::MPI_Comm_group(ffi::RSMPI_COMM_WORLD, &mut world_group),
        )?;
        let mut group: ffi::MPI_Group = std::mem::zeroed();
        let included = ffi::MPI_Group_incl(
            world_group,
            members.len() as c_int,
            members.as_ptr(),
            &mut group,
        );
        ffi::MPI_Group_free(&mut world_group);
        check("MPI_Group_incl", included)?;
        let mut comm: ffi::MPI_Comm = ffi::RSMPI_COMM_NULL;
        let created = ffi::MPI_Comm_create_group(ffi::RSMPI_COMM_WORLD, group, tag, &mut comm);
        ffi::MPI_Group_free(&mut group);
        check("MPI_Comm_create_group", created)?;
        let comm = Comm(comm);
        check(
            "MPI_Comm_set_errhandler",
            ffi::MPI_Comm_set_errhandler(comm.0, ffi::RSMPI_ERRORS_RETURN),
        )?;
        Ok(comm)
    }
}

/// What empty buffers point to. An empty slice's own pointer is a dangling address such as 1,
/// which Open MPI reads as `MPI_IN_PLACE`.
static EMPTY: u64 = 0;

/// Pointer for MPI's `const void*` arguments.
fn send_ptr(buf: &[u8]) -> *const c_void {
    if buf.is_empty() {
        return std::ptr::addr_of!(EMPTY).cast();
    }
    buf.as_ptr().cast()
}

/// Pointer for MPI's `void*` arguments (MPI writes nothing through it for an empty buffer).
fn recv_ptr(buf: &mut [u8]) -> *mut c_void {
    if buf.is_empty() {
        return std::ptr::addr_of!(EMPTY).cast_mut().cast();
    }
    buf.as_mut_ptr().cast()
}

impl MpiTransport {
    /// The chunked reductions (all-reduce, reduce): checks fingerprints, then calls `reduce`
    /// (an MPI reduction, returning its code, reported as `name`) on each piece of `buf` of at
    /// most [`CHUNK_ELEMENTS`] elements (MPI counts in an `int`), with the piece's input in a
    /// scratch copy of `buf` (MPI cannot reduce in place portably through rsmpi), its output in
    /// `buf` itself, its element count, and the MPI type and operation.
    fn reduce_in_chunks(
        &mut self,
        fp: &Fingerprint,
        buf: &mut [u8],
        op: ReduceOp,
        name: &'static str,
        mut reduce: impl FnMut(
            *const c_void,
            *mut c_void,
            c_int,
            ffi::MPI_Datatype,
            ffi::MPI_Op,
        ) -> c_int,
    ) -> Result<()> {
        self.agree(fp)?;
        let (dt, mop) = (datatype(fp.dtype), operation(fp.dtype, op)?);
        let size = fp.dtype.size_bytes();
        let copy = aligned_copy(&mut self.scratch, buf);
        op.prescale_if_avg(self.n, fp.dtype, copy);
        let input = copy.as_ptr();
        for start in (0..buf.len()).step_by(CHUNK_ELEMENTS * size) {
            let end = (start + CHUNK_ELEMENTS * size).min(buf.len());
            let n = ((end - start) / size) as c_int;
            // SAFETY: the scratch copy holds `buf.len()` bytes, so `start` is inside it.
            let piece_input = unsafe { input.add(start) }.cast();
            check(
                name,
                reduce(piece_input, recv_ptr(&mut buf[start..end]), n, dt, mop),
            )?;
        }
        Ok(())
    }

    /// The collectives that move blocks of bytes (all-gather, gather, scatter): checks
    /// fingerprints, then calls `transfer` (an MPI call, returning its code, reported as
    /// `name`) with the per-rank block of `block` bytes as MPI's `int` count (an error naming
    /// `op` when it does not fit one) and MPI's byte type.
    fn byte_blocks(
        &mut self,
        fp: &Fingerprint,
        op: &'static str,
        block: usize,
        name: &'static str,
        transfer: impl FnOnce(c_int, ffi::MPI_Datatype) -> c_int,
    ) -> Result<()> {
        self.agree(fp)?;
        let n = count(op, block)?;
        // SAFETY: reading a constant the MPI library exports.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        check(name, transfer(n, byte))
    }

    /// Checks that every rank of the group runs the collective `fp` describes, with the same
    /// lengths, before any data moves: MPI would otherwise truncate, overrun, or pair chunk
    /// loops with the next collective. Every rank takes the same branch (they all see the same
    /// maximum and minimum), so a mismatch never leaves a rank waiting in MPI.
    ///
    /// # Errors
    /// [`CommError::Mismatch`] naming the first rank whose call differs from ours; MPI errors.
    fn agree(&mut self, fp: &Fingerprint) -> Result<()> {
        self.agree_on(fp, fingerprint_words(fp))
    }

    /// [`MpiTransport::agree`] with `mine` as this rank's words.
    fn agree_on(&mut self, fp: &Fingerprint, mine: [u64; FP_WORDS]) -> Result<()> {
        let mut both = [0u64; 2 * FP_WORDS];
        for (i, w) in mine.iter().enumerate() {
            both[i] = *w;
            both[FP_WORDS + i] = !*w;
        }
        let mut extremes = [0u64; 2 * FP_WORDS];
        // SAFETY: reading constants the MPI library exports.
        let (u64_t, max) = unsafe { (ffi::RSMPI_UINT64_T, ffi::RSMPI_MAX) };
        // SAFETY: both arrays hold `2 * FP_WORDS` u64 and do not overlap.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                both.as_ptr().cast(),
                extremes.as_mut_ptr().cast(),
                (2 * FP_WORDS) as c_int,
                u64_t,
                max,
                self.comm.0,
            )
        };
        check("MPI_Allreduce (fingerprints)", rc)?;
        // Our words are the group's maximum and (complemented) minimum: all ranks agree.
        if extremes == both {
            return Ok(());
        }
        // Someone differs: find out who, all ranks together.
        let mut all = vec![0u64; FP_WORDS * self.n];
        // SAFETY: `all` holds `FP_WORDS` words per rank of the communicator.
        let rc = unsafe {
            ffi::MPI_Allgather(
                mine.as_ptr().cast(),
                FP_WORDS as c_int,
                u64_t,
                all.as_mut_ptr().cast(),
                FP_WORDS as c_int,
                u64_t,
                self.comm.0,
            )
        };
        check("MPI_Allgather (fingerprints)", rc)?;
        let differs = all
            .chunks_exact(FP_WORDS)
            .position(|theirs| theirs != mine)
            .unwrap_or(self.me);
        let theirs = &all[differs * FP_WORDS..(differs + 1) * FP_WORDS];
        self.mismatch(fp, theirs, differs)
    }

    /// The error for a peer whose fingerprint words differ from `fp`.
    fn mismatch(&self, fp: &Fingerprint, theirs: &[u64], peer: usize) -> Result<()> {
        let (me, them) = (self.ranks[self.me], self.ranks[peer]);
        if theirs[1..] == [REFUSED, REFUSED] {
            return Err(CommError::PeerGone {
                op: fp.label(),
                peer: them,
                reason: "rejected its arguments to this collective and left it (its own error \
                         says which)"
                    .to_string(),
                detail: String::new(),
            });
        }
        match Fingerprint::unpack(theirs[0], theirs[1], theirs[2]) {
            Some(theirs) => fp.expect_same(&theirs, me, them),
            None => Err(CommError::Mismatch {
                seq: fp.seq,
                rank: me,
                ours: format!("{fp} as collective #{}", fp.seq),
                peer: them,
                theirs: format!(
                    "an unknown collective (fingerprint words {theirs:x?}; another ddp-comm \
                     version?)"
                ),
            }),
        }
    }
}

/// The words a fingerprint is compared in.
fn fingerprint_words(fp: &Fingerprint) -> [u64; FP_WORDS] {
    [fp.seq, fp.count, fp.packed()]
}

impl MpiTransport {
    /// Receives `src`'s next message, whatever its length, and drops it.
    fn drop_message(&mut self, src: usize) -> Result<()> {
        // SAFETY: reading a constant the MPI library exports.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        // SAFETY: a zeroed status is a valid out-parameter for MPI_Probe.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: a valid communicator and status.
        check("MPI_Probe", unsafe {
            ffi::MPI_Probe(src as c_int, P2P_TAG, self.comm.0, &mut status)
        })?;
        let mut len: c_int = 0;
        // SAFETY: the status MPI_Probe filled.
        check("MPI_Get_count", unsafe {
            ffi::MPI_Get_count(&status, byte, &mut len)
        })?;
        let mut sink = vec![0u8; usize::try_from(len).unwrap_or(0)];
        let name = "MPI_Recv (dropped message)";
        // SAFETY: `sink` holds `len` bytes.
        unsafe { self.recv_from(recv_ptr(&mut sink), len, byte, src, P2P_TAG, name) }
    }

    /// `MPI_Send` of `n` elements of `datatype` at `buf` to group rank `dst`, tagged `tag`; a
    /// failure is reported as `name`.
    ///
    /// # Safety
    /// `buf` holds `n` elements of `datatype`.
    unsafe fn send_to(
        &self,
        buf: *const c_void,
        n: c_int,
        datatype: ffi::MPI_Datatype,
        dst: usize,
        tag: c_int,
        name: &'static str,
    ) -> Result<()> {
        // SAFETY: the caller's contract; a valid communicator.
        let rc = unsafe { ffi::MPI_Send(buf, n, datatype, dst as c_int, tag, self.comm.0) };
        check(name, rc)
    }

    /// `MPI_Recv` of `n` elements of `datatype` into `buf` from group rank `src`, tagged `tag`
    /// (its status ignored); a failure is reported as `name`.
    ///
    /// # Safety
    /// `buf` has room for `n` elements of `datatype`.
    unsafe fn recv_from(
        &self,
        buf: *mut c_void,
        n: c_int,
        datatype: ffi::MPI_Datatype,
        src: usize,
        tag: c_int,
        name: &'static str,
    ) -> Result<()> {
        // SAFETY: reading a constant the MPI library exports; then the caller's contract and a
        // valid communicator.
        let rc = unsafe {
            let ignore = ffi::RSMPI_STATUS_IGNORE;
            ffi::MPI_Recv(buf, n, datatype, src as c_int, tag, self.comm.0, ignore)
        };
        check(name, rc)
    }
}

impl Transport for MpiTransport {
    fn all_reduce(&mut self, fp: &Fingerprint, buf: &mut [u8], op: ReduceOp) -> Result<()> {
        let comm = self.comm.0;
        self.reduce_in_chunks(fp, buf, op, "MPI_Allreduce", |input, output, n, dt, mop| {
            // SAFETY: `input` and `output` hold `n` elements each and do not overlap.
            unsafe { ffi::MPI_Allreduce(input, output, n, dt, mop, comm) }
        })?;
        op.divide_if_avg(self.n, fp.dtype, buf);
        Ok(())
    }

    fn broadcast(&mut self, fp: &Fingerprint, buf: &mut [u8], root: usize) -> Result<()> {
        self.agree(fp)?;
        // SAFETY: reading a constant the MPI library exports.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        for piece in buf.chunks_mut(CHUNK_ELEMENTS) {
            let n = piece.len() as c_int;
            // SAFETY: `piece` holds `n` bytes on every rank (checked by the caller).
            let rc =
                unsafe { ffi::MPI_Bcast(recv_ptr(piece), n, byte, root as c_int, self.comm.0) };
            check("MPI_Bcast", rc)?;
        }
        Ok(())
    }

    fn all_gather(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()> {
        let comm = self.comm.0;
        self.byte_blocks(fp, "all_gather", input.len(), "MPI_Allgather", |n, byte| {
            // SAFETY: `output` holds `world * input.len()` bytes (checked by the caller).
            unsafe { ffi::MPI_Allgather(send_ptr(input), n, byte, recv_ptr(output), n, byte, comm) }
        })
    }

    fn reduce_scatter(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: &mut [u8],
        op: ReduceOp,
    ) -> Result<()> {
        self.agree(fp)?;
        let n = count("reduce_scatter", output.len() / fp.dtype.size_bytes())?;
        let (dt, mop) = (datatype(fp.dtype), operation(fp.dtype, op)?);
        // The `Avg` prologue on a copy: `input` is the caller's.
        let input: &[u8] = if op == ReduceOp::Avg && avg_prescales(fp.dtype) {
            let copy = aligned_copy(&mut self.scratch, input);
            op.prescale_if_avg(self.n, fp.dtype, copy);
            copy
        } else {
            input
        };
        // SAFETY: `input` holds `world * output.len()` bytes (checked by the caller).
        let rc = unsafe {
            ffi::MPI_Reduce_scatter_block(
                send_ptr(input),
                recv_ptr(output),
                n,
                dt,
                mop,
                self.comm.0,
            )
        };
        check("MPI_Reduce_scatter_block", rc)?;
        op.divide_if_avg(self.n, fp.dtype, output);
        Ok(())
    }

    fn reduce(
        &mut self,
        fp: &Fingerprint,
        buf: &mut [u8],
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let comm = self.comm.0;
        self.reduce_in_chunks(fp, buf, op, "MPI_Reduce", |input, output, n, dt, mop| {
            // SAFETY: `input` and `output` hold `n` elements each and do not overlap; only the
            // root's `output` is written, so other ranks keep their input.
            unsafe { ffi::MPI_Reduce(input, output, n, dt, mop, root as c_int, comm) }
        })?;
        let mut rank: c_int = 0;
        // SAFETY: a valid communicator.
        check("MPI_Comm_rank", unsafe {
            ffi::MPI_Comm_rank(comm, &mut rank)
        })?;
        if rank as usize == root {
            op.divide_if_avg(self.n, fp.dtype, buf);
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
        let out = output.map_or(std::ptr::null_mut(), recv_ptr);
        let comm = self.comm.0;
        self.byte_blocks(fp, "gather", input.len(), "MPI_Gather", |n, byte| {
            // SAFETY: on the root `out` holds `world * input.len()` bytes; elsewhere it is
            // ignored.
            unsafe { ffi::MPI_Gather(send_ptr(input), n, byte, out, n, byte, root as c_int, comm) }
        })
    }

    fn scatter(
        &mut self,
        fp: &Fingerprint,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()> {
        let src = input.map_or(std::ptr::null(), send_ptr);
        let comm = self.comm.0;
        self.byte_blocks(fp, "scatter", output.len(), "MPI_Scatter", |n, byte| {
            // SAFETY: on the root `src` holds `world * output.len()` bytes; elsewhere it is
            // ignored.
            unsafe {
                ffi::MPI_Scatter(src, n, byte, recv_ptr(output), n, byte, root as c_int, comm)
            }
        })
    }

    /// `MPI_Alltoall`, one block of the element type per rank.
    fn all_to_all(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.agree(fp)?;
        let n = count("all_to_all", input.len() / self.n / fp.dtype.size_bytes())?;
        let dt = datatype(fp.dtype);
        // SAFETY: `input` and `output` each hold `world` blocks of `n` elements (checked by the
        // caller) and do not overlap.
        let rc = unsafe {
            ffi::MPI_Alltoall(send_ptr(input), n, dt, recv_ptr(output), n, dt, self.comm.0)
        };
        check("MPI_Alltoall", rc)
    }

    fn barrier(&mut self, fp: &Fingerprint) -> Result<()> {
        self.agree(fp)?;
        // SAFETY: a valid communicator.
        check("MPI_Barrier", unsafe { ffi::MPI_Barrier(self.comm.0) })
    }

    /// The fingerprint, then the message, so the receiver can check it before taking data.
    fn send(&mut self, fp: &Fingerprint, buf: &[u8], dst: usize) -> Result<()> {
        // SAFETY: reading constants the MPI library exports.
        let (byte, u64_t) = unsafe { (ffi::RSMPI_UINT8_T, ffi::RSMPI_UINT64_T) };
        let n = count("send", buf.len())?;
        let words = fingerprint_words(fp);
        let words_ptr = words.as_ptr().cast();
        // SAFETY: `words` holds `FP_WORDS` u64, `buf` `n` bytes.
        unsafe {
            let name = "MPI_Send (fingerprint)";
            self.send_to(words_ptr, FP_WORDS as c_int, u64_t, dst, FP_TAG, name)?;
            self.send_to(send_ptr(buf), n, byte, dst, P2P_TAG, "MPI_Send")
        }
    }

    /// Checks the sender's fingerprint first; on a mismatch the message is received into
    /// scratch and dropped (so it cannot be taken for the next one), and the mismatch returned.
    fn recv(&mut self, fp: &Fingerprint, buf: &mut [u8], src: usize) -> Result<()> {
        // SAFETY: reading constants the MPI library exports.
        let (byte, u64_t) = unsafe { (ffi::RSMPI_UINT8_T, ffi::RSMPI_UINT64_T) };
        let n = count("recv", buf.len())?;
        let mut theirs = [0u64; FP_WORDS];
        let theirs_ptr = theirs.as_mut_ptr().cast();
        let name = "MPI_Recv (fingerprint)";
        // SAFETY: `theirs` holds `FP_WORDS` u64.
        unsafe { self.recv_from(theirs_ptr, FP_WORDS as c_int, u64_t, src, FP_TAG, name) }?;
        if theirs != fingerprint_words(fp) {
            self.drop_message(src)?;
            return self.mismatch(fp, &theirs, src);
        }
        // SAFETY: `buf` holds `n` bytes, the length the sender's fingerprint announced.
        unsafe { self.recv_from(recv_ptr(buf), n, byte, src, P2P_TAG, "MPI_Recv") }
    }

    /// The peers wait in the fingerprint check of every collective but a point-to-point
    /// message: this rank takes part with words no call has, so they fail naming it instead
    /// of waiting in MPI for ever. (A receiver waits for a message that never comes; MPI
    /// offers no way out of that.)
    fn refuse(&mut self, fp: &Fingerprint) {
        if fp.kind == CollectiveKind::SendRecv {
            return;
        }
        if let Err(e) = self.agree_on(fp, [fp.seq, REFUSED, REFUSED]) {
            tracing::debug!(error = %e, "mpi: the peers were told this rank rejected its arguments");
        }
    }

    /// MPI calls cannot be interrupted: the group refuses further calls (see the module docs).
    fn abort(&mut self) {}

    fn abort_handle(&self) -> Result<AbortHandle> {
        Ok(AbortHandle::default())
    }
}
