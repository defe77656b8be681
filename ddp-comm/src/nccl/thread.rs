//! The communication thread of an [`NcclGroup`](super::NcclGroup).
//!
//! cudarc's `Comm` is neither `Send` nor `Sync`, so one thread creates the CUDA context, the
//! group's stream and the communicator, keeps them for the group's life, and runs the jobs that
//! callers on any thread submit through a channel, in issue order (the order NCCL needs on
//! every rank). The same pattern as the CPU transports' worker.
//!
//! After an NCCL failure, a CUDA failure or a panic the thread answers every later call with
//! [`CommError::Aborted`]: NCCL documents a communicator as unusable after an error.

use super::error::NcclError;
use super::library::last_error_detail;
use crate::error::{CommError, Result};
use crate::group::{Job, JobThread, Work, serve};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use cudarc::nccl::{Comm, Id, result::NcclError as RawNcclError};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};

/// What the communicator needs to start.
pub(crate) struct InitSpec {
    pub(crate) group: String,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) device: usize,
    pub(crate) id: Id,
}

/// What jobs run against on the communication thread.
pub(crate) struct CommState {
    pub(crate) comm: Comm,
    pub(crate) stream: Arc<CudaStream>,
    group: String,
    rank: usize,
    device: usize,
    failed: Option<String>,
}

impl CommState {
    /// Maps an NCCL result code to an error naming the op, the rank and the group.
    pub(crate) fn nccl(&self, op: &'static str) -> impl FnOnce(RawNcclError) -> CommError + '_ {
        move |e| nccl_error(op, &self.group, self.rank, e)
    }

    /// Maps a driver error to one naming the op and the device.
    pub(crate) fn cuda(&self, op: &'static str) -> impl FnOnce(DriverError) -> CommError {
        let device = self.device;
        move |e| NcclError::cuda(op, device)(e).into()
    }

    /// Runs one job unless the group already failed; a failure other than a rejected argument
    /// (checked before anything is queued) marks the group failed.
    fn run<R>(
        &mut self,
        op: &'static str,
        job: impl FnOnce(&mut CommState) -> Result<R>,
    ) -> Result<R> {
        if let Some(first) = &self.failed {
            return Err(CommError::Aborted(first.clone()));
        }
        let _span =
            tracing::trace_span!("nccl", op, group = %self.group, rank = self.rank).entered();
        let result = match std::panic::catch_unwind(AssertUnwindSafe(|| job(self))) {
            // Errors from cudarc's drops are parked in the context; surface them here.
            Ok(Ok(r)) => self
                .stream
                .context()
                .check_err()
                .map(|()| r)
                .map_err(self.cuda("a deferred CUDA operation")),
            Ok(Err(e)) => Err(e),
            Err(panic) => Err(CommError::Aborted(format!(
                "the NCCL communication thread panicked in {op}: {}",
                panic_message(&*panic)
            ))),
        };
        if let Err(e) = &result
            && !matches!(e, CommError::InvalidArgument { .. })
        {
            tracing::error!(group = %self.group, rank = self.rank, op, error = %e, "nccl group failed; it is now unusable");
            self.failed = Some(e.to_string());
        }
        result
    }
}

/// Handle to the communication thread; dropping it lets queued jobs finish and joins it.
pub(crate) struct CommThread {
    thread: JobThread<CommState>,
}

impl std::fmt::Debug for CommThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommThread").finish_non_exhaustive()
    }
}

impl CommThread {
    /// Starts the thread and waits until its communicator exists, which is when every rank of
    /// the group has joined (NCCL's init has no timeout of its own).
    pub(crate) fn start(spec: InitSpec) -> Result<(CommThread, Arc<CudaContext>, Arc<CudaStream>)> {
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let name = format!("ddp-nccl-{}", spec.rank);
        let thread = JobThread::spawn(name, move |jobs: Receiver<Job<CommState>>| {
            let state = match std::panic::catch_unwind(AssertUnwindSafe(|| init(spec))) {
                Ok(Ok(state)) => state,
                Ok(Err(e)) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                Err(panic) => {
                    let _ = ready_tx.send(Err(CommError::Aborted(format!(
                        "NCCL initialisation panicked: {}",
                        panic_message(&*panic)
                    ))));
                    return;
                }
            };
            let handles = (state.stream.context().clone(), state.stream.clone());
            if ready_tx.send(Ok(handles)).is_ok() {
                serve_then_close(jobs, state);
            }
        })
        .map_err(|e| CommError::io("starting the NCCL communication thread", e))?;
        let (ctx, stream) = ready_rx.recv().unwrap_or_else(|_| {
            Err(CommError::Aborted(
                "the NCCL communication thread exited during initialisation".into(),
            ))
        })?;
        Ok((CommThread { thread }, ctx, stream))
    }

    /// Queues a job that owns its data; its result arrives through the returned [`Work`].
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        op: &'static str,
        job: impl FnOnce(&mut CommState) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        self.thread.submit(move |s| s.run(op, job))
    }

    /// Runs a job that borrows the caller's buffers on the communication thread, blocking until
    /// it has finished.
    pub(crate) fn run_blocking<'a, R: Send + 'a>(
        &self,
        op: &'static str,
        job: impl FnOnce(&mut CommState) -> Result<R> + Send + 'a,
    ) -> Result<R> {
        self.thread.run_blocking(move |s| s.run(op, job))
    }
}

/// Creates the context, the group's own stream (so collectives never wait behind compute on the
/// default stream) and the communicator, on this thread.
fn init(spec: InitSpec) -> Result<CommState> {
    let InitSpec {
        group,
        rank,
        world_size,
        device,
        id,
    } = spec;
    let ctx = CudaContext::new(device).map_err(NcclError::cuda("creating the context", device))?;
    let stream = ctx
        .new_stream()
        .map_err(NcclError::cuda("creating the stream", device))?;
    tracing::debug!(%group, rank, world_size, device, "joining the NCCL communicator");
    let comm = Comm::from_rank(stream.clone(), rank, world_size, id)
        .map_err(|e| nccl_error("init", &group, rank, e))?;
    let version = cudarc::nccl::result::get_nccl_version().unwrap_or(0);
    tracing::info!(%group, rank, world_size, device, nccl_version = version, "nccl group ready");
    Ok(CommState {
        comm,
        stream,
        group,
        rank,
        device,
        failed: None,
    })
}

/// Runs the jobs until the group is dropped, then tears the communicator down.
fn serve_then_close(jobs: Receiver<Job<CommState>>, state: CommState) {
    let CommState {
        comm,
        stream,
        group,
        failed,
        ..
    } = serve(jobs, state);
    // Let queued GPU work finish before the communicator goes (dropping it aborts it), unless
    // the group failed: then a peer may never arrive and waiting could hang.
    if failed.is_none()
        && let Err(e) = stream.synchronize()
    {
        tracing::warn!(%group, error = ?e, "synchronising the NCCL stream at shutdown failed");
    }
    // cudarc panics if ncclCommAbort fails; keep that from escaping the thread.
    if std::panic::catch_unwind(AssertUnwindSafe(|| drop(comm))).is_err() {
        tracing::warn!(%group, "destroying the NCCL communicator failed");
    }
}

fn nccl_error(op: &'static str, group: &str, rank: usize, e: RawNcclError) -> CommError {
    NcclError::Nccl {
        op,
        group: group.to_string(),
        rank,
        code: e.0,
        hint: super::error::hint(e.0),
        detail: last_error_detail(),
    }
    .into()
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
