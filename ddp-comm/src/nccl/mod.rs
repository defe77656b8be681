//! NCCL process groups (feature `cuda`): collectives between GPUs, one per process.
//!
//! - [`NcclGroup`]: one rank's communicator, created through a [`Store`](crate::Store) or from a
//!   [`ProcessGroup`](crate::ProcessGroup); `all_reduce`, `broadcast`, `all_gather`,
//!   `reduce_scatter` on device buffers (cudarc `CudaSlice`/`CudaView`), the same on host
//!   slices (`*_host`, and `all_reduce_host_async` returning a [`Work`](crate::Work)),
//!   `barrier` and `synchronize`.
//! - [`NcclGroupConfig`]: rank, world size, device ordinal, group name, timeout.
//! - [`NcclGroup::all_reduce_raw_async`] and [`NcclWork`]: an all-reduce of a device address
//!   ([`NcclDtype`]) that returns at once, and its completion with GPU timing.
//! - [`NcclElement`]: the element types NCCL carries.
//! - [`NcclError`]: CUDA and NCCL failures, and a missing driver or libnccl, as errors rather
//!   than cudarc's panics; [`cuda_device_count`].
//!
//! # Threads
//! Each group keeps its communicator (our own owner of NCCL's raw handle, created
//! non-blocking so its init has a timeout), its CUDA context and its own stream on a dedicated
//! thread; calls from any thread are queued there and run in issue order.
//!
//! # Timeouts
//! A [`Watchdog`](crate::Watchdog) supervises every collective through a CUDA event recorded
//! after it, and `ncclCommGetAsyncError`; see [`NcclGroup`]'s `# Failure`.
//!
//! # Rendezvous
//! Rank 0 creates the NCCL unique id and publishes its 128 bytes under
//! `nccl/<name>/unique_id` in the store; the other ranks wait for it with the store's timeout.
//! The name keeps several groups on one store apart, and rank 0 refuses a name already used.

mod calls;
mod clock;
mod config;
mod dtype;
mod element;
mod error;
mod group;
mod host;
mod library;
mod raw_comm;
mod thread;
mod unique_id;
mod work;

pub use config::{NCCL_DEFAULT_TIMEOUT, NcclGroupConfig};
pub use dtype::NcclDtype;
pub use element::NcclElement;
pub use error::NcclError;
pub use group::NcclGroup;
pub use library::{cuda_device_count, nccl_device_uuid};
pub use work::NcclWork;
