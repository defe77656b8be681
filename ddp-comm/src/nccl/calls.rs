//! The NCCL calls themselves, in one place: every collective of [`NcclBackend`](super::NcclBackend)
//! (on device buffers, on host slices staged through the device, on raw addresses) queues
//! through [`CommState::queue`].

use super::dtype::NcclDtype;
use super::element::nccl_op;
use super::thread::CommState;
use super::work::NcclWork;
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use crate::watchdog::CollectiveLabel;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nccl::NcclType;
use cudarc::nccl::sys::{self, ncclDataType_t};
use std::ffi::{c_int, c_void};

/// Which collective, with its own argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    AllReduce(ReduceOp),
    Broadcast { root: c_int },
    AllGather,
    ReduceScatter(ReduceOp),
}

/// A collective's buffers: device addresses on the group's device, and the element count NCCL
/// takes (the per-rank block for all-gather and reduce-scatter).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buffers {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) count: usize,
    pub(crate) dtype: ncclDataType_t,
    /// Bytes this rank contributes, for the watchdog's report.
    pub(crate) bytes: usize,
}

impl Buffers {
    /// `count` elements of `T` (NCCL's count for the call) at `src` and `dst`.
    pub(crate) fn of<T: NcclType>(src: u64, dst: u64, count: usize) -> Buffers {
        Buffers {
            src,
            dst,
            count,
            dtype: T::as_nccl_type(),
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
        }
    }

    /// `count` elements of `dtype` (NCCL's count for the call) at raw addresses `src` and
    /// `dst`, of which this rank contributes `blocks` times `count` (`world_size` for a
    /// reduce-scatter's send and an all-gather's receive, 1 for an all-reduce).
    pub(crate) fn raw(
        src: u64,
        dst: u64,
        count: usize,
        dtype: NcclDtype,
        blocks: usize,
    ) -> Buffers {
        Buffers {
            src,
            dst,
            count,
            dtype: dtype.nccl(),
            bytes: count
                .saturating_mul(blocks)
                .saturating_mul(dtype.size_bytes()),
        }
    }
}

impl CommState {
    /// Queues `call` on the group's stream, supervised by the watchdog.
    ///
    /// # Safety
    /// `buffers.src` and `buffers.dst` are device allocations on the group's device holding
    /// what `call` reads and writes for `count` elements of `dtype` (`world_size` blocks of
    /// them where the collective gathers or scatters), alive and untouched by other streams
    /// until the returned work has completed.
    pub(crate) unsafe fn queue(
        &mut self,
        call: Call,
        label: CollectiveLabel,
        buffers: Buffers,
    ) -> Result<NcclWork> {
        let Buffers {
            src,
            dst,
            count,
            dtype,
            bytes,
        } = buffers;
        let (src, dst) = (src as *const c_void, dst as *mut c_void);
        self.enqueue(label, bytes, |comm, st| {
            // SAFETY: the caller's contract above; `comm` and `st` are the group's live
            // communicator and stream.
            unsafe {
                match call {
                    Call::AllReduce(op) => {
                        sys::ncclAllReduce(src, dst, count, dtype, nccl_op(op), comm, st)
                    }
                    Call::Broadcast { root } => {
                        sys::ncclBroadcast(src, dst, count, dtype, root, comm, st)
                    }
                    Call::AllGather => sys::ncclAllGather(src, dst, count, dtype, comm, st),
                    Call::ReduceScatter(op) => {
                        sys::ncclReduceScatter(src, dst, count, dtype, nccl_op(op), comm, st)
                    }
                }
            }
        })
    }

    /// Queues `call` in place on `buf` (all-reduce, broadcast, the barrier), labelled `op`, and
    /// hands the work to `then` while `buf` is still borrowed for the group's stream: the guard
    /// records the buffer's use on that stream when dropped, after the collective was queued (as
    /// cudarc's own Comm does). The device and host entry points all queue this way.
    ///
    /// # Safety
    /// `buf` is on the group's device and stream and sized for `call`; `then` waits for the
    /// work or lets the watchdog supervise it, so `buf` outlives the collective in stream order.
    pub(crate) unsafe fn queue_in_place<T, B, X>(
        &mut self,
        call: Call,
        op: &'static str,
        buf: &mut B,
        then: impl FnOnce(NcclWork) -> Result<X>,
    ) -> Result<X>
    where
        T: NcclType,
        B: DevicePtrMut<T>,
    {
        let stream = self.stream.clone();
        let count = buf.len();
        let (ptr, _record) = buf.device_ptr_mut(&stream);
        // SAFETY: the caller's contract above; `_record` lives until the work is queued.
        unsafe { self.queue_then(call, op, Buffers::of::<T>(ptr, ptr, count), then) }
    }

    /// [`CommState::queue_in_place`] from `send` into `recv` (all-gather, reduce-scatter), with
    /// NCCL's per-rank `count`.
    ///
    /// # Safety
    /// As [`CommState::queue_in_place`], for both buffers.
    pub(crate) unsafe fn queue_between<T, S, R, X>(
        &mut self,
        call: Call,
        op: &'static str,
        send: &S,
        recv: &mut R,
        count: usize,
        then: impl FnOnce(NcclWork) -> Result<X>,
    ) -> Result<X>
    where
        T: NcclType,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let stream = self.stream.clone();
        let (src, _record_src) = send.device_ptr(&stream);
        let (dst, _record_dst) = recv.device_ptr_mut(&stream);
        // SAFETY: the caller's contract above; the records live until the work is queued.
        unsafe { self.queue_then(call, op, Buffers::of::<T>(src, dst, count), then) }
    }

    /// The common end of [`CommState::queue_in_place`] and [`CommState::queue_between`]: queues
    /// `call` on `buffers`, labelled `op`, and hands the work to `then`.
    ///
    /// # Safety
    /// As [`CommState::queue`]; the caller holds its buffers' stream records until this returns.
    unsafe fn queue_then<X>(
        &mut self,
        call: Call,
        op: &'static str,
        buffers: Buffers,
        then: impl FnOnce(NcclWork) -> Result<X>,
    ) -> Result<X> {
        // SAFETY: the caller's contract above.
        let work = unsafe { self.queue(call, CollectiveLabel::new(op), buffers) }?;
        then(work)
    }
}
