//! Communication hooks: how a bucket of gradients becomes their average over the ranks.
//!
//! By default DDP averages each bucket with one all-reduce of its gradients in their own dtype.
//! A [`CommHook`] replaces that for f32 buckets, as PyTorch's `register_comm_hook` does: it
//! receives the bucket's gradients flattened into one buffer ([`GradBucket`]) and the process
//! group, and leaves in the buffer what every rank should use as the averaged gradient. It runs
//! on a communication thread of its own while backward goes on, and may keep state across steps
//! (`&mut self`).
//!
//! | Hook | Bytes on the wire | Result | When |
//! |---|---|---|---|
//! | none (default) | 4 per gradient | exact average | fast links: shared memory, NVLink, fast networks |
//! | [`Fp16CompressHook`] | 2 | average rounded to ~3 significant digits | bandwidth-bound, gradients within f16's range |
//! | [`Bf16CompressHook`] | 2 | average rounded to ~2 significant digits, f32's range | bandwidth-bound, large or tiny gradients |
//! | [`PowerSgdHook`] | ~(n+m)·rank per n×m matrix | low-rank approximation with error feedback | slow links (TCP across hosts), large matrices; tune `rank` and `start_iter` |
//!
//! Every rank must register the same hook with the same settings before the first backward
//! ([`DistributedDataParallel::register_comm_hook`](crate::DistributedDataParallel::register_comm_hook)).
//! Buckets of other dtypes (f64, f16, bf16 parameters) keep the built-in exact average.
//!
//! A hook that keeps state across steps (PowerSGD) hands it over as a [`CommHookState`]
//! ([`CommHook::state`], through
//! [`DistributedDataParallel::comm_hook_state`](crate::DistributedDataParallel::comm_hook_state))
//! for a checkpoint ([`TrainingState::with_comm_hook_state`](crate::checkpoint::TrainingState::with_comm_hook_state)),
//! and takes it back on resume ([`CommHook::load_state`]), so a resumed run continues bit for
//! bit.

mod comm_hook;
mod compress;
mod hook_state;
mod linalg;
mod powersgd;

pub use comm_hook::{BucketParam, CommHook, CommHookStateError, GradBucket, HookError};
pub use compress::{Bf16CompressHook, Fp16CompressHook};
pub use hook_state::CommHookState;
pub use powersgd::{PowerSgdConfig, PowerSgdHook};
