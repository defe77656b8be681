//! What saving and resuming return: [`SavedCheckpoint`], [`LoadOutcome`], [`Resumed`],
//! [`CheckpointInfo`].

use super::error::{CheckpointError, InvalidCheckpoint};
use super::state::{FRAMEWORK_VERSION, StateFile, TrainingState};
use burn::tensor::backend::Backend;
use ddp_data::DistributedDataLoader;
use std::path::PathBuf;

/// A checkpoint written by [`FullCheckpointer::save`](crate::checkpoint::FullCheckpointer::save) (the same on
/// every rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCheckpoint {
    /// Directory name, e.g. `step-0000000120`.
    pub name: String,
    /// Full path of the checkpoint directory (on rank 0's machine).
    pub path: PathBuf,
    /// The global step it was taken at.
    pub global_step: u64,
    /// Total size of its files.
    pub bytes: u64,
    /// Older checkpoints deleted by keep-last-K.
    pub removed: Vec<String>,
}

/// Where a resumed run came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Directory name, e.g. `step-0000000120`.
    pub name: String,
    /// Full path of the checkpoint directory (on rank 0's machine).
    pub path: PathBuf,
    /// The global step it was taken at.
    pub global_step: u64,
    /// The world size it was saved with.
    pub saved_world_size: usize,
    /// The world size it was loaded on.
    pub world_size: usize,
    /// The run config hash saved with it.
    pub run_config_hash: Option<String>,
    /// The ddp-core version that wrote it.
    pub framework_version: String,
    /// Total size of its files.
    pub bytes: u64,
}

impl CheckpointInfo {
    /// Checkpoint `name` (in `path`, `bytes` in all) of `global_step`, saved with state file
    /// `saved`, as loaded on `world_size` ranks.
    pub(crate) fn of_saved(
        name: &str,
        path: PathBuf,
        global_step: u64,
        bytes: u64,
        saved: &StateFile,
        world_size: usize,
    ) -> CheckpointInfo {
        CheckpointInfo {
            name: name.to_string(),
            path,
            global_step,
            saved_world_size: saved.world_size,
            world_size,
            run_config_hash: saved.run_config_hash.clone(),
            framework_version: saved.framework_version.clone(),
            bytes,
        }
    }

    /// Whether it was saved with another world size. Model and optimizer load as usual; the
    /// sampler position is translated by global sample count when that is exact (see
    /// [`Resumed::restore_loader`]).
    pub fn world_size_changed(&self) -> bool {
        self.saved_world_size != self.world_size
    }
}

/// A run restored from a checkpoint: the model and optimizer passed to
/// [`load_latest`](crate::checkpoint::FullCheckpointer::load_latest) now hold its values; the rest is here.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// Which checkpoint.
    pub info: CheckpointInfo,
    /// The training state saved with it (this rank's `rank_rng` when the world size is
    /// unchanged).
    pub state: TrainingState,
    /// Newer checkpoints that failed verification and were skipped.
    pub invalid: Vec<InvalidCheckpoint>,
}

impl Resumed {
    /// The outcome of a resume from checkpoint `info`, logged once for both formats (`kind`:
    /// `checkpoint` or `sharded checkpoint`), with a warning when another ddp-core version
    /// wrote it.
    pub(crate) fn logged(
        kind: &str,
        info: CheckpointInfo,
        state: TrainingState,
        invalid: Vec<InvalidCheckpoint>,
    ) -> Resumed {
        let name = info.name.as_str();
        if info.framework_version != FRAMEWORK_VERSION {
            tracing::warn!(checkpoint = name, saved = %info.framework_version, current = FRAMEWORK_VERSION, "checkpoint written by another ddp-core version");
        }
        tracing::info!(
            checkpoint = %info.path.display(),
            epoch = state.epoch,
            global_step = state.global_step,
            skipped = invalid.len(),
            "resumed from {kind} {name}"
        );
        Resumed {
            info,
            state,
            invalid,
        }
    }

    /// Restores `loader` to the saved position: with the same world size, exactly; with
    /// another one, translated by global sample count when exact (ddp-data's rule: the samples
    /// consumed by all ranks together must be a multiple of the new world size, or the save
    /// was at an epoch boundary), else [`CheckpointError::Sampler`] wrapping
    /// `DataError::WorldSizeChange`.
    ///
    /// # Errors
    /// [`CheckpointError::NoSamplerState`], [`CheckpointError::Sampler`].
    pub fn restore_loader<B: Backend, I, O>(
        &self,
        loader: &mut DistributedDataLoader<B, I, O>,
    ) -> Result<(), CheckpointError> {
        let state = self
            .state
            .sampler
            .as_ref()
            .ok_or_else(|| CheckpointError::NoSamplerState {
                name: self.info.name.clone(),
            })?;
        loader
            .load_state(state)
            .map_err(|source| CheckpointError::Sampler {
                name: self.info.name.clone(),
                source,
            })
    }

    /// Restores `loader` on any world size, mid-epoch included: the rest of the saved epoch
    /// (the samples no rank consumed yet, in the epoch's order) is dealt over this world's
    /// ranks (ddp-data's `SamplerState::resharded_for`), so no sample of the epoch is repeated
    /// or skipped, except the padding (up to world size - 1 repeats) or, with `drop_last`, the
    /// last few samples that do not fill a round. From the next epoch on the loader is exactly
    /// a fresh one of this world size. With the same world size, or when the translation is
    /// exact, it equals [`restore_loader`](Self::restore_loader). Use it when the world size
    /// may change between runs (elastic jobs); `restore_loader` keeps refusing inexact moves.
    ///
    /// # Errors
    /// [`CheckpointError::NoSamplerState`], [`CheckpointError::Sampler`].
    pub fn restore_loader_resharded<B: Backend, I, O>(
        &self,
        loader: &mut DistributedDataLoader<B, I, O>,
    ) -> Result<(), CheckpointError> {
        let name = || self.info.name.clone();
        let state = self
            .state
            .sampler
            .as_ref()
            .ok_or_else(|| CheckpointError::NoSamplerState { name: name() })?;
        let world = loader.sampler_config().num_replicas;
        let state = state
            .resharded_for(world)
            .map_err(|source| CheckpointError::Sampler {
                name: name(),
                source,
            })?;
        loader
            .load_state(&state)
            .map_err(|source| CheckpointError::Sampler {
                name: name(),
                source,
            })
    }
}

/// The result of [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest), the same on
/// every rank.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadOutcome {
    /// No valid checkpoint: the model and optimizer are untouched; start from scratch.
    Fresh {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Checkpoints that exist but failed verification.
        invalid: Vec<InvalidCheckpoint>,
    },
    /// Restored from a checkpoint.
    Resumed(Box<Resumed>),
}

impl LoadOutcome {
    /// The resumed run, if any.
    pub fn resumed(&self) -> Option<&Resumed> {
        match self {
            LoadOutcome::Resumed(r) => Some(r),
            LoadOutcome::Fresh { .. } => None,
        }
    }

    /// The resumed run, if any.
    pub fn into_resumed(self) -> Option<Resumed> {
        match self {
            LoadOutcome::Resumed(r) => Some(*r),
            LoadOutcome::Fresh { .. } => None,
        }
    }

    /// Checkpoints that failed verification and were skipped.
    pub fn invalid(&self) -> &[InvalidCheckpoint] {
        match self {
            LoadOutcome::Resumed(r) => &r.invalid,
            LoadOutcome::Fresh { invalid, .. } => invalid,
        }
    }
}

impl std::fmt::Display for LoadOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadOutcome::Fresh { dir, invalid } => {
                write!(
                    f,
                    "no valid checkpoint in {}: starting fresh",
                    dir.display()
                )?;
                if !invalid.is_empty() {
                    write!(f, " ({} invalid checkpoint(s) skipped)", invalid.len())?;
                }
                Ok(())
            }
            LoadOutcome::Resumed(r) => {
                write!(
                    f,
                    "resumed from {} (epoch {}, global step {}",
                    r.info.path.display(),
                    r.state.epoch,
                    r.state.global_step
                )?;
                if r.info.world_size_changed() {
                    write!(f, ", saved with world size {}", r.info.saved_world_size)?;
                }
                for bad in &r.invalid {
                    write!(f, "; skipped {bad}")?;
                }
                write!(f, ")")
            }
        }
    }
}
