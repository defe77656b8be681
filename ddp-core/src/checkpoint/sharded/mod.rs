//! Sharded checkpoints that reshard on load (PyTorch's `torch.distributed.checkpoint`, DCP):
//! every rank writes its own shard of the model and of the optimizer state, and a load at
//! **any** world size reads what it needs from whichever shards hold it.
//!
//! - [`ShardedCheckpointer::save_state`]: each rank writes about `1/world` of the bytes and
//!   nothing is gathered on rank 0, whatever holds the optimizer state: anything that
//!   implements [`ShardedOptimizerState`] says whose state it holds ([`StateHolding`]):
//!   burn's optimizers (replicated, plain DDP), a
//!   [`ZeroRedundancyOptimizer`](crate::zero::ZeroRedundancyOptimizer) and FSDP's state
//!   (partitioned), or a user's own. [`ShardedCheckpointer::save`] takes any burn optimizer
//!   as replicated.
//! - [`ShardedCheckpointer::load_latest_state`]: a replicated holder gets every parameter's
//!   state, a partitioned one only that of the parameters it owns at the new world size (each
//!   rank reads only the optimizer shards holding them); [`ShardedCheckpointer::load_latest`]
//!   for any burn optimizer. Saved at 4 ranks, a run resumes at 1, 2, 3 or 8.
//! - [`convert_to_full`]: a sharded checkpoint as a rank-0 full checkpoint, which
//!   [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest) reads (the rank-0
//!   format is unchanged and keeps working; it does not read sharded checkpoints itself, so
//!   a directory holds one kind: a full checkpointer never mistakes a shard for a model).
//!
//! # On disk
//!
//! ```text
//! runs/big/
//! ├── latest                                "step-0000000120\n", replaced atomically
//! ├── .tmp-step-0000000140-sharded/         a save in progress (removed at the next start)
//! └── step-0000000120/
//!     ├── model-00000-of-00004.safetensors      rank 0's tensors (module paths as names)
//!     ├── optimizer-00000-of-00004.bin          rank 0's optimizer entries (burn record,
//!     │                                         full precision, keyed by ParamId)
//!     ├── model-00001-of-00004.safetensors ...  one pair per rank
//!     └── sharded_manifest.json                 written last: world size, every shard file
//!                                               (size, sha256), every tensor (shard, dtype,
//!                                               shape, ParamId, has optimizer state),
//!                                               TrainingState, per-rank rng
//! ```
//!
//! Which rank writes which tensor is ZeRO's partition rule (largest trainable tensors first,
//! each to the rank with the fewest bytes so far): under ZeRO every rank writes exactly the
//! optimizer state it holds; for plain DDP it splits the bytes evenly. Buffers, frozen and
//! integer tensors go to rank 0.
//!
//! # Commit protocol
//!
//! 1. All ranks agree on the step; rank 0 refuses to save below a newer valid checkpoint and
//!    creates the staging directory `.tmp-<name>-sharded/`.
//! 2. Every rank writes its two files into it and fsyncs each; all ranks agree that every
//!    rank succeeded (one failure fails the save on every rank; rank 0 removes the staging
//!    directory).
//! 3. Rank 0 checks that every rank's files are there with the sizes their writers reported,
//!    writes the manifest (sha256 computed by each writer from the bytes it wrote), fsyncs
//!    the directory, renames it to `<name>` (the commit), fsyncs the parent, then replaces
//!    `latest` and prunes beyond keep-last-K, as the rank-0 checkpointer does.
//!
//! A crash before the rename leaves the previous checkpoint the newest valid one (the
//! staging directory is not a checkpoint and is removed by [`ShardedCheckpointer::new`]); a
//! crash after it leaves a complete checkpoint newer than `latest`, which is loaded. On load
//! rank 0 verifies every shard file of the newest checkpoint against the manifest: a missing,
//! truncated or altered shard makes that checkpoint invalid (skipped with a warning naming the
//! file, like a corrupt rank-0 checkpoint), an I/O error fails the load.
//!
//! # A shared filesystem is required
//!
//! Every rank writes into, and reads from, the same directory: it must be one filesystem all
//! ranks see (one machine, NFS, Lustre, a mounted bucket with POSIX rename). Without one, a
//! save fails before committing with [`ShardedCheckpointError::MissingShard`] naming the rank
//! whose shard rank 0 cannot see; a load on a rank that cannot read the shards fails with
//! [`CheckpointError::Invalid`](super::CheckpointError::Invalid) on every rank. Use the rank-0
//! [`FullCheckpointer`](crate::checkpoint::FullCheckpointer) there (its load broadcasts from rank 0).
//!
//! # Exactness across world sizes
//!
//! The model and every parameter's optimizer state load as the exact bits saved, at any world
//! size. Training then continues as an uninterrupted run at the new world size would: bitwise
//! equal at the same world size; at another one, averaging the same global batch over a
//! different number of ranks may round differently in the last bit (see the
//! [zero module](crate::zero) on reduction order), so results agree to about 1e-6.
//!
//! The data loader position is in [`Resumed::state`](super::Resumed::state) like for rank-0
//! checkpoints ([`Resumed::restore_loader`](super::Resumed::restore_loader)).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::{AdamConfig, adaptor::OptimizerAdaptor, Adam};
//! use ddp_core::checkpoint::{CheckpointConfig, LoadOutcome, TrainingState};
//! use ddp_core::checkpoint::sharded::{ShardedCheckpointer, convert_to_full};
//! use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env, zero::ZeroRedundancyOptimizer};
//!
//! type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Default::default();
//! let pg = init_from_env()?; // any world size: the checkpoint may come from another one
//! let ckpt = ShardedCheckpointer::new(CheckpointConfig::new("runs/big").with_keep_last(2), pg.clone())?;
//! let mut model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! let mut optim = ZeroRedundancyOptimizer::new(AdamConfig::new().init::<B, Linear<B>>(), pg.clone());
//! let mut step = 0;
//! if let LoadOutcome::Resumed(resumed) = ckpt.load_latest_state(&device, &mut model, &mut optim)? {
//!     step = resumed.state.global_step; // resharded from resumed.info.saved_world_size
//! }
//! let ddp = DistributedDataParallel::new(model, pg, DdpConfig::new())?;
//! // ... train, then every rank:
//! ckpt.save_state(ddp.module(), &optim, &TrainingState::new(0, step))?;
//!
//! // Offline, for tools that want one model file (and for the rank-0 FullCheckpointer):
//! type Opt = OptimizerAdaptor<Adam, Linear<B>, B>;
//! convert_to_full::<B, Linear<B>, Opt, _>("runs/big".as_ref(), "step-0000000120", "runs/full".as_ref(), &device)?;
//! # Ok(()) }
//! ```

mod codec;
mod convert;
mod error;
mod load;
mod manifest;
mod optimizer_state;
mod ownership;
mod safetensors;
mod save;

pub use convert::convert_to_full;
pub use error::ShardedCheckpointError;
pub use manifest::{
    SHARDED_FORMAT_VERSION, SHARDED_MANIFEST_FILE, ShardEntry, ShardedManifest, TensorEntry,
    model_shard_file, optimizer_shard_file,
};
pub use optimizer_state::{ShardedOptimizerState, StateHolding};
pub(crate) use ownership::Ownership;
#[cfg(any(test, feature = "test-hooks"))]
pub use save::SHARDED_CRASH_POINTS;
pub use save::ShardedCheckpointer;
