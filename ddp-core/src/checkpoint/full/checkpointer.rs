//! [`FullCheckpointer`]: collective save and resume of rank-0 checkpoints.

use super::super::base::{
    CheckpointerBase, RESUME_HEADER, ResumeHeader, SAVE_SUMMARY, SaveSummary,
};
use super::super::codec::{encode_model, encode_optimizer};
use super::super::comm_hook_files::{comm_hook_state_file, encode_comm_hook_state};
use super::super::config::CheckpointConfig;
use super::super::error::CheckpointError;
use super::super::manifest::MANIFEST_FILE;
use super::super::outcome::{LoadOutcome, Resumed, SavedCheckpoint};
use super::super::state::TrainingState;
use super::super::storage::directory::{check_not_backwards, read_latest};
use super::super::storage::naming::validate_checkpoint_name;
use super::super::storage::naming::{checkpoint_name, list_checkpoints};
use super::super::storage::rank0::{
    agree_on_step, all_gather_bytes, gather_bytes_to_rank0, on_rank0,
};
use super::super::storage::run_id::run_id_to_save;
use super::reader::{find_checkpoint_to_resume, read_one};
use super::writer::write_checkpoint;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};

/// What rank 0's write tells every rank in the save summary's broadcast: the checkpoint it
/// saved, or that it refused the optimizer's record as partial. A refusal travels as a value,
/// not as rank 0's error, so that every rank returns
/// [`CheckpointError::PartialOptimizerState`] (a caller falls back to a collective save on
/// every rank, or on none), not [`CheckpointError::Rank0Failed`].
#[derive(Debug, Serialize, Deserialize)]
enum WriteOutcome {
    Saved(SaveSummary),
    /// Nothing was written; the text of the refusal's `what`.
    PartialOptimizerState(String),
}

/// Saves and restores model, optimizer and [`TrainingState`] for every rank of a process
/// group. See the [module docs](crate::checkpoint) for a complete training loop.
///
/// Every method except [`list`](Self::list) and [`latest`](Self::latest) is **collective**:
/// all ranks call it at the same point, and an error on one rank is an error on all of them.
#[derive(Debug)]
pub struct FullCheckpointer {
    pub(super) base: CheckpointerBase,
}

impl FullCheckpointer {
    /// Creates the checkpointer; rank 0 creates the directory and removes what an interrupted
    /// save left behind (temporary directories and files).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidConfig`]; I/O errors of rank 0 (on every rank).
    pub fn new(config: CheckpointConfig, pg: ProcessGroup) -> Result<Self, CheckpointError> {
        Ok(FullCheckpointer {
            base: CheckpointerBase::open(config, pg, "full")?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.base.config
    }

    /// The process group.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.base.pg
    }

    /// Saves `model`, `optim` and `state` as checkpoint `step-<global_step>`: all ranks check
    /// they are at the same step, rank 0 writes atomically (replacing a checkpoint of the same
    /// step) and moves `latest`, then all ranks go on. Only rank 0's model, optimizer and
    /// state are written (DDP keeps them identical); each rank's `rank_rng` is gathered, and
    /// each rank's [`comm_hook_state`](TrainingState::comm_hook_state) is gathered to rank 0
    /// (only: it is as large as the gradients) and written as a file of its own per rank.
    ///
    /// Rank 0 serialises the checkpoint in memory before writing it (the manifest needs the
    /// hashes), and the other ranks wait for the write inside a collective: the process
    /// group's timeout must cover it.
    ///
    /// A [`ZeroRedundancyOptimizer`](crate::zero::ZeroRedundancyOptimizer) holds only each
    /// rank's shard of the optimizer state: save it with its `save_checkpoint`, or call its
    /// `consolidate_state` on every rank first. Passed here as it is (at world 2 or more), the
    /// save fails on every rank with [`CheckpointError::PartialOptimizerState`] (the variant
    /// itself on every rank: rank 0 decides and shares it) and writes nothing: rank 0's shard
    /// alone would lose the other ranks' state on resume.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// [`CheckpointError::StepMismatch`]; [`CheckpointError::PartialOptimizerState`] (on every
    /// rank); rank 0's serialisation or I/O error (other ranks get
    /// [`CheckpointError::Rank0Failed`]); [`CheckpointError::Comm`]. A failed save never
    /// leaves a partial checkpoint and keeps the previous `latest`, except
    /// [`CheckpointError::LatestNotUpdated`]: the checkpoint is committed (and resumable), only
    /// `latest` could not be moved to it.
    pub fn save<B, M, O>(
        &self,
        model: &M,
        optim: &O,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.base.config.writable("save a checkpoint")?;
        let step = state.global_step;
        agree_on_step(&self.base.pg, step)?;
        let mine = match &state.rank_rng {
            Some(v) => serde_json::to_vec(v)
                .map_err(CheckpointError::json("serialising this rank's rng state"))?,
            None => Vec::new(),
        };
        let rank_rngs = all_gather_bytes(&self.base.pg, mine)?
            .into_iter()
            .map(|b| {
                (!b.is_empty())
                    .then(|| serde_json::from_slice(&b).ok())
                    .flatten()
            })
            .collect();
        let world = self.base.pg.world_size();
        let hook_states: Vec<(String, Vec<u8>)> =
            gather_bytes_to_rank0(&self.base.pg, encode_comm_hook_state(state))?
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .filter(|(_, bytes)| !bytes.is_empty())
                .map(|(rank, bytes)| (comm_hook_state_file(rank, world), bytes))
                .collect();
        let name = checkpoint_name(step);
        let outcome = SAVE_SUMMARY.decide(&self.base.pg, "write the checkpoint", || match self
            .write::<B, M, O>(model, optim, state, rank_rngs, hook_states, &name)
        {
            Err(CheckpointError::PartialOptimizerState { what }) => {
                Ok(WriteOutcome::PartialOptimizerState(what))
            }
            written => written.map(WriteOutcome::Saved),
        })?;
        match outcome {
            WriteOutcome::Saved(summary) => {
                Ok(summary.into_saved(self.base.config.dir(), name, step))
            }
            WriteOutcome::PartialOptimizerState(what) => {
                Err(CheckpointError::PartialOptimizerState { what })
            }
        }
    }

    fn write<B, M, O>(
        &self,
        model: &M,
        optim: &O,
        state: &TrainingState,
        rank_rngs: Vec<Option<serde_json::Value>>,
        hook_states: Vec<(String, Vec<u8>)>,
        name: &str,
    ) -> Result<SaveSummary, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let started = std::time::Instant::now();
        let dir = self.base.config.dir();
        // Before serialising anything: a save below a newer valid checkpoint is refused.
        check_not_backwards(dir, state.global_step, read_one)?;
        // Before the run id (which may log a new run): a partial record is refused.
        let optim_bytes = encode_optimizer::<B, M, O>(optim)?;
        let run_id = run_id_to_save(dir, state.global_step, MANIFEST_FILE)?;
        let (model_bytes, ids) = encode_model::<B, M>(model)?;
        let state_file = self.base.state_file(state, rank_rngs);
        let (path, manifest) = write_checkpoint(
            dir,
            name,
            state.global_step,
            run_id,
            model_bytes,
            optim_bytes,
            &state_file,
            ids,
            hook_states,
        )?;
        let removed = self.base.prune_after_save(state.global_step);
        tracing::info!(
            checkpoint = %path.display(),
            bytes = manifest.total_bytes(),
            removed = ?removed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "saved checkpoint {name}"
        );
        Ok(SaveSummary {
            bytes: manifest.total_bytes(),
            removed,
        })
    }

    /// Restores the newest valid checkpoint into `model` and `optim`, their tensors placed on
    /// `device` (each rank passes its own: burn's equivalent of `map_location`). Returns
    /// [`LoadOutcome::Resumed`] with the training state, or [`LoadOutcome::Fresh`] (logged)
    /// when the directory holds no checkpoint. Checkpoints failing verification are skipped
    /// and set aside (renamed `<name>.invalid`, never deleted; not by a read-only
    /// checkpointer) with a warning naming them and the bad file, and listed in the outcome.
    ///
    /// Rank 0 picks the checkpoint and reads it; the others receive the bytes from it, or
    /// read the same directory themselves with
    /// [`CheckpointConfig::with_shared_filesystem`]. Every rank ends with rank 0's view.
    ///
    /// Call it **before** wrapping the model in
    /// [`DistributedDataParallel`](crate::DistributedDataParallel): the restored module takes
    /// the saved `ParamId`s (the optimizer state is keyed by them), and DDP registers the ids
    /// at construction.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// [`CheckpointError::LoadModel`] / [`CheckpointError::LoadOptimizer`] when the checkpoint
    /// does not fit (on error `model` and `optim` are unchanged),
    /// [`CheckpointError::RunConfigMismatch`] (strict mode), I/O and communication errors;
    /// [`CheckpointError::NewerCheckpointElsewhere`] when another rank's directory holds a
    /// newer checkpoint than rank 0's (every rank lists its own: no shared filesystem);
    /// [`CheckpointError::Incompatible`] when the newest checkpoint was written by another
    /// version;
    /// [`CheckpointError::NoValidCheckpoint`] when checkpoints exist and none is valid (nothing
    /// is renamed or deleted then: the caller decides).
    pub fn load_latest<B, M, O>(
        &self,
        device: &B::Device,
        model: &mut M,
        optim: &mut O,
    ) -> Result<LoadOutcome, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let dir = self.base.config.dir().to_path_buf();
        let read_only = self.base.config.read_only();
        let search = on_rank0(&self.base.pg, "search for the latest checkpoint", || {
            find_checkpoint_to_resume(&dir, read_only)
        })?;
        let (found, header) = match search {
            Some(search) => {
                let header = ResumeHeader {
                    name: search.found.as_ref().map(|f| f.name.clone()),
                    invalid: search.invalid,
                };
                (search.found, header)
            }
            None => (
                None,
                ResumeHeader {
                    name: None,
                    invalid: Vec::new(),
                },
            ),
        };
        let header = self.share_header(header)?;
        self.base
            .resume_or_fresh(header, MANIFEST_FILE, "checkpoint", |name, invalid| {
                self.restore::<B, M, O>(device, model, optim, name, found, invalid)
            })
    }

    /// Restores checkpoint `name` (e.g. `step-0000000120`) like
    /// [`load_latest`](Self::load_latest), failing with [`CheckpointError::Invalid`] if it does
    /// not verify.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// `name` must be a single plain path component: `../other-run/step-1`, `a/b`, `/abs`,
    /// `.` and `` are refused, so a name from a config file or command line cannot read
    /// outside the checkpoint directory.
    ///
    /// # Errors
    /// As [`load_latest`](Self::load_latest), plus [`CheckpointError::Invalid`] and
    /// [`CheckpointError::InvalidName`].
    pub fn load<B, M, O>(
        &self,
        name: &str,
        device: &B::Device,
        model: &mut M,
        optim: &mut O,
    ) -> Result<Resumed, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        // On every rank, before any collective: every rank gets the same answer.
        validate_checkpoint_name(name)?;
        let dir = self.base.config.dir().to_path_buf();
        let found = on_rank0(&self.base.pg, "read the checkpoint", || {
            read_one(&dir, name).map_err(|e| e.into_error(name, &dir))
        })?;
        self.restore::<B, M, O>(device, model, optim, name, found, Vec::new())
    }

    /// Deletes every checkpoint above `global_step` and points `latest` at the newest one
    /// left; returns the deleted names. This is the explicit way to rewind a run (for example
    /// after [`load`](Self::load) of an older checkpoint) or to start a fresh run over an old
    /// one (`rewind_to(0)` before saving step 0): [`save`](Self::save) refuses to move `latest`
    /// below a newer valid checkpoint ([`CheckpointError::NewerCheckpointExists`]), so that a
    /// newer checkpoint is never silently hidden behind `latest` or kept out of pruning.
    ///
    /// # Collective
    /// Every rank calls it at the same point; rank 0 deletes.
    ///
    /// # Errors
    /// Rank 0's I/O errors (on every rank).
    pub fn rewind_to(&self, global_step: u64) -> Result<Vec<String>, CheckpointError> {
        self.base.rewind_to(global_step)
    }

    /// The checkpoints in the directory, oldest first (rank-local; not verified).
    ///
    /// # Errors
    /// [`CheckpointError::Storage`] with [`StorageError::Read`](crate::checkpoint::StorageError::Read).
    pub fn list(&self) -> Result<Vec<String>, CheckpointError> {
        let mut all = list_checkpoints(self.base.config.dir())?;
        all.sort();
        Ok(all.into_iter().map(|(_, name)| name).collect())
    }

    /// The checkpoint `latest` names (rank-local; not verified).
    ///
    /// # Errors
    /// [`CheckpointError::Storage`] with [`StorageError::Read`](crate::checkpoint::StorageError::Read).
    pub fn latest(&self) -> Result<Option<String>, CheckpointError> {
        read_latest(self.base.config.dir())
    }

    fn share_header(&self, header: ResumeHeader) -> Result<ResumeHeader, CheckpointError> {
        let json = (self.base.pg.rank() == 0)
            .then(|| RESUME_HEADER.encode(&header))
            .transpose()?;
        RESUME_HEADER.share(&self.base.pg, json)
    }
}
