//! [`RawComm`]: our owner of NCCL's raw communicator handle, so that it can be created with a
//! timeout and aborted from the watchdog's thread.
//!
//! cudarc's safe `Comm` hides the `ncclComm_t` and can neither time out its init nor be aborted
//! from another thread. Here the communicator is non-blocking (`ncclConfig_t::blocking = 0`):
//! every NCCL call returns at once, possibly with `ncclInProgress`, and completion is polled
//! with `ncclCommGetAsyncError` up to a deadline. Calls therefore never block inside NCCL,
//! which lets one mutex serialise them with [`RawComm::abort`]: after an abort the handle is
//! gone (NCCL frees it) and every later call fails instead of touching freed memory.

use super::library::last_error_detail;
use crate::error::{CommError, Result};
use crate::error::{NcclError, nccl_hint};
use crate::watchdog::{ABORT_WAIT, Bounded, run_bounded};
use cudarc::driver::CudaContext;
use cudarc::nccl::Id;
use cudarc::nccl::sys::{self, ncclComm_t, ncclResult_t};
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Pause between two polls of a call in progress, after the first [`SPINS`] polls (a
/// multi-rank collective on a non-blocking communicator is usually in progress for a few
/// microseconds only: a long first sleep would cost every bucket that much).
const POLL: Duration = Duration::from_micros(200);
/// Polls that only yield the thread before [`POLL`] pauses start.
const SPINS: u32 = 200;

/// `NCCL_CONFIG_MAGIC` from nccl.h.
const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_VERSION(2, 14, 0)`: the first config layout (size, magic, version, blocking). We pass
/// the size up to and including `netName` (cgaClusterSize, minCTAs, maxCTAs, netName came in
/// 2.17; NCCL resets fields newer than `version` to their defaults, and we leave them
/// undefined anyway). NCCL copies `size` bytes over its `NCCL_CONFIG_INITIALIZER` defaults, so
/// every NCCL from 2.14 on reads only these, whatever layout cudarc's bindings came from.
/// (Checked on an H100 with NCCL 2.28.3: accepted, and `blocking = 0` honoured.)
const CONFIG_VERSION_2_14: u32 = 21400;
/// `NCCL_CONFIG_UNDEF_INT`: "use NCCL's default".
const UNDEF_INT: c_int = c_int::MIN;

/// The handle; NCCL communicators may be used from any thread, one call at a time (the mutex).
struct Handle(ncclComm_t);

// SAFETY: an ncclComm_t is a heap pointer NCCL allows to be used from any thread; every use
// goes through RawComm's mutex, so calls never overlap.
unsafe impl Send for Handle {}

/// One rank's NCCL communicator.
pub(crate) struct RawComm {
    handle: Mutex<Option<Handle>>,
    /// The device's context, made current on the thread that aborts (NCCL's abort saves and
    /// restores the calling thread's device: with no context current there, every rank would
    /// create one on GPU 0).
    ctx: Arc<CudaContext>,
    group: String,
    rank: usize,
}

impl std::fmt::Debug for RawComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawComm")
            .field("group", &self.group)
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl RawComm {
    /// Joins the communicator of `world_size` ranks identified by `id`, waiting up to `timeout`
    /// for every rank to join; on timeout the half-made communicator is aborted. `ctx`, the
    /// context of the rank's device, must be current on this thread.
    ///
    /// # Errors
    /// [`NcclError::InitTimeout`] when the ranks do not all join in time; NCCL failures.
    pub(crate) fn init(
        id: &Id,
        rank: usize,
        world_size: usize,
        group: &str,
        timeout: Duration,
        ctx: Arc<CudaContext>,
    ) -> Result<RawComm> {
        let comm = RawComm {
            handle: Mutex::new(None),
            ctx,
            group: group.to_string(),
            rank,
        };
        // NcclBackendConfig::validate bounds both by i32::MAX.
        let nranks = c_int::try_from(world_size).unwrap_or(c_int::MAX);
        let rank_int = c_int::try_from(rank).unwrap_or(c_int::MAX);
        let mut config = nonblocking_config();
        let mut raw: ncclComm_t = std::ptr::null_mut();
        let unique = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        // SAFETY: `raw` and `config` are valid for writes and reads for the call; the id is
        // passed by value; NCCL stores the new handle in `raw` (possibly before it is ready).
        let status =
            unsafe { sys::ncclCommInitRankConfig(&mut raw, nranks, unique, rank_int, &mut config) };
        if !raw.is_null() {
            *comm.lock() = Some(Handle(raw));
        }
        match status {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => {}
            code => {
                comm.abort();
                return Err(comm.error("init", code));
            }
        }
        if raw.is_null() {
            return Err(comm.error("init", ncclResult_t::ncclInternalError));
        }
        let deadline = crate::deadline::deadline_after(timeout);
        match comm.settle("init", deadline) {
            Ok(()) => Ok(comm),
            Err(Settle::Failed(e)) => {
                comm.abort();
                Err(e)
            }
            Err(Settle::TimedOut) => {
                comm.abort();
                Err(NcclError::InitTimeout {
                    group: group.to_string(),
                    rank,
                    world_size,
                    timeout,
                }
                .into())
            }
        }
    }

    /// Runs one NCCL call on the handle and waits (polling, up to `deadline`) until NCCL has
    /// finished issuing it. For a collective that means enqueued on its stream, not finished.
    ///
    /// # Errors
    /// The call's NCCL error; [`CommError::Aborted`] when the communicator was aborted, or the
    /// call was still in progress at the deadline.
    pub(crate) fn call(
        &self,
        op: &'static str,
        deadline: Instant,
        f: impl FnOnce(ncclComm_t) -> ncclResult_t,
    ) -> Result<()> {
        let status = {
            let guard = self.lock();
            let Some(h) = guard.as_ref() else {
                return Err(self.aborted(op));
            };
            f(h.0)
        };
        match status {
            ncclResult_t::ncclSuccess => Ok(()),
            ncclResult_t::ncclInProgress => self.settle(op, deadline).map_err(|e| match e {
                Settle::Failed(e) => e,
                Settle::TimedOut => CommError::Aborted(format!(
                    "nccl {op} on rank {} of group '{}' was still being issued at its deadline",
                    self.rank, self.group
                )),
            }),
            code => Err(self.error(op, code)),
        }
    }

    /// The communicator's asynchronous error, if it has one (`ncclCommGetAsyncError`), as a
    /// description for the watchdog. An aborted communicator reports none.
    pub(crate) fn async_error(&self) -> std::result::Result<(), String> {
        let guard = self.lock();
        let Some(h) = guard.as_ref() else {
            return Ok(());
        };
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: the handle is live (we hold the mutex and it was not aborted); `state` is
        // valid for writes.
        let status = unsafe { sys::ncclCommGetAsyncError(h.0, &mut state) };
        match (status, state) {
            (
                ncclResult_t::ncclSuccess,
                ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress,
            ) => Ok(()),
            (ncclResult_t::ncclSuccess, code) | (code, _) => Err(format!(
                "ncclCommGetAsyncError reports {code:?} ({}){}",
                nccl_hint(code),
                last_error_detail()
            )),
        }
    }

    /// Aborts the communicator (`ncclCommAbort`): work inside it stops and its resources are
    /// freed. Idempotent; safe from any thread (waits for a call in progress to return, which
    /// on a non-blocking communicator is immediate). Bounded: `ncclCommAbort` blocks (NCCL
    /// makes it a blocking group call even on a non-blocking communicator), and a stuck proxy
    /// or network can keep it there, so it runs on a thread of its own that is given up on
    /// after [`ABORT_WAIT`].
    pub(crate) fn abort(&self) {
        let Some(h) = self.lock().take() else {
            return;
        };
        let (group, rank) = (&self.group, self.rank);
        let ctx = self.ctx.clone();
        let abort = move || {
            let h = h; // the whole `Send` handle, not its raw field
            let _ = ctx.bind_to_thread();
            // SAFETY: the handle was live and is no longer reachable by anyone else.
            unsafe { sys::ncclCommAbort(h.0) }
        };
        match run_bounded(format!("ddp-nccl-abort-{rank}"), ABORT_WAIT, abort) {
            // "In progress" is not expected; the handle is not touched again either way.
            Bounded::Done(ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress) => {}
            Bounded::Done(status) => {
                tracing::warn!(%group, rank, ?status, "ncclCommAbort failed")
            }
            Bounded::Panicked => tracing::error!(%group, rank, "ncclCommAbort panicked"),
            Bounded::TimedOut => tracing::error!(
                %group,
                rank,
                "ncclCommAbort has not returned after {ABORT_WAIT:?}; going on without it"
            ),
            Bounded::NotStarted(e) => {
                tracing::error!(%group, rank, error = %e, "could not start the thread that aborts the NCCL communicator; it is left as it is")
            }
        }
    }

    /// Finalises and destroys the communicator after its work has completed, waiting up to
    /// `timeout` for the finalisation; aborts it instead when that fails or takes longer.
    pub(crate) fn close(&self, timeout: Duration) {
        let deadline = crate::deadline::deadline_after(timeout);
        let finalised = self.call("finalize", deadline, |c| {
            // SAFETY: `c` is live for the call (RawComm::call holds the mutex).
            unsafe { sys::ncclCommFinalize(c) }
        });
        if let Err(e) = finalised {
            tracing::warn!(group = %self.group, rank = self.rank, error = %e, "finalising the NCCL communicator failed; aborting it");
            self.abort();
            return;
        }
        let taken = self.lock().take();
        if let Some(h) = taken {
            // SAFETY: finalised, live, and no longer reachable by anyone else.
            let status = unsafe { sys::ncclCommDestroy(h.0) };
            if status != ncclResult_t::ncclSuccess {
                tracing::warn!(group = %self.group, rank = self.rank, ?status, "ncclCommDestroy failed");
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Handle>> {
        self.handle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Polls `ncclCommGetAsyncError` until the call in progress has finished or `deadline`.
    fn settle(&self, op: &'static str, deadline: Instant) -> std::result::Result<(), Settle> {
        let mut polls = 0u32;
        loop {
            let state = {
                let guard = self.lock();
                let Some(h) = guard.as_ref() else {
                    return Err(Settle::Failed(self.aborted(op)));
                };
                let mut state = ncclResult_t::ncclInProgress;
                // SAFETY: live handle under the mutex; `state` is valid for writes.
                let status = unsafe { sys::ncclCommGetAsyncError(h.0, &mut state) };
                if status != ncclResult_t::ncclSuccess {
                    return Err(Settle::Failed(self.error(op, status)));
                }
                state
            };
            match state {
                ncclResult_t::ncclSuccess => return Ok(()),
                ncclResult_t::ncclInProgress if Instant::now() < deadline => {
                    polls = polls.saturating_add(1);
                    if polls < SPINS {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(POLL);
                    }
                }
                ncclResult_t::ncclInProgress => return Err(Settle::TimedOut),
                code => return Err(Settle::Failed(self.error(op, code))),
            }
        }
    }

    fn error(&self, op: &'static str, code: ncclResult_t) -> CommError {
        NcclError::Nccl {
            op,
            group: self.group.clone(),
            rank: self.rank,
            code,
            hint: nccl_hint(code),
            detail: last_error_detail(),
        }
        .into()
    }

    fn aborted(&self, op: &'static str) -> CommError {
        CommError::Aborted(format!(
            "nccl {op}: the communicator of group '{}' on rank {} was aborted",
            self.group, self.rank
        ))
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        // Normally closed or aborted already; a handle left here is aborted (never waited on).
        self.abort();
    }
}

/// How polling a call in progress ended, when not in success.
enum Settle {
    Failed(CommError),
    TimedOut,
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`, in the NCCL 2.14 layout (see
/// [`CONFIG_VERSION_2_14`]).
fn nonblocking_config() -> sys::ncclConfig_t {
    // SAFETY: ncclConfig_t is plain data (integers and nullable pointers); all-zero is a valid
    // value, and the fields NCCL reads are set below.
    let mut config: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    config.size = std::mem::offset_of!(sys::ncclConfig_t, netName)
        + std::mem::size_of::<*const std::ffi::c_char>();
    config.magic = CONFIG_MAGIC;
    config.version = CONFIG_VERSION_2_14;
    config.blocking = 0;
    config.cgaClusterSize = UNDEF_INT;
    config.minCTAs = UNDEF_INT;
    config.maxCTAs = UNDEF_INT;
    config.netName = std::ptr::null();
    config
}
