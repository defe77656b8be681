//! Checkpoints with exact resume: model, optimizer, data-loader position, RNG state and a
//! free-form payload, written atomically by rank 0 and restored on every rank.
//!
//! - [`FullCheckpointer::save`]: every rank calls it at the same step; the ranks meet, rank 0
//!   writes, the ranks meet again. Only rank 0 serialises anything.
//! - [`FullCheckpointer::load_latest`]: rank 0 finds the newest checkpoint that verifies, reads it
//!   and broadcasts it (no shared filesystem needed; with
//!   [`CheckpointConfig::with_shared_filesystem`] every rank reads it itself). Each rank loads
//!   onto the device it passes (burn's `map_location`). Invalid checkpoints are skipped and set
//!   aside (renamed `step-N.invalid`, never deleted) with a warning naming the checkpoint and
//!   the bad file; an empty directory is a fresh start ([`LoadOutcome::Fresh`], logged), but
//!   checkpoints that are all invalid stop the load ([`CheckpointError::NoValidCheckpoint`]).
//! - One job per directory: rank 0 locks `<dir>/lock` ([`LOCK_FILE`], `flock`) for the
//!   checkpointer's life; a second job gets [`StorageError::DirLocked`] naming the holder.
//!
//! # On disk
//!
//! ```text
//! runs/digits/
//! ├── latest                    "step-0000000120\n", replaced atomically
//! ├── step-0000000100/
//! └── step-0000000120/
//!     ├── model.safetensors     tensor names are module paths (fc1.weight, fc1.bias, ...)
//!     ├── optimizer.bin         burn BinBytesRecorder, full precision, keyed by ParamId
//!     ├── param_ids.json        module path -> ParamId (so the optimizer state reattaches)
//!     ├── training_state.json   TrainingState, per-rank rng, world size, run-config hash,
//!     │                         ddp-core version
//!     ├── comm_hook_state-00000-of-00002.bin   only with a stateful comm hook (PowerSGD):
//!     ├── comm_hook_state-00001-of-00002.bin   each rank's TrainingState::comm_hook_state,
//!     │                                        binary, gathered to rank 0
//!     └── manifest.json         written last: size and sha256 of every other file, the
//!                               id of the run that wrote it
//! ```
//!
//! **Atomicity.** A checkpoint is written into `.tmp-<name>-<pid>/`, every file and the
//! directory fsynced, then renamed into place; then `latest` is replaced (temporary file,
//! fsync, rename, directory fsync); only then are checkpoints beyond keep-last-K deleted. A
//! crash at any moment leaves the previous checkpoint intact; the leftovers are removed by
//! [`FullCheckpointer::new`]. The rename commits the checkpoint: a complete directory newer than
//! `latest` (crash between rename and pointer update) is loaded, and the next save moves
//! `latest` past it.
//!
//! **World-size changes.** The model and optimizer are the same for any world size. The
//! sampler position is translated by global sample count by ddp-data
//! ([`Resumed::restore_loader`]): exact when the samples consumed by all ranks in the epoch
//! divide by the new world size (always at epoch boundaries); otherwise it is refused with
//! `DataError::WorldSizeChange` (wrapped in [`CheckpointError::Sampler`]).
//! [`Resumed::restore_loader_resharded`] always continues: the samples of the epoch no rank
//! consumed yet are dealt over the new ranks, so none is repeated or skipped (but padding).
//! Per-rank RNG states and communication-hook states (PowerSGD's per-rank error feedback) are
//! dropped, with a warning; the global step is kept as is.
//!
//! **ParamIds.** burn's optimizer state is keyed by `ParamId`, random per process. A restored
//! module takes the saved ids, so load **before** wrapping the model in
//! [`DistributedDataParallel`](crate::DistributedDataParallel) (which registers ids at
//! construction).
//!
//! **I/O errors are not corruption.** Only a genuinely invalid checkpoint (bad checksum or size,
//! bad format, incomplete: a file missing by design, a manifest naming another step than the
//! directory) is skipped, and set aside rather than deleted. Any other error reading a
//! checkpoint (EIO, ESTALE on NFS, EACCES) fails the load with
//! [`CheckpointError::ReadCheckpoint`] naming the file and the OS error: falling back would
//! resume from older state and then save over it.
//!
//! **`latest` never moves backwards.** The newest valid checkpoint on disk is the one loaded
//! (normally the one `latest` names; a complete checkpoint renamed into place is committed even
//! if the writer died before moving `latest`). A save below a newer valid checkpoint is refused
//! ([`CheckpointError::NewerCheckpointExists`]); a newer invalid one is set aside first, so a
//! newer checkpoint can never be hidden behind `latest`. Keep-last-K retention counts the
//! checkpoints at or below the one just saved; set-aside ones are neither counted nor removed.
//!
//! **Test-only hooks.** With the `test-hooks` cargo feature (tests only), `TEST_CRASH_AT_ENV`
//! (`DDP_CHECKPOINT_TEST_CRASH_AT`) makes the writer SIGKILL its own process at one of the
//! `CRASH_POINTS` of a save, and `inject_read_error` makes reads of a file fail. Release builds
//! without the feature contain neither.
//!
//! # A training loop
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::data::{dataloader::batcher::Batcher, dataset::InMemDataset};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::AdamConfig;
//! use burn::tensor::{Device, Tensor, TensorData};
//! use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, LoadOutcome, TrainingState};
//! use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env};
//! use ddp_data::{DistributedDataLoaderBuilder, DistributedSamplerConfig};
//!
//! type B = Autodiff<Flex>;
//!
//! /// `[x0, x1, x2, x3, y]` rows to an input and a target tensor.
//! #[derive(Clone)]
//! struct Rows;
//! impl Batcher<B, [f32; 5], (Tensor<B, 2>, Tensor<B, 2>)> for Rows {
//!     fn batch(&self, items: Vec<[f32; 5]>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
//!         let n = items.len();
//!         let x: Vec<f32> = items.iter().flat_map(|r| r[..4].to_vec()).collect();
//!         let y: Vec<f32> = items.iter().map(|r| r[4]).collect();
//!         (Tensor::from_data(TensorData::new(x, [n, 4]), device), Tensor::from_data(TensorData::new(y, [n, 1]), device))
//!     }
//! }
//!
//! #[derive(serde::Serialize)]
//! struct RunConfig { lr: f64, batch_size: usize, epochs: u64 }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let run = RunConfig { lr: 1e-3, batch_size: 16, epochs: 10 };
//! let device = Default::default();
//! let pg = init_from_env()?; // set by ddp-run
//! let ckpt = FullCheckpointer::new(
//!     CheckpointConfig::new("runs/digits").with_keep_last(3).with_run_config(&run)?,
//!     pg.clone(),
//! )?;
//!
//! let items: Vec<[f32; 5]> = (0..1000).map(|i| [i as f32 / 1000.0, 0.5, -0.5, 1.0, 0.25]).collect();
//! let sampler = DistributedSamplerConfig::new(pg.world_size(), pg.rank()).with_seed(42);
//! let mut loader = DistributedDataLoaderBuilder::new(Rows)
//!     .batch_size(run.batch_size)
//!     .build(InMemDataset::new(items), sampler)?;
//! let mut model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! let mut optim = AdamConfig::new().init();
//!
//! // Resume before wrapping in DDP.
//! let (mut first_epoch, mut step) = (0, 0);
//! match ckpt.load_latest(&device, &mut model, &mut optim)? {
//!     LoadOutcome::Resumed(resumed) => {
//!         resumed.restore_loader(&mut loader)?; // next unseen batch
//!         first_epoch = resumed.state.epoch;
//!         step = resumed.state.global_step;
//!         println!("resumed from {} at epoch {first_epoch}, step {step}", resumed.info.name);
//!     }
//!     fresh => println!("{fresh}"), // "no valid checkpoint in runs/digits: starting fresh"
//! }
//! let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new())?;
//!
//! for epoch in first_epoch..run.epochs {
//!     loader.set_epoch(epoch); // keeps a restored mid-epoch position
//!     for batch in loader.iter() {
//!         let (x, y) = batch?;
//!         let pred = ddp.forward(|m| m.forward(x))?;
//!         let grads = ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))?;
//!         ddp.optimizer_step(&mut optim, run.lr, grads);
//!         step += 1;
//!         if step % 100 == 0 {
//!             let state = TrainingState::new(epoch, step).with_sampler(loader.state());
//!             ckpt.save(ddp.module(), &optim, &state)?; // every rank, same step
//!         }
//!     }
//!     let state = TrainingState::new(epoch, step)
//!         .with_sampler(loader.state())
//!         .with_user(&serde_json::json!({ "note": "end of epoch" }))?;
//!     ckpt.save(ddp.module(), &optim, &state)?;
//! }
//! # Ok(()) }
//! ```

mod base;
mod canonical;
mod codec;
mod comm_hook_files;
mod config;
mod crash_point;
mod error;
mod fresh_start;
mod full;
mod manifest;
mod outcome;
pub mod sharded;
mod state;
pub mod storage;

pub(crate) use codec::mark_partial_optimizer_record;
pub use comm_hook_files::comm_hook_state_file;
pub use config::{CheckpointConfig, run_config_hash};
#[cfg(any(test, feature = "test-hooks"))]
pub use crash_point::{
    CRASH_POINTS, TEST_CRASH_AT_ENV, clear_read_error, clear_write_error, inject_read_error,
    inject_write_error,
};
pub use error::{CheckpointError, InvalidCheckpoint, InvalidReason, StorageError};
pub use fresh_start::FRESH_START_FILE;
pub use full::FullCheckpointer;
pub use manifest::{
    CHECKPOINT_FILES, FORMAT_VERSION, FileEntry, MANIFEST_FILE, MODEL_FILE, Manifest,
    OPTIMIZER_FILE, PARAM_IDS_FILE, STATE_FILE, sha256_hex,
};
pub use outcome::{CheckpointInfo, LoadOutcome, Resumed, SavedCheckpoint};
pub use storage::lock::{DirLock, LOCK_FILE, lock_dir};
pub use storage::naming::{LATEST_FILE, checkpoint_name, parse_checkpoint_name};
pub(crate) use storage::rank0::{all_gather_bytes, all_succeeded};
pub use storage::run_id::SUPERSEDED_RUNS_FILE;
pub use storage::set_aside::INVALID_SUFFIX;

pub use state::{FRAMEWORK_VERSION, TrainingState};
