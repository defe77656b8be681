//! # ddp-comm
//!
//! Rendezvous, process groups and collectives for data-parallel training: the c10d + gloo of
//! the ddp-burn framework. It works on slices of numbers and has no burn dependency.
//!
//! - [`init_process_group`] joins a job ([`InitMethod`]: `env://`, `tcp://`, `file://`); rank 0
//!   hosts the [`Store`], a TCP key-value service the ranks meet through.
//! - [`ProcessGroup`] runs collectives: [`all_reduce`](ProcessGroup::all_reduce) ([`ReduceOp`]:
//!   sum, avg, min, max, product), [`broadcast`](ProcessGroup::broadcast),
//!   [`all_gather`](ProcessGroup::all_gather), [`reduce_scatter`](ProcessGroup::reduce_scatter),
//!   [`reduce`](ProcessGroup::reduce), [`gather`](ProcessGroup::gather),
//!   [`scatter`](ProcessGroup::scatter), [`all_to_all`](ProcessGroup::all_to_all),
//!   [`barrier`](ProcessGroup::barrier),
//!   [`send`](ProcessGroup::send)/[`recv`](ProcessGroup::recv); `*_async` variants return a
//!   [`Work`]. Element types ([`Element`]): `f32`, `f64`, `i32`, `i64`, `u8`, `f16`, `bf16`.
//! - [`ProcessGroup::new_group`] makes subgroups.
//! - [`ProcessGroup::abort`] fails a group on purpose, from any thread (a rank whose backward
//!   pass failed): peers fail promptly with its reason instead of waiting for the timeout.
//!
//! ## Transports
//! - TCP (always): ring reduce-scatter + all-gather over non-blocking sockets, connected on
//!   demand (ring neighbours while the group forms, other pairs when first needed), streaming
//!   through a cache-sized scratch buffer; works within and across hosts.
//! - Shared memory (default between ranks on one host): ranks that share a host (same
//!   hostname, boot id, network and pid namespace, as published through the store) map one
//!   segment under `/dev/shm` and all-reduce as reduce-scatter + all-gather through it, reading
//!   each other's staging buffers directly (broadcast, all-gather, reduce-scatter, reduce,
//!   gather, scatter, all-to-all and barrier too; send/recv stay on TCP); waits yield briefly,
//!   then sleep on a futex. Across hosts, all-reduce is hierarchical: within each host in shared
//!   memory, a TCP ring between one leader per host, and back (broadcast and barrier likewise;
//!   the other collectives use the TCP mesh). [`TransportKind`] / `DDP_TRANSPORT=auto|shm|tcp` chooses;
//!   [`ProcessGroup::backend_name`] and [`ProcessGroup::shared_memory_groups`] say what a group
//!   got. Segment names are unlinked as soon as every local rank has mapped them, so nothing is
//!   left in `/dev/shm` however a job ends (a crash during setup is cleaned up by the next job).
//!
//! ## NCCL (feature `cuda`)
//! NCCL is a backend of [`ProcessGroup`], as `ProcessGroupNCCL` is in c10d:
//! `pg.nccl(device)` is the group's `NcclBackend`, created on the first call (collective) and
//! kept, aborted and destroyed with the group. It runs collectives between GPUs, one per process, through NCCL (cudarc's
//! bindings, which load the CUDA driver and libnccl at run time): `all_reduce`, `broadcast`,
//! `all_gather` and `reduce_scatter` on device buffers (cudarc's `CudaSlice` or views, on the
//! rank's device; `ddp_comm::cudarc` re-exports the matching version) and on host slices
//! (`*_host`: copy in, collective, copy out; `all_reduce_host_async` returns a [`Work`]), plus
//! `barrier` and `synchronize`. Rank 0 publishes the NCCL unique id in the [`Store`] under
//! `nccl/<name>/unique_id`; a group's backend meets through the group's store, and
//! `NcclBackend::new` creates one alone (another name, device or timeout). The communicator lives on its own
//! thread and CUDA stream (cudarc's `Comm` is not `Send`). A machine without a driver, a GPU or
//! libnccl gets an `NcclError` that says so (`is_unavailable()`), never a panic. NCCL has no
//! mismatch detection: a rank that issues a different collective corrupts data or stalls.
//!
//! ### NCCL timeouts and the watchdog
//! NCCL has no timeouts of its own; ddp-comm adds them. The communicator is created
//! non-blocking (`ncclCommInitRankConfig`, polled), so a rank that never joins makes init fail
//! after the group's timeout (`NcclError::InitTimeout`). Every collective gets a sequence number
//! and a CUDA event recorded after it, and is supervised by a [`Watchdog`](watchdog::Watchdog): a
//! thread polls the events and `ncclCommGetAsyncError` every 2 ms and publishes this rank's
//! last issued and completed sequence numbers in the store (`watchdog/<group>/<rank>`). A
//! collective not finished within `NcclBackendConfig::timeout` (default 10 minutes;
//! a process group's backend takes the group's, `DDP_TIMEOUT_SECS`), or an async error,
//! aborts the communicator (`ncclCommAbort`), and every waiter and later call gets
//! [`CommError::Watchdog`]: the stuck collective (sequence number, op, bucket, bytes, how long)
//! and the ranks that never issued it, or "every rank issued it and none finished" (a network
//! or NCCL failure). Supervision starts before NCCL is called, so a call that waits for a
//! missing peer while it is issued (NCCL connects peers on first use) times out the same way.
//! An error raised on this rank (a CUDA error, a failed enqueue) names no peer as behind, and
//! the first rank to fail a group tells the others through the store, so they abort too.
//! After an abort, a collective whose event completes (its kernels exited) still reports the
//! failure, never garbage as a result.
//! `synchronize`, `barrier`, the `*_host` calls and dropping the group wait
//! through the watchdog, so none of them can hang. `NcclBackend::all_reduce_raw_async` queues an
//! all-reduce of a device address and returns an `NcclWork` whose `wait` reports when it ran
//! on the GPU (CUDA events mapped onto the host clock).
//!
//! ## Contracts
//! - **Ordering.** Every rank issues the same collectives in the same order. Each frame (and
//!   each shared-memory step) carries a fingerprint (sequence number, op, type, count, root); a
//!   rank that disagrees gets
//!   [`CommError::Mismatch`] naming both ranks and both calls, never a hang or silent corruption.
//! - **Failure.** A peer that dies or stalls makes the others fail within the timeout with an
//!   error naming it (in shared memory, a dead process is noticed within about 100 ms of
//!   waiting for it). A failed group is unusable afterwards ([`CommError::Aborted`]).
//!   [`ProcessGroup::abort`] fails it on purpose, publishing the caller's reason first.
//! - **Safety nets.** Both ends of every store and mesh connection prove the job token
//!   ([`TOKEN_ENV`]) to each other without sending it (HMAC-SHA256 challenge-response over
//!   fresh nonces, so recordings cannot be replayed); group ids include a random per-job nonce.
//!   Frames larger than announced or allowed are rejected before anything is allocated. The store listens on
//!   `MASTER_ADDR`'s interface only (loopback for a single-host job); a connection that has
//!   not proved the token gets one total deadline for its hello, and at most 64 wait at once.
//! - **Shutdown.** Dropping a group joins its thread, closes its sockets and marks its
//!   shared-memory slot closed (peers still waiting for it fail at once).
//! - **Re-initialisation.** A store may outlive its groups: each init of the world group over
//!   one store ([`ProcessGroup::generation`]), and each start of a [`Watchdog`](watchdog::Watchdog)
//!   under one name, gets store keys of its own, so it never reads an earlier one's addresses or
//!   failures. Every rank creates its groups on a store in the same order.
//!
//! ## Example: ranks as threads
//! ```
//! use ddp_comm::{ProcessGroup, ProcessGroupConfig, ReduceOp, Store, StoreConfig, StoreServer};
//! let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new())?;
//! let addr = server.local_addr().to_string();
//! let results: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let handles: Vec<_> = (0..2)
//!         .map(|rank| {
//!             let addr = addr.clone();
//!             s.spawn(move || -> Result<Vec<f32>, ddp_comm::CommError> {
//!                 let store = Store::connect(&addr, StoreConfig::new())?;
//!                 let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(rank, 2))?;
//!                 let mut v = vec![rank as f32 + 1.0; 3];
//!                 pg.all_reduce(&mut v, ReduceOp::Sum)?;
//!                 Ok(v)
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
//! });
//! assert_eq!(results, vec![vec![3.0; 3], vec![3.0; 3]]);
//! # Ok::<(), ddp_comm::CommError>(())
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod auth;
mod collective;
mod connect;
mod deadline;
mod deadline_io;
mod dtype;
mod env;
mod error;
mod failure;
mod group;
mod init;
mod locked;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(test)]
mod proptest_support;
mod reduce_op;
mod setters;
pub mod stand_in;
pub mod store;
mod transport;
mod u8_enum;
pub mod watchdog;
mod work;

pub use auth::MAX_TOKEN_BYTES;
pub use deadline::MAX_TIMEOUT;
pub use dtype::{DataType, Element};
pub use env::env_var;
pub use error::{CommError, Result, panic_message};
pub use failure::{FAILURE_FILE_ENV, FailureReport};
pub use group::{ProcessGroup, ProcessGroupConfig, TIMEOUT_ENV, TOKEN_ENV};
pub use half::{bf16, f16};
pub use init::{InitMethod, host_port, init_process_group};
pub use reduce_op::ReduceOp;
pub use store::{client::Store, config::StoreConfig, server::StoreServer};
pub use transport::{TRANSPORT_ENV, TransportKind};
pub use work::{Work, WorkTiming};

/// The cudarc version ddp-comm is built against, for naming device buffers (`CudaSlice`).
#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub use nccl::{
    NCCL_DEFAULT_TIMEOUT, NcclBackend, NcclBackendConfig, NcclDtype, NcclElement, NcclError,
    NcclWork, cuda_device_count, nccl_device_uuid,
};

/// Whether the CUDA driver library can be loaded. Check it before the first GPU tensor
/// operation: without a driver, cubecl panics on its device thread instead of returning an error.
#[cfg(feature = "cuda")]
pub fn cuda_driver_present() -> bool {
    // SAFETY: this only tries to load the driver library (dlopen, which runs the library's
    // initialisers, the reason the function is unsafe) and reports whether that worked; no
    // driver function is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
