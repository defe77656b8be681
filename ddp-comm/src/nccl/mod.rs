//! The NCCL backend of a process group (feature `cuda`): collectives between GPUs, one per
//! process, as c10d's `ProcessGroupNCCL` is the CUDA backend of a PyTorch process group.
//!
//! - [`NcclBackend`]: one rank's communicator, normally the backend of a
//!   [`ProcessGroup`](crate::ProcessGroup) ([`ProcessGroup::nccl`](crate::ProcessGroup::nccl):
//!   created on first use, shared by the group's clones, destroyed with the group), or created
//!   alone through a [`Store`](crate::Store) ([`NcclBackend::new`]); `all_reduce`, `broadcast`, `all_gather`,
//!   `reduce_scatter` on device buffers (cudarc `CudaSlice`/`CudaView`), the same on host
//!   slices (`*_host`, and `all_reduce_host_async` returning a [`Work`](crate::Work)),
//!   `barrier` and `synchronize`.
//! - [`NcclBackendConfig`]: rank, world size, device ordinal, group name, timeout.
//! - [`NcclBackend::all_reduce_raw_async`] and [`NcclWork`]: an all-reduce of a device address
//!   ([`NcclDtype`]) that returns at once, and its completion with GPU timing.
//! - [`NcclElement`]: the element types NCCL carries.
//! - [`NcclError`]: CUDA and NCCL failures, and a missing driver or libnccl, as errors rather
//!   than cudarc's panics; [`cuda_device_count`].
//!
//! # Threads
//! Each backend keeps its communicator (our own owner of NCCL's raw handle, created
//! non-blocking so its init has a timeout), its CUDA context and its own stream on a dedicated
//! thread; calls from any thread are queued there and run in issue order.
//!
//! # Timeouts
//! A [`Watchdog`](crate::watchdog::Watchdog) supervises every collective through a CUDA event recorded
//! after it, and `ncclCommGetAsyncError`; see [`NcclBackend`]'s `# Failure`.
//!
//! # Rendezvous
//! Rank 0 creates the NCCL unique id and publishes its 128 bytes under
//! `nccl/<name>/unique_id` in the store; the other ranks wait for it with the store's timeout.
//! The name keeps several communicators on one store apart, and rank 0 refuses a name already used.

mod backend;
mod calls;
mod clock;
mod config;
mod dtype;
mod element;
mod host;
mod library;
mod raw_comm;
mod thread;
mod unique_id;
mod work;

pub use crate::error::NcclError;
pub use backend::NcclBackend;
pub use config::{NCCL_DEFAULT_TIMEOUT, NcclBackendConfig};
pub use dtype::NcclDtype;
pub use element::NcclElement;
pub use library::{cuda_device_count, nccl_device_uuid};
pub use work::NcclWork;
