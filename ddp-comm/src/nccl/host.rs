//! Collectives on host slices: copy to the device, run the collective, copy back.
//!
//! The path for data that lives in host memory (tests, small control messages, a host-staged
//! fallback). Each call allocates its device buffers on the group's stream, which cudarc takes
//! from the driver's memory pool, waits for the collective through the watchdog (bounded by the
//! timeout) and only then copies back, and returns when the result is in host memory.

use super::backend::NcclBackend;
use super::calls::Call;
use super::element::NcclElement;
use super::thread::CommState;
use super::work::NcclWork;
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use crate::work::Work;
use cudarc::driver::CudaSlice;

impl NcclBackend {
    /// [`NcclBackend::all_reduce`] on a host slice.
    ///
    /// # Collective
    /// Every rank calls it with a slice of the same length; afterwards every rank's slice holds
    /// the same result.
    ///
    /// # Errors
    /// CUDA failures (allocation, copies) and NCCL failures.
    pub fn all_reduce_host<T: NcclElement>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.thread().run_blocking("all_reduce_host", move |s| {
            let mut dev = upload(s, buf)?;
            all_reduce_and_wait(s, &mut dev, op)?;
            download(s, &dev, buf)
        })
    }

    /// [`NcclBackend::all_reduce_host`] on an owned buffer, without blocking: the returned
    /// [`Work`] gives the buffer back holding the result, so the caller can compute meanwhile.
    ///
    /// # Collective
    /// As [`NcclBackend::all_reduce_host`]; collectives run in issue order.
    ///
    /// # Errors
    /// From [`Work::wait`]: CUDA and NCCL failures, [`CommError::Destroyed`](crate::CommError)
    /// if the group went away first.
    pub fn all_reduce_host_async<T: NcclElement>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Work<Vec<T>> {
        self.thread().submit("all_reduce_host_async", move |s| {
            if buf.is_empty() {
                return Ok(buf);
            }
            let mut dev = upload(s, &buf)?;
            all_reduce_and_wait(s, &mut dev, op)?;
            download(s, &dev, &mut buf)?;
            Ok(buf)
        })
    }

    /// [`NcclBackend::broadcast`] on a host slice: `root`'s slice lands in every rank's.
    ///
    /// # Collective
    /// Every rank calls it with the same `root` and slice length.
    ///
    /// # Errors
    /// `root` out of range; CUDA and NCCL failures.
    pub fn broadcast_host<T: NcclElement>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let root_i32 = self.check_root("broadcast_host", root)?;
        if buf.is_empty() {
            return Ok(());
        }
        let is_root = root == self.rank();
        self.thread().run_blocking("broadcast_host", move |s| {
            // Only the root's values matter; the others just need room.
            let mut dev = if is_root {
                upload(s, buf)?
            } else {
                zeros(s, buf.len())?
            };
            let call = Call::Broadcast { root: root_i32 };
            // SAFETY: `dev` was just allocated on the group's stream, and the work is waited for.
            unsafe { s.queue_in_place(call, "broadcast", &mut dev, wait) }?;
            download(s, &dev, buf)
        })
    }

    /// [`NcclBackend::all_gather`] on host slices: rank `r`'s `send` lands at
    /// `recv[r * send.len()..]` on every rank.
    ///
    /// # Collective
    /// Every rank calls it with the same `send` length; `recv` holds `world_size` blocks.
    ///
    /// # Errors
    /// Mismatched lengths; CUDA and NCCL failures.
    pub fn all_gather_host<T: NcclElement>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.check_blocks("all_gather_host", send.len(), recv.len())?;
        if send.is_empty() {
            return Ok(());
        }
        self.thread().run_blocking("all_gather_host", move |s| {
            let count = send.len();
            staged_between(s, Call::AllGather, "all_gather", send, recv, count)
        })
    }

    /// [`NcclBackend::reduce_scatter`] on host slices: `recv` receives block `rank` of the
    /// reduction of every rank's `send`.
    ///
    /// # Collective
    /// Every rank calls it with the same lengths and `op`.
    ///
    /// # Errors
    /// Mismatched lengths; CUDA and NCCL failures.
    pub fn reduce_scatter_host<T: NcclElement>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.check_blocks("reduce_scatter_host", recv.len(), send.len())?;
        if recv.is_empty() {
            return Ok(());
        }
        self.thread().run_blocking("reduce_scatter_host", move |s| {
            let count = recv.len();
            let call = Call::ReduceScatter(op);
            staged_between(s, call, "reduce_scatter", send, recv, count)
        })
    }
}

/// All-reduces `dev` in place and waits, through the watchdog, until it finished on the GPU.
fn all_reduce_and_wait<T: NcclElement>(
    s: &mut CommState,
    dev: &mut CudaSlice<T>,
    op: ReduceOp,
) -> Result<()> {
    // SAFETY: `dev` is on the group's device and stream, and the work is waited for.
    unsafe { s.queue_in_place(Call::AllReduce(op), "all_reduce", dev, wait) }
}

/// Runs a two-buffer collective (all-gather, reduce-scatter) on host slices: uploads `send`,
/// queues `call` into a fresh device buffer of `recv.len()` elements with NCCL's per-rank
/// `count`, waits for it and downloads the result into `recv`. The lengths were checked against
/// the world size by the caller.
fn staged_between<T: NcclElement>(
    s: &mut CommState,
    call: Call,
    op: &'static str,
    send: &[T],
    recv: &mut [T],
    count: usize,
) -> Result<()> {
    let dev_send = upload(s, send)?;
    let mut dev_recv = zeros(s, recv.len())?;
    // SAFETY: both buffers were just allocated on the group's stream, sized for the call
    // (checked by the caller), and the work is waited for.
    unsafe { s.queue_between(call, op, &dev_send, &mut dev_recv, count, wait) }?;
    download(s, &dev_recv, recv)
}

/// Waits for a queued collective through the watchdog, until it finished on the GPU.
fn wait(work: NcclWork) -> Result<()> {
    work.watched.wait()
}

fn upload<T: NcclElement>(s: &CommState, host: &[T]) -> Result<CudaSlice<T>> {
    s.stream
        .clone_htod(host)
        .map_err(s.cuda("copying to the device"))
}

fn zeros<T: NcclElement>(s: &CommState, len: usize) -> Result<CudaSlice<T>> {
    s.stream
        .alloc_zeros(len)
        .map_err(s.cuda("allocating a device buffer"))
}

/// Copies `dev` into `host` and waits, so the caller can read `host` at once. Called only after
/// the collective that wrote `dev` finished, so the wait cannot be held up by a peer.
fn download<T: NcclElement>(s: &CommState, dev: &CudaSlice<T>, host: &mut [T]) -> Result<()> {
    s.stream
        .memcpy_dtoh(dev, host)
        .map_err(s.cuda("copying to the host"))?;
    s.stream
        .synchronize()
        .map_err(s.cuda("synchronising after the copy to the host"))
}
