//! The one storage layer under both checkpoint formats (rank-0 [`FullCheckpointer`] and
//! [`ShardedCheckpointer`]) and ddp-train's burn-train files: how things reach the disk and
//! come back.
//!
//! - `durable`: fsynced writes, renames, directory fsyncs, one file replaced atomically
//!   ([`write_file_atomically`]).
//! - `naming`: the layout of a checkpoint directory (`step-<N>`, `latest`, leftovers).
//! - `directory`: the directory as a whole: `latest`, the newest-valid search, "never
//!   backwards", pruning, rewinding; a format passes only how to verify one checkpoint.
//! - `install`: committing a checkpoint under its name (also over the same step), and the
//!   leftovers of an interrupted or failed save.
//! - `lock`: one job per directory.
//! - `elsewhere`: after rank 0's search, a newer checkpoint in another rank's directory (no
//!   shared filesystem) stops the load instead of being silently passed over.
//! - `run_id`: which run wrote a checkpoint (its manifest's run id), and the runs a fresh
//!   start superseded, which the `elsewhere` check passes over.
//! - `set_aside`: invalid checkpoints are renamed, never deleted.
//! - `rank0`: the collectives around the disk: rank 0 works and tells the others, every rank
//!   agrees all succeeded, rank 0 reads and broadcasts ([`read_on_rank0`]).
//!
//! Files of your own next to a checkpoint (a tokenizer, a metrics log), written by rank 0
//! and read back on every rank without a shared filesystem:
//!
//! ```no_run
//! use ddp_core::checkpoint::storage::{read_on_rank0, write_file_atomically};
//! use ddp_core::comm::ProcessGroup;
//! use std::io::Write;
//! use std::path::PathBuf;
//!
//! fn save_and_share(pg: &ProcessGroup, vocab: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
//!     let path = PathBuf::from("runs/digits/vocab.bin");
//!     if pg.rank() == 0 {
//!         // Complete under its final name, or the previous file: never cut short.
//!         write_file_atomically(&path, |file| file.write_all(vocab))?;
//!     }
//!     pg.barrier()?;
//!     // Collective: rank 0 reads, every rank receives the bytes.
//!     Ok(read_on_rank0(pg, &[path])?.remove(0))
//! }
//! ```
//!
//! [`FullCheckpointer`]: super::FullCheckpointer
//! [`ShardedCheckpointer`]: super::sharded::ShardedCheckpointer

pub(crate) mod directory;
pub(crate) mod durable;
pub(crate) mod elsewhere;
pub(crate) mod install;
pub(crate) mod lock;
pub(crate) mod naming;
pub(crate) mod rank0;
pub(crate) mod run_id;
pub(crate) mod set_aside;

pub use durable::{ensure_dir, remove_temporary_files, write_file_atomically};
pub use rank0::read_on_rank0;
