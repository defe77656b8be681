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
}
