//! The communication thread of an [`NcclBackend`](super::NcclBackend).
//!
//! One thread creates the CUDA context, the group's stream, the communicator ([`RawComm`]) and
//! the group's [`Watchdog`], keeps them for the group's life, and runs the jobs that callers on
//! any thread submit through a channel, in issue order (the order NCCL needs on every rank).
//! The same pattern as the CPU transports' thread (`group/transport_thread.rs`).
//!
//! Every collective is queued with CUDA events before and after it and handed to the watchdog,
//! which polls the end event and `ncclCommGetAsyncError` and aborts the communicator when a
//! collective outlives the timeout. Nothing here waits on the stream while a collective may
//! still be in flight: waits go through the watchdog, which bounds them.
//!
//! After any failure (NCCL, CUDA, a panic, the watchdog) the group is failed through the
//! watchdog, and every later call gets its error: NCCL documents a communicator as unusable
//! after an error.

use super::clock::{GpuClock, timed_event};
use super::raw_comm::RawComm;
use super::work::{EventProbe, NcclWork};
use crate::error::NcclError;
use crate::error::{CommError, Result, panic_message};
use crate::store::Store;
use crate::watchdog::{CollectiveLabel, Watchdog, WatchdogConfig, WatchdogFailer};
use crate::work::{Job, JobThread, Work, serve};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use cudarc::nccl::Id;
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclResult_t};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How much longer than the group's timeout issuing a collective may take before the call
/// itself gives up: the watchdog, which times the call from before it, fails it first.
const ISSUE_GRACE: Duration = Duration::from_secs(1);

/// What the communicator needs to start.
pub(crate) struct InitSpec {
    pub(crate) group: String,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) device: usize,
    pub(crate) id: Id,
    pub(crate) store: Store,
    pub(crate) timeout: Duration,
}

/// What jobs run against on the communication thread.
pub(crate) struct CommState {
    comm: Arc<RawComm>,
    pub(crate) stream: Arc<CudaStream>,
    watchdog: Watchdog,
    clock: Arc<GpuClock>,
    group: String,
    device: usize,
    timeout: Duration,
}

impl CommState {
    /// Maps a driver error to one naming the op and the device.
    pub(crate) fn cuda(&self, op: &'static str) -> impl FnOnce(DriverError) -> CommError {
        let device = self.device;
        move |e| NcclError::cuda(op, device)(e).into()
    }

    /// Queues one collective on the group's stream between two timing events, supervised by
    /// the watchdog from before the NCCL call (so a call that waits for a missing peer while
    /// it is issued times out naming its sequence number and the ranks behind). `call` gets
    /// the communicator and the stream and makes the NCCL call.
    pub(crate) fn enqueue(
        &mut self,
        label: CollectiveLabel,
        bytes: usize,
        call: impl FnOnce(ncclComm_t, cudaStream_t) -> ncclResult_t,
    ) -> Result<NcclWork> {
        let queued = Instant::now();
        let start = timed_event(&self.stream).map_err(self.cuda("recording an event"))?;
        let stream = self.stream.cu_stream() as cudaStream_t;
        let probe = Arc::new(EventProbe::default());
        let watched = self.watchdog.issue(label, bytes, probe.clone())?;
        // The watchdog fails the call at `timeout` (aborting the communicator, which ends the
        // issuing wait); this deadline only backs it up.
        let deadline = crate::deadline::deadline_after(self.timeout.saturating_add(ISSUE_GRACE));
        self.comm.call(label.op, deadline, |c| call(c, stream))?;
        let end = Arc::new(timed_event(&self.stream).map_err(self.cuda("recording an event"))?);
        probe.set(end.clone());
        Ok(NcclWork {
            watched,
            start,
            end,
            clock: self.clock.clone(),
            queued,
            device: self.device,
        })
    }

    /// Waits until every collective queued so far has finished on the GPU (bounded by the
    /// watchdog), then for the rest of the stream (work that cannot wait for a peer).
    pub(crate) fn drain(&mut self, op: &'static str) -> Result<()> {
        self.watchdog.wait_idle()?;
        self.stream.synchronize().map_err(self.cuda(op))
    }

    /// Runs one job unless the group already failed; a failure other than a rejected argument
    /// (checked before anything is queued) fails the group through the watchdog (which aborts
    /// the communicator), so every later call gets the watchdog's error.
    fn run<R>(
        &mut self,
        op: &'static str,
        job: impl FnOnce(&mut CommState) -> Result<R>,
    ) -> Result<R> {
        self.watchdog.check()?;
        let _span = tracing::trace_span!("nccl", op, group = %self.group).entered();
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
            && !matches!(
                e,
                CommError::InvalidArgument { .. } | CommError::Watchdog(_)
            )
        {
            tracing::error!(group = %self.group, op, error = %e, "nccl group failed; it is now unusable");
            // This caller gets its own error and everyone else the watchdog's, unless the
            // communicator was aborted under this call (by the watchdog): then the watchdog's
            // error says why.
            let watchdog_error = self.watchdog.fail(format!("{op}: {e}"));
            if matches!(e, CommError::Aborted(_)) {
                return Err(watchdog_error);
            }
        }
        result
    }
}

/// Handle to the communication thread; dropping it lets queued jobs finish and joins it.
pub(crate) struct CommThread {
    thread: JobThread<CommState>,
    /// Fails the group without waiting for the thread (which may be blocked in a job).
    failer: WatchdogFailer,
}

impl std::fmt::Debug for CommThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommThread").finish_non_exhaustive()
    }
}

impl CommThread {
    /// Starts the thread and waits until its communicator exists, which is when every rank of
    /// the group has joined, or the timeout ran out.
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
            let handles = (
                state.stream.context().clone(),
                state.stream.clone(),
                state.watchdog.failer(),
            );
            if ready_tx.send(Ok(handles)).is_ok() {
                serve_then_close(jobs, state);
            }
        })
        .map_err(|e| CommError::io("starting the NCCL communication thread", e))?;
        let (ctx, stream, failer) = ready_rx.recv().unwrap_or_else(|_| {
            Err(CommError::Aborted(
                "the NCCL communication thread exited during initialisation".into(),
            ))
        })?;
        Ok((CommThread { thread, failer }, ctx, stream))
    }

    /// Fails the group now, from the calling thread: see [`NcclBackend::abort`](super::NcclBackend::abort).
    pub(crate) fn fail(&self, why: &str) -> CommError {
        self.failer.fail(why)
    }

    /// The group's failure, if it has failed: see [`NcclBackend::check`](super::NcclBackend::check).
    pub(crate) fn check(&self) -> Result<()> {
        self.failer.check()
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
/// default stream), the communicator (with the timeout) and its watchdog, on this thread.
fn init(spec: InitSpec) -> Result<CommState> {
    let InitSpec {
        group,
        rank,
        world_size,
        device,
        id,
        store,
        timeout,
    } = spec;
    let ctx = CudaContext::new(device).map_err(NcclError::cuda("creating the context", device))?;
    let stream = ctx
        .new_stream()
        .map_err(NcclError::cuda("creating the stream", device))?;
    ctx.bind_to_thread()
        .map_err(NcclError::cuda("binding the context", device))?;
    let clock = GpuClock::start(&stream).map_err(NcclError::cuda("recording an event", device))?;
    tracing::debug!(%group, rank, world_size, device, ?timeout, "joining the NCCL communicator");
    let comm = Arc::new(RawComm::init(
        &id,
        rank,
        world_size,
        &group,
        timeout,
        ctx.clone(),
    )?);
    let version = cudarc::nccl::result::get_nccl_version().unwrap_or(0);
    let (abort_comm, probe_comm) = (comm.clone(), comm.clone());
    let watchdog = Watchdog::start(
        &store,
        WatchdogConfig::new(group.clone(), rank, world_size, timeout),
        Box::new(move || abort_comm.abort()),
        Some(Box::new(move || probe_comm.async_error())),
    );
    let watchdog = match watchdog {
        Ok(w) => w,
        Err(e) => {
            comm.abort();
            return Err(e);
        }
    };
    tracing::info!(%group, rank, world_size, device, nccl_version = version, "nccl group ready");
    Ok(CommState {
        comm,
        stream,
        watchdog,
        clock: Arc::new(clock),
        group,
        device,
        timeout,
    })
}

/// Runs the jobs until the group is dropped, then tears the communicator down: waits (bounded
/// by the watchdog) for the collectives in flight, then finalises and destroys it; a group that
/// failed was aborted already.
fn serve_then_close(jobs: Receiver<Job<CommState>>, state: CommState) {
    let CommState {
        comm,
        stream,
        watchdog,
        group,
        timeout,
        ..
    } = serve(jobs, state);
    let idle = watchdog.wait_idle();
    drop(watchdog);
    match idle {
        Ok(()) => {
            if let Err(e) = stream.synchronize() {
                tracing::warn!(%group, error = ?e, "synchronising the NCCL stream at shutdown failed");
            }
            comm.close(timeout);
        }
        Err(e) => {
            tracing::warn!(%group, error = %e, "the NCCL group failed before shutdown; its communicator was aborted");
            comm.abort();
        }
    }
}
