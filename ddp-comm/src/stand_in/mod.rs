//! [`StandInComm`]: the CPU stand-in of the NCCL backend, so that the GPU engine's protocol
//! runs, and is tested, on machines without GPUs.
//!
//! NCCL cannot put two ranks on one GPU, and CI has none, so the code that drives
//! `NcclBackend` (feature `cuda`) with a peer (the issuing thread, the bucket order across
//! ranks, the watchdog, abort) would first run on a user's multi-GPU node. The stand-in offers
//! the same contract on host memory:
//! - **A communicator of its own**: a subgroup of the process group
//!   ([`ProcessGroup::new_group`] over every rank), as NCCL's communicator is separate from the
//!   CPU group that carries DDP's control messages.
//! - **A communication stream**: one thread per rank runs the collectives in issue order
//!   (FIFO), as NCCL's stream does; [`StandInComm::all_reduce_async`] returns once the
//!   collective is queued.
//! - **Done events and the watchdog**: each collective is supervised by the same
//!   [`Watchdog`] as NCCL's, with a completion probe set by the thread when the collective
//!   returns (NCCL's: a CUDA event). A collective that outlives the timeout, fails, or meets a
//!   peer's failure fails the communicator, naming the ranks behind.
//! - **Abort**: [`StandInComm::abort`] fails the communicator from any thread; a collective
//!   blocked on the thread returns at once (the subgroup's abort), and peers learn it within
//!   about a second, from the subgroup and from the watchdog's report in the store.
//!
//! Memory is [`StandInBuffer`]: host vectors that the thread reduces in place, as NCCL reduces
//! a device buffer in place.

mod work;

pub use work::{StandInBuffer, StandInWork};

use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::group::ProcessGroup;
use crate::locked;
use crate::reduce_op::ReduceOp;
use crate::watchdog::{CollectiveLabel, Watchdog, WatchdogConfig};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use work::DoneProbe;

type Job = Box<dyn FnOnce(&ProcessGroup) + Send>;

/// One rank's stand-in communicator: collectives on host buffers, queued in issue order on a
/// communication thread and supervised by a watchdog, as `NcclBackend` (feature `cuda`)
/// runs them on a GPU stream. Cheap to clone (clones share the communicator).
///
/// # Collective
/// Every rank must issue the same collectives in the same order. Unlike NCCL, a mismatch of
/// kind, dtype or length is detected (the subgroup compares every collective) and named.
///
/// # Example
/// ```
/// # use ddp_comm::{ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer, ReduceOp};
/// use ddp_comm::stand_in::{StandInBuffer, StandInComm};
/// use ddp_comm::watchdog::CollectiveLabel;
/// # let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new())?;
/// # let store = Store::connect(&server.local_addr().to_string(), StoreConfig::new())?;
/// # let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1))?;
/// let comm = StandInComm::new(&pg)?; // collective: every rank of `pg` calls it
/// let grads = StandInBuffer::new(vec![1.0f32, 3.0]);
/// let work = comm.all_reduce_async(&grads, ReduceOp::Avg, CollectiveLabel::new("all_reduce"))?;
/// work.wait()?; // done on the communication thread
/// assert_eq!(grads.take(), vec![1.0, 3.0]);
/// # Ok::<(), ddp_comm::CommError>(())
/// ```
#[derive(Clone, Debug)]
pub struct StandInComm {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` once shutting down.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Shared with the queued collectives (see [`settle_failure`]).
    watchdog: Arc<Watchdog>,
    /// The communicator's own subgroup; its abort is the watchdog's abort callback.
    group: ProcessGroup,
    name: String,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInComm")
            .field("name", &self.name)
            .field("rank", &self.group.rank())
            .field("world_size", &self.group.world_size())
            .finish_non_exhaustive()
    }
}

impl StandInComm {
    /// Creates the communicator of `pg`'s ranks: its own subgroup over every rank, its
    /// communication thread and its watchdog (timeout: `pg`'s).
    ///
    /// # Collective
    /// Every rank of `pg` calls it, in the same order relative to other subgroup creations.
    ///
    /// # Errors
    /// The subgroup's rendezvous failing; the store unreachable; a thread that cannot start.
    pub fn new(pg: &ProcessGroup) -> Result<StandInComm> {
        let all: Vec<usize> = pg.ranks().to_vec();
        let group = pg.new_group(&all)?.ok_or_else(|| {
            CommError::arg("StandInComm::new", "this rank is not a member of its group")
        })?;
        let name = format!("{}/stand-in", group.name());
        let aborting = group.clone();
        let abort = Box::new(move || {
            aborting.abort("the stand-in communicator was aborted (its watchdog failed)");
        });
        let config = WatchdogConfig::new(&name, group.rank(), group.world_size(), pg.timeout());
        let watchdog = Arc::new(Watchdog::start(group.store(), config, abort, None)?);
        let (jobs, queue) = mpsc::channel::<Job>();
        let on_thread = group.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ddp-stand-in-{}", group.rank()))
            .spawn(move || {
                for job in queue {
                    job(&on_thread);
                }
            })
            .map_err(|e| CommError::io("starting the stand-in's communication thread", e))?;
        tracing::debug!(group = %name, rank = group.rank(), "stand-in communicator ready");
        Ok(StandInComm {
            inner: Arc::new(Inner {
                jobs: Mutex::new(Some(jobs)),
                thread: Mutex::new(Some(thread)),
                watchdog,
                group,
                name,
            }),
        })
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.inner.group.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.inner.group.world_size()
    }

    /// The communicator's name (its watchdog's keys in the store).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Queues an in-place all-reduce of `buf` on the communication thread and returns at once,
    /// as `NcclBackend::all_reduce_raw_async` does.
    /// `buf` must not be read until the returned work is done (the thread locks it meanwhile).
    ///
    /// # Errors
    /// [`CommError::Watchdog`] once the communicator has failed; [`CommError::Destroyed`] when
    /// it is shutting down. The collective's own failure comes from [`StandInWork::wait`].
    pub fn all_reduce_async<T: Element>(
        &self,
        buf: &StandInBuffer<T>,
        op: ReduceOp,
        label: CollectiveLabel,
    ) -> Result<StandInWork> {
        let values = buf.clone();
        let bytes = buf.len() * std::mem::size_of::<T>();
        self.queue(label, bytes, move |group| {
            values.with_mut(|v| group.all_reduce(v, op))
        })
    }

    /// Queues a reduce-scatter: `send` holds `world_size` blocks of `recv.len()` elements;
    /// block `rank` of their reduction with `op` lands in `recv`, as
    /// `NcclBackend::reduce_scatter_raw_async` does. Neither buffer may be touched until the
    /// returned work is done.
    ///
    /// # Errors
    /// As [`all_reduce_async`](Self::all_reduce_async); mismatched lengths fail the work.
    pub fn reduce_scatter_async<T: Element>(
        &self,
        send: &StandInBuffer<T>,
        recv: &StandInBuffer<T>,
        op: ReduceOp,
        label: CollectiveLabel,
    ) -> Result<StandInWork> {
        let (send, recv) = (send.clone(), recv.clone());
        let bytes = send.len() * std::mem::size_of::<T>();
        self.queue(label, bytes, move |group| {
            send.with_mut(|s| recv.with_mut(|r| group.reduce_scatter(s, r, op)))
        })
    }

    /// Queues an all-gather: every rank's `send` lands in `recv`, rank `r`'s at
    /// `r * send.len()`, as `NcclBackend::all_gather_raw_async` does. Neither buffer may be
    /// touched until the returned work is done.
    ///
    /// # Errors
    /// As [`all_reduce_async`](Self::all_reduce_async); mismatched lengths fail the work.
    pub fn all_gather_async<T: Element>(
        &self,
        send: &StandInBuffer<T>,
        recv: &StandInBuffer<T>,
        label: CollectiveLabel,
    ) -> Result<StandInWork> {
        let (send, recv) = (send.clone(), recv.clone());
        let bytes = recv.len() * std::mem::size_of::<T>();
        self.queue(label, bytes, move |group| {
            send.with_mut(|s| recv.with_mut(|r| group.all_gather(s, r)))
        })
    }

    /// Queues `collective` on the communication thread, supervised by the watchdog from
    /// before it is queued (as NCCL's collectives are), and returns its done event.
    fn queue(
        &self,
        label: CollectiveLabel,
        bytes: usize,
        collective: impl FnOnce(&ProcessGroup) -> Result<()> + Send + 'static,
    ) -> Result<StandInWork> {
        let queued = Instant::now();
        let probe = Arc::new(DoneProbe::default());
        let watched = self.inner.watchdog.issue(label, bytes, probe.clone())?;
        let done = probe.clone();
        let watchdog = self.inner.watchdog.clone();
        let job: Job = Box::new(move |group| {
            let started = Instant::now();
            let result = collective(group);
            if result.is_err() {
                settle_failure(&watchdog);
            }
            done.set(started, result.map_err(|e| e.to_string()));
        });
        let sent = self
            .inner
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|jobs| jobs.send(job).is_ok());
        if sent != Some(true) {
            return Err(self
                .inner
                .watchdog
                .fail("the stand-in's communication thread has ended"));
        }
        Ok(StandInWork::new(watched, probe, queued))
    }

    /// The communicator's failure, if it has failed.
    ///
    /// # Errors
    /// [`CommError::Watchdog`] once the communicator has failed.
    pub fn check(&self) -> Result<()> {
        self.inner.watchdog.check()
    }

    /// Fails the communicator now, from any thread: a collective blocked on the communication
    /// thread returns, every waiter and every later call gets the error, and the peers learn it
    /// (the watchdog's report in the store, the subgroup's abort). Returns that error.
    pub fn abort(&self, reason: &str) -> CommError {
        self.inner.watchdog.fail(format!("aborted: {reason}"))
    }
}

/// After a collective failed on the communication thread, before its done event says so: gives
/// the watchdog the time to learn a peer's failure report (it checks the store every
/// `peer_check_interval`), or to time out itself, so that the communicator fails with the
/// first failing rank's reason (naming the rank behind) rather than with the transport error
/// its abort caused here ("rank 0 closed its connection"). A failing peer publishes its
/// report before it aborts, precisely so that peers can quote it; the transport error only
/// arrives sooner. Bounded: at most two peer checks and a second.
fn settle_failure(watchdog: &Watchdog) {
    let limit = watchdog.config().peer_check_interval * 2 + Duration::from_secs(1);
    let start = Instant::now();
    while watchdog.check().is_ok() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The thread ends once its queue is empty; every queued collective is bounded by the
        // subgroup's timeout.
        drop(locked::take(&self.jobs));
        if let Some(thread) = locked::take(&self.thread)
            && thread.join().is_err()
        {
            tracing::error!(group = %self.name, "the stand-in's communication thread panicked");
        }
    }
}
