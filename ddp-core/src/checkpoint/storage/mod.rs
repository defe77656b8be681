//! The one storage layer under both checkpoint formats (rank-0 [`FullCheckpointer`] and
//! [`ShardedCheckpointer`]) and ddp-train's burn-train files: how things reach the disk and
//! come back.
//!
//! - `durable`: fsynced writes, renames, directory fsyncs, one file replaced atomically
//!   ([`write_file_atomically`]).
//! - `naming`: the layout of a checkpoint directory (`step-<N>`, `latest`, leftovers).
//! - `directory`: the directory as a whole: `latest`, the newest-valid search, "never
//!   backwards", pruning, rewinding, leftovers; a format passes only how to verify one
//!   checkpoint.
//! - `lock`: one job per directory.
//! - `set_aside`: invalid checkpoints are renamed, never deleted.
//! - `rank0`: the collectives around the disk: rank 0 works and tells the others, every rank
//!   agrees all succeeded, rank 0 reads and broadcasts ([`read_on_rank0`]).
//!
//! [`FullCheckpointer`]: super::FullCheckpointer
//! [`ShardedCheckpointer`]: super::sharded::ShardedCheckpointer

pub(crate) mod directory;
pub(crate) mod durable;
pub(crate) mod lock;
pub(crate) mod naming;
pub(crate) mod rank0;
pub(crate) mod set_aside;

pub use durable::{remove_temporary_files, write_file_atomically};
pub use rank0::read_on_rank0;
