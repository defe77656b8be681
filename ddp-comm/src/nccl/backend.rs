//! [`NcclBackend`]: construction, accessors and the collectives on device buffers.

use super::calls::{Buffers, Call};
use super::config::NcclBackendConfig;
use super::dtype::NcclDtype;
use super::element::NcclElement;
use super::library::{cuda_device_count, require_driver, require_nccl};
use super::thread::{CommThread, InitSpec};
use super::unique_id;
use super::work::NcclWork;
use crate::error::NcclError;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;
use crate::store::Store;
use crate::watchdog::CollectiveLabel;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::Id;
use std::sync::Arc;

/// An NCCL communicator for one rank: collectives on CUDA buffers between the processes of a
/// job, one GPU each. Cheap to clone (clones share the communicator).
///
/// The usual way to get one is as the CUDA backend of a process group,
/// [`ProcessGroup::nccl`](crate::ProcessGroup::nccl): the same ranks, created on first use and kept with the group.
/// [`NcclBackend::new`] creates one alone, from a store and a config (another name, device or
/// timeout).
///
/// # Collective
/// Every rank of the group must issue the same collectives, with the same sizes, in the same
/// order. Unlike [`ProcessGroup`](crate::ProcessGroup), NCCL cannot detect a mismatch: it hangs or corrupts data.
///
/// # Completion
/// A device collective returns once NCCL has queued it on the group's [stream](Self::stream);
/// the GPU runs it later. cudarc records the buffers' use, so later work on them through cudarc,
/// on any stream, waits for the collective; [`NcclBackend::synchronize`] waits on the host.
/// The `*_host` methods return when the result is in host memory.
///
/// # Failure
/// A watchdog supervises every collective ([`crate::watchdog`]): one that has not finished on
/// the GPU [`timeout`](NcclBackendConfig::timeout) after it was queued, or an asynchronous NCCL
/// error, aborts the communicator (`ncclCommAbort`), and every waiter and every later call gets
/// [`CommError::Watchdog`] naming the collective (sequence number, op, bucket, bytes) and the
/// ranks that never issued it, or saying that all issued it and none finished (a network or
/// NCCL failure). The same happens after any other NCCL or CUDA failure.
///
/// # Shutdown
/// Dropping the last clone waits for the collectives in flight (at most the timeout, then the
/// communicator is aborted), finalises and destroys the communicator and joins its thread.
///
/// # Example
/// ```no_run
/// use ddp_comm::{InitMethod, ProcessGroupConfig, ReduceOp, init_process_group};
/// // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as torchrun or ddp-run set them
/// let pg = init_process_group(&InitMethod::Env, ProcessGroupConfig::from_env()?)?;
/// let nccl = pg.nccl(pg.local_rank())?; // the group's NCCL backend, on this rank's GPU
/// let mut grads = nccl.stream().clone_htod(&[1.0f32; 1024]).expect("device memory");
/// nccl.all_reduce(&mut grads, ReduceOp::Avg)?; // queued on the group's stream
/// nccl.synchronize()?; // finished on the GPU
/// let mut loss = [0.25f64];
/// nccl.all_reduce_host(&mut loss, ReduceOp::Avg)?; // host slice: returns with the result
/// # Ok::<(), ddp_comm::CommError>(())
/// ```
#[derive(Clone, Debug)]
pub struct NcclBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    thread: CommThread,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    config: NcclBackendConfig,
}

impl NcclBackend {
    /// Joins an NCCL group through `store`: rank 0 creates the unique id and publishes it under
    /// `nccl/<name>/unique_id`; the others wait for it (up to the store's timeout). Then every
    /// rank creates its communicator, which returns once all ranks have joined, or fails with
    /// [`NcclError::InitTimeout`] when they have not within the config's timeout. The group's
    /// watchdog publishes its progress in `store` under `watchdog/<name>/<rank>`.
    ///
    /// # Collective
    /// Every rank calls it with the same `world_size` and `name`.
    ///
    /// # Errors
    /// An invalid config; [`NcclError::DriverNotFound`], [`NcclError::LibraryNotFound`] or
    /// [`NcclError::NoSuchDevice`] when this machine cannot run NCCL
    /// ([`NcclError::is_unavailable`]); a store timeout naming the key when rank 0 does not
    /// publish; [`NcclError::NameInUse`] on rank 0 when the name was used before in this
    /// store; [`NcclError::InitTimeout`]; NCCL and CUDA failures while creating the
    /// communicator.
    pub fn new(store: &Store, config: NcclBackendConfig) -> Result<NcclBackend> {
        config.validate()?;
        // NCCL_COMM_BLOCKING=1 overrides the non-blocking config: init would have no timeout and
        // a call could block inside NCCL where the watchdog cannot abort it.
        if std::env::var("NCCL_COMM_BLOCKING").is_ok_and(|v| v.trim() == "1") {
            return Err(CommError::arg(
                "NcclBackend::new",
                "NCCL_COMM_BLOCKING=1 makes NCCL's calls blocking, which the watchdog cannot \
                 time out or abort; unset it"
                    .to_string(),
            ));
        }
        // Check what cudarc would otherwise panic on, before anything touches CUDA or NCCL.
        require_driver()?;
        require_nccl()?;
        let count = cuda_device_count()?;
        if config.device >= count {
            return Err(NcclError::NoSuchDevice {
                device: config.device,
                count,
            }
            .into());
        }
        let _span = tracing::info_span!("nccl_group", name = %config.name, rank = config.rank, world_size = config.world_size, device = config.device).entered();
        let id = unique_id::exchange(store, &config.name, config.rank, || new_unique_id(&config))?;
        let (thread, context, stream) = CommThread::start(InitSpec {
            group: config.name.clone(),
            rank: config.rank,
            world_size: config.world_size,
            device: config.device,
            id,
            store: store.clone(),
            timeout: config.timeout,
        })?;
        Ok(NcclBackend {
            inner: Arc::new(Inner {
                thread,
                context,
                stream,
                config,
            }),
        })
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.inner.config.rank
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.inner.config.world_size
    }

    /// The CUDA device ordinal this rank drives.
    pub fn device(&self) -> usize {
        self.inner.config.device
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// The CUDA context of the group's device (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.context
    }

    /// The stream the group's collectives run on. Allocating buffers on it avoids
    /// cross-stream waits.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// Reduces `buf` across ranks in place with `op`.
    ///
    /// # Collective
    /// Every rank calls it with a buffer of the same length. Afterwards (in stream order) every
    /// rank's buffer holds the same result.
    ///
    /// # Errors
    /// A buffer on another device; NCCL failures ([`NcclError::Nccl`]); the watchdog's error
    /// once the group has failed.
    pub fn all_reduce<T, B>(&self, buf: &mut B, op: ReduceOp) -> Result<()>
    where
        T: NcclElement,
        B: DevicePtrMut<T> + Send,
    {
        self.check_device("all_reduce", buf.stream())?;
        self.inner.thread.run_blocking("all_reduce", move |s| {
            // SAFETY: the buffer is on the group's device and stream (checked above), and the
            // watchdog supervises the work.
            unsafe { s.queue_in_place(Call::AllReduce(op), "all_reduce", buf, |_queued| Ok(())) }
        })
    }

    /// Enqueues an in-place all-reduce of `len` elements of `dtype` at device address `ptr` on
    /// the group's stream and returns at once. The returned [`NcclWork`] is supervised by the
    /// group's watchdog; [`NcclWork::wait`] returns when it finished on the GPU, with its
    /// timing. For a DDP engine that holds gradients in buffers it does not own as cudarc
    /// slices (e.g. a burn tensor's storage).
    ///
    /// # Collective
    /// Every rank calls it with the same `len`, `dtype` and `op`, in the same order as its
    /// other collectives.
    ///
    /// # Safety
    /// `ptr` is a device allocation on this group's device (same primary context) holding at
    /// least `len` elements of `dtype`, that no other stream writes or reads until the returned
    /// work has completed, and that stays alive until then. When the work ends with the
    /// watchdog's error, the communicator has been aborted, which stops NCCL's kernels; if the
    /// abort did not return within its 10 s bound the kernels may still run, so a caller that
    /// keeps the process (and its memory pool) going should not hand the buffer to anything
    /// else after such a failure.
    ///
    /// # Errors
    /// NCCL failures; the watchdog's error once the group has failed.
    pub unsafe fn all_reduce_raw_async(
        &self,
        ptr: u64,
        len: usize,
        dtype: NcclDtype,
        op: ReduceOp,
        label: CollectiveLabel,
    ) -> Result<NcclWork> {
        let buffers = Buffers::raw(ptr, ptr, len, dtype, 1);
        // SAFETY: the caller guarantees that `ptr` holds `len` elements of `dtype` on this
        // device, untouched by other streams until the work completes.
        unsafe { self.queue_raw(Call::AllReduce(op), label, buffers) }
    }

    /// Enqueues a reduce-scatter on the group's stream and returns at once: `src` holds
    /// `world_size` blocks of `count` elements of `dtype`; block `rank` of their reduction with
    /// `op` lands at `dst`. For engines that hold burn tensors' storage, as
    /// [`all_reduce_raw_async`](Self::all_reduce_raw_async).
    ///
    /// # Collective
    /// Every rank calls it with the same `count`, `dtype` and `op`, in the same order as its
    /// other collectives.
    ///
    /// # Safety
    /// As [`all_reduce_raw_async`](Self::all_reduce_raw_async), for both buffers: `src` holds
    /// `count * world_size` elements and `dst` `count`, on this group's device; they do not
    /// overlap.
    ///
    /// # Errors
    /// NCCL failures; the watchdog's error once the group has failed.
    pub unsafe fn reduce_scatter_raw_async(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: NcclDtype,
        op: ReduceOp,
        label: CollectiveLabel,
    ) -> Result<NcclWork> {
        let buffers = Buffers::raw(src, dst, count, dtype, self.world_size());
        // SAFETY: the caller guarantees both buffers' sizes, device and exclusivity.
        unsafe { self.queue_raw(Call::ReduceScatter(op), label, buffers) }
    }

    /// Enqueues an all-gather on the group's stream and returns at once: every rank's `count`
    /// elements of `dtype` at `src` land at `dst`, rank `r`'s at element `r * count`. For
    /// engines that hold burn tensors' storage, as
    /// [`all_reduce_raw_async`](Self::all_reduce_raw_async).
    ///
    /// # Collective
    /// Every rank calls it with the same `count` and `dtype`, in the same order as its other
    /// collectives.
    ///
    /// # Safety
    /// As [`all_reduce_raw_async`](Self::all_reduce_raw_async), for both buffers: `src` holds
    /// `count` elements and `dst` `count * world_size`, on this group's device; they do not
    /// overlap.
    ///
    /// # Errors
    /// NCCL failures; the watchdog's error once the group has failed.
    pub unsafe fn all_gather_raw_async(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: NcclDtype,
        label: CollectiveLabel,
    ) -> Result<NcclWork> {
        let buffers = Buffers::raw(src, dst, count, dtype, self.world_size());
        // SAFETY: the caller guarantees both buffers' sizes, device and exclusivity.
        unsafe { self.queue_raw(Call::AllGather, label, buffers) }
    }

    /// Queues `call` on `buffers` (raw device addresses) on the group's stream and returns its
    /// work at once.
    ///
    /// # Safety
    /// As [`all_reduce_raw_async`](Self::all_reduce_raw_async), for every buffer `buffers`
    /// names.
    unsafe fn queue_raw(
        &self,
        call: Call,
        label: CollectiveLabel,
        buffers: Buffers,
    ) -> Result<NcclWork> {
        self.inner.thread.run_blocking(label.op, move |s| {
            // SAFETY: forwarded from the caller.
            unsafe { s.queue(call, label, buffers) }
        })
    }

    /// Copies `root`'s `buf` into every other rank's `buf`.
    ///
    /// # Collective
    /// Every rank calls it with the same `root` and buffer length.
    ///
    /// # Errors
    /// `root` out of range; a buffer on another device; NCCL failures.
    pub fn broadcast<T, B>(&self, buf: &mut B, root: usize) -> Result<()>
    where
        T: NcclElement,
        B: DevicePtrMut<T> + Send,
    {
        self.check_device("broadcast", buf.stream())?;
        let root = self.check_root("broadcast", root)?;
        self.inner.thread.run_blocking("broadcast", move |s| {
            // SAFETY: the buffer is on the group's device and stream (checked above), and the
            // watchdog supervises the work.
            unsafe {
                s.queue_in_place(Call::Broadcast { root }, "broadcast", buf, |_queued| Ok(()))
            }
        })
    }

    /// Gathers every rank's `send` into `recv`, rank `r`'s block at `r * send.len()`.
    ///
    /// # Collective
    /// Every rank calls it with the same `send` length; `recv` holds `world_size` blocks.
    ///
    /// # Errors
    /// Mismatched lengths; buffers on another device; NCCL failures.
    pub fn all_gather<T, S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        T: NcclElement,
        S: DevicePtr<T> + Sync,
        R: DevicePtrMut<T> + Send,
    {
        let (block, whole) = (send.len(), recv.len());
        self.run_between(Call::AllGather, "all_gather", send, recv, block, whole)
    }

    /// Reduces `send` (`world_size` blocks of `recv.len()`) across ranks with `op` and leaves
    /// block `rank` of the result in `recv`.
    ///
    /// # Collective
    /// Every rank calls it with the same lengths and `op`.
    ///
    /// # Errors
    /// Mismatched lengths; buffers on another device; NCCL failures.
    pub fn reduce_scatter<T, S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        T: NcclElement,
        S: DevicePtr<T> + Sync,
        R: DevicePtrMut<T> + Send,
    {
        let (block, whole) = (recv.len(), send.len());
        let call = Call::ReduceScatter(op);
        self.run_between(call, "reduce_scatter", send, recv, block, whole)
    }

    /// The collectives from `send` into `recv` on device buffers (all-gather, reduce-scatter):
    /// checks that both buffers are on the group's device and that the one of `whole` elements
    /// holds `world_size` blocks of `block` (NCCL's per-rank count), then queues `call`.
    fn run_between<T, S, R>(
        &self,
        call: Call,
        op: &'static str,
        send: &S,
        recv: &mut R,
        block: usize,
        whole: usize,
    ) -> Result<()>
    where
        T: NcclElement,
        S: DevicePtr<T> + Sync,
        R: DevicePtrMut<T> + Send,
    {
        self.check_device(op, send.stream())?;
        self.check_device(op, recv.stream())?;
        self.check_blocks(op, block, whole)?;
        self.inner.thread.run_blocking(op, move |s| {
            // SAFETY: the buffers are on the group's device and stream, sized for the call
            // (checked above), and the watchdog supervises the work.
            unsafe { s.queue_between(call, op, send, recv, block, |_queued| Ok(())) }
        })
    }

    /// Fails the group now, from any thread, for a reason outside NCCL (DDP calls it when a
    /// step fails on this rank): the communicator is aborted, so collectives in flight end and
    /// every waiter and later call on this rank gets the watchdog's error with `reason`; and
    /// `reason` is published in the store first, so every peer's watchdog aborts once it sees
    /// it (it checks every second; its own abort and report take up to about a second more),
    /// quoting this rank, instead of waiting for its timeout. Returns that
    /// error (or the group's earlier failure).
    pub fn abort(&self, reason: &str) -> CommError {
        self.inner.thread.fail(reason)
    }

    /// The group's failure, if it has failed (its watchdog's error: a timeout, an NCCL error,
    /// an abort here or a peer's failure). Returns at once unless a failure is being recorded
    /// at this moment; then it waits for that (the abort is given up on after 10 s and the
    /// report after about 1 s). Lets a caller that waits on something else (a GPU, a thread of
    /// its own) give up as soon as the group has.
    ///
    /// # Errors
    /// [`CommError::Watchdog`] once the group has failed.
    pub fn check(&self) -> Result<()> {
        self.inner.thread.check()
    }

    /// Returns once every rank has reached the barrier and every collective issued before it
    /// has finished on this rank's GPU: a one-element all-reduce, waited for through the
    /// watchdog (so a missing rank gives the watchdog's error after the timeout, not a hang).
    ///
    /// # Collective
    /// Every rank calls it.
    ///
    /// # Errors
    /// NCCL and CUDA failures; the watchdog's error.
    pub fn barrier(&self) -> Result<()> {
        self.inner.thread.run_blocking("barrier", |s| {
            let stream = s.stream.clone();
            let mut token = stream
                .alloc_zeros::<f32>(1)
                .map_err(s.cuda("allocating the barrier token"))?;
            let sum = Call::AllReduce(ReduceOp::Sum);
            // SAFETY: the token was just allocated on the group's stream, and the drain below
            // waits for the work.
            unsafe { s.queue_in_place(sum, "barrier", &mut token, |_queued| Ok(())) }?;
            s.drain("synchronising after the barrier")
        })
    }

    /// Waits until every collective issued so far has finished on this rank's GPU, and then the
    /// rest of the group's stream. Not a collective: other ranks are not involved. Bounded: a
    /// collective that cannot finish (a missing peer) gives the watchdog's error after the
    /// timeout.
    ///
    /// # Errors
    /// CUDA failures (including asynchronous failures of earlier work); the watchdog's error.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .thread
            .run_blocking("synchronize", |s| s.drain("synchronising the stream"))
    }

    pub(super) fn thread(&self) -> &CommThread {
        &self.inner.thread
    }

    fn check_device(&self, op: &'static str, stream: &Arc<CudaStream>) -> Result<()> {
        let on = stream.context().ordinal();
        if on == self.device() {
            Ok(())
        } else {
            Err(CommError::arg(
                op,
                format!(
                    "the buffer is on CUDA device {on} but group '{}' uses device {}",
                    self.name(),
                    self.device()
                ),
            ))
        }
    }

    /// Checks `root` and converts it to NCCL's `int`.
    pub(super) fn check_root(&self, op: &'static str, root: usize) -> Result<i32> {
        if root < self.world_size() {
            // validate() bounds the world size by i32::MAX, so this conversion holds.
            Ok(i32::try_from(root).unwrap_or(i32::MAX))
        } else {
            Err(CommError::arg(
                op,
                format!(
                    "root {root} is out of range for world size {}",
                    self.world_size()
                ),
            ))
        }
    }

    /// Checks that `total` holds `world_size` blocks of `block` elements.
    pub(super) fn check_blocks(&self, op: &'static str, block: usize, total: usize) -> Result<()> {
        let n = self.world_size();
        if block.checked_mul(n) == Some(total) {
            Ok(())
        } else {
            Err(CommError::arg(
                op,
                format!(
                    "the full buffer has {total} elements, expected {n} ranks x {block} = {}",
                    block.saturating_mul(n)
                ),
            ))
        }
    }
}

/// Rank 0's unique id. cudarc panics if a symbol is missing from an old libnccl; that becomes
/// an error here.
fn new_unique_id(config: &NcclBackendConfig) -> Result<Id> {
    match std::panic::catch_unwind(Id::new) {
        Ok(Ok(id)) => Ok(id),
        Ok(Err(e)) => Err(NcclError::Nccl {
            op: "get_unique_id",
            group: config.name.clone(),
            rank: config.rank,
            code: e.0,
            hint: crate::error::nccl_hint(e.0),
            detail: super::library::last_error_detail(),
        }
        .into()),
        Err(_) => Err(CommError::Aborted(
            "creating the NCCL unique id panicked (is libnccl too old? NCCL 2.14 or later is needed)"
                .into(),
        )),
    }
}
