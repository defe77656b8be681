//! Process groups: the user-facing collectives.
//!
//! - [`ProcessGroup`]: rank and size, blocking and `*_async` collectives, subgroups;
//!   byte payloads of lengths the receivers do not know (`group/payload.rs`):
//!   [`ProcessGroup::broadcast_bytes`], [`all_gather_bytes`](ProcessGroup::all_gather_bytes),
//!   [`gather_bytes`](ProcessGroup::gather_bytes), [`scatter_bytes`](ProcessGroup::scatter_bytes).
//! - [`ProcessGroupConfig`]: rank, world size, timeout, job token.
//! - [`Work`](crate::Work): the handle of an asynchronous collective.
//! - `generation`: which init on its store a world group is, so that groups created again over
//!   one store never read an earlier init's keys.
//! - `ProcessGroup::nccl` (feature `cuda`): the group's NCCL backend, for device buffers.
//!
//! # Threads
//! Each group has one communication thread that owns its connections and runs collectives in
//! the order they were issued, from any thread. Blocking calls wait for their turn in the queue.
//!
//! # Failure
//! The first failure makes the group unusable on that rank ([`CommError::Aborted`](crate::CommError)
//! afterwards); peers blocked on it fail at once, naming it. Create a new group to continue.
//! [`ProcessGroup::abort`] does the same on purpose, from any thread, with the caller's reason.

mod abort;
mod collectives;
mod config;
mod generation;
#[cfg(feature = "cuda")]
mod nccl_backend;
#[cfg(feature = "cuda")]
mod nccl_slot;
mod payload;
mod process_group;
mod transport_thread;

pub use config::{ProcessGroupConfig, TIMEOUT_ENV, TOKEN_ENV};
pub(crate) use process_group::HostedStore;
pub use process_group::ProcessGroup;
