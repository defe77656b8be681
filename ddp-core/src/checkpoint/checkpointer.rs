//! [`Checkpointer`]: collective save and resume.

use super::codec::{decode_model, decode_optimizer, encode_model, encode_optimizer};
use super::config::CheckpointConfig;
use super::error::{CheckpointError, InvalidCheckpoint};
use super::manifest::{
    CHECKPOINT_FILES, MODEL_FILE, OPTIMIZER_FILE, PARAM_IDS_FILE, STATE_FILE, VerifiedFiles,
};
use super::outcome::{CheckpointInfo, LoadOutcome, Resumed, SavedCheckpoint};
use super::reader::{FoundCheckpoint, find_latest_valid, parse_state, read_latest, read_one};
use super::state::{FRAMEWORK_VERSION, StateFile, TrainingState};
use super::sync::{agree_on_step, all_gather_bytes, all_succeeded, broadcast_bytes, on_rank0};
use super::writer::{
    checkpoint_name, clean_temporaries, ensure_dir, list_checkpoints, prune, write_checkpoint,
};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Saves and restores model, optimizer and [`TrainingState`] for every rank of a process
/// group. See the [module docs](super) for a complete training loop.
///
/// Every method except [`list`](Self::list) and [`latest`](Self::latest) is **collective**:
/// all ranks call it at the same point, and an error on one rank is an error on all of them.
#[derive(Debug)]
pub struct Checkpointer {
    config: CheckpointConfig,
    pg: ProcessGroup,
}

/// What rank 0 tells the others after its search.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    name: Option<String>,
    invalid: Vec<InvalidCheckpoint>,
}

/// What rank 0 tells the others after a save.
#[derive(Debug, Serialize, Deserialize)]
struct SaveSummary {
    bytes: u64,
    removed: Vec<String>,
}

impl Checkpointer {
    /// Creates the checkpointer; rank 0 creates the directory and removes what an interrupted
    /// save left behind (temporary directories and files).
    ///
    /// # Collective
    /// # Errors
    /// [`CheckpointError::InvalidConfig`]; I/O errors of rank 0 (on every rank).
    pub fn new(config: CheckpointConfig, pg: ProcessGroup) -> Result<Self, CheckpointError> {
        config.validate()?;
        on_rank0(&pg, "prepare the checkpoint directory", || {
            ensure_dir(config.dir())?;
            for path in clean_temporaries(config.dir())? {
                tracing::info!(path = %path.display(), "removed the leftover of an interrupted checkpoint write");
            }
            Ok(())
        })?;
        Ok(Checkpointer { config, pg })
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The process group.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// Saves `model`, `optim` and `state` as checkpoint `step-<global_step>`: all ranks check
    /// they are at the same step, rank 0 writes atomically (replacing a checkpoint of the same
    /// step) and moves `latest`, then all ranks go on. Only rank 0's model, optimizer and
    /// state are written (DDP keeps them identical); each rank's `rank_rng` is gathered.
    ///
    /// # Collective
    /// # Errors
    /// [`CheckpointError::StepMismatch`]; rank 0's serialisation or I/O error (other ranks get
    /// [`CheckpointError::Rank0Failed`]); [`CheckpointError::Comm`]. A failed save never
    /// leaves a partial checkpoint and keeps the previous `latest`.
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
        let step = state.global_step;
        agree_on_step(&self.pg, step)?;
        let mine = match &state.rank_rng {
            Some(v) => serde_json::to_vec(v)
                .map_err(CheckpointError::json("serialising this rank's rng state"))?,
            None => Vec::new(),
        };
        let rank_rngs = all_gather_bytes(&self.pg, mine)?
            .into_iter()
            .map(|b| {
                (!b.is_empty())
                    .then(|| serde_json::from_slice(&b).ok())
                    .flatten()
            })
            .collect();
        let name = checkpoint_name(step);
        let summary = on_rank0(&self.pg, "write the checkpoint", || {
            let summary = self.write::<B, M, O>(model, optim, state, rank_rngs, &name)?;
            serde_json::to_vec(&summary)
                .map_err(CheckpointError::json("serialising the save summary"))
        })?;
        let summary = broadcast_bytes(
            &self.pg,
            summary.unwrap_or_default(),
            0,
            "sharing the save summary",
        )?;
        let summary: SaveSummary = serde_json::from_slice(&summary)
            .map_err(CheckpointError::json("decoding the save summary"))?;
        Ok(SavedCheckpoint {
            path: self.config.dir().join(&name),
            name,
            global_step: step,
            bytes: summary.bytes,
            removed: summary.removed,
        })
    }

    fn write<B, M, O>(
        &self,
        model: &M,
        optim: &O,
        state: &TrainingState,
        rank_rngs: Vec<Option<serde_json::Value>>,
        name: &str,
    ) -> Result<SaveSummary, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let started = std::time::Instant::now();
        let (model_bytes, ids) = encode_model::<B, M>(model)?;
        let optim_bytes = encode_optimizer::<B, M, O>(optim)?;
        let state_file = StateFile {
            training: state.clone(),
            rank_rngs,
            world_size: self.pg.world_size(),
            run_config_hash: self.config.run_config_hash().map(str::to_string),
            framework_version: FRAMEWORK_VERSION.to_string(),
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        };
        let state_bytes = serde_json::to_vec_pretty(&state_file)
            .map_err(CheckpointError::json(format!("serialising {STATE_FILE}")))?;
        let files = [
            (MODEL_FILE, model_bytes),
            (OPTIMIZER_FILE, optim_bytes),
            (STATE_FILE, state_bytes),
            (PARAM_IDS_FILE, ids),
        ];
        let dir = self.config.dir();
        let (path, manifest) = write_checkpoint(dir, name, state.global_step, &files)?;
        let removed = match self.config.keep_last() {
            Some(keep) => prune(dir, keep, state.global_step).unwrap_or_else(|e| {
                // The new checkpoint is complete; failing to delete old ones is not fatal.
                tracing::warn!(error = %e, "could not remove old checkpoints");
                Vec::new()
            }),
            None => Vec::new(),
        };
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
    /// when there is none. Checkpoints failing verification are skipped with a warning naming
    /// them and the bad file, and listed in the outcome.
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
    /// # Errors
    /// [`CheckpointError::LoadModel`] / [`CheckpointError::LoadOptimizer`] when the checkpoint
    /// does not fit (on error `model` and `optim` are unchanged),
    /// [`CheckpointError::RunConfigMismatch`] (strict mode), I/O and communication errors.
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
        let dir = self.config.dir().to_path_buf();
        let search = on_rank0(&self.pg, "search for the latest checkpoint", || {
            find_latest_valid(&dir)
        })?;
        let (found, header) = match search {
            Some(search) => {
                let header = Header {
                    name: search.found.as_ref().map(|f| f.name.clone()),
                    invalid: search.invalid,
                };
                (search.found, header)
            }
            None => (
                None,
                Header {
                    name: None,
                    invalid: Vec::new(),
                },
            ),
        };
        let header = self.share_header(header)?;
        match header.name.clone() {
            None => {
                tracing::info!(dir = %dir.display(), invalid = header.invalid.len(), "no valid checkpoint in {}: starting fresh", dir.display());
                Ok(LoadOutcome::Fresh {
                    dir,
                    invalid: header.invalid,
                })
            }
            Some(name) => {
                let resumed =
                    self.restore::<B, M, O>(device, model, optim, &name, found, header.invalid)?;
                Ok(LoadOutcome::Resumed(Box::new(resumed)))
            }
        }
    }

    /// Restores checkpoint `name` (e.g. `step-0000000120`) like
    /// [`load_latest`](Self::load_latest), failing with [`CheckpointError::Invalid`] if it does
    /// not verify.
    ///
    /// # Collective
    /// # Errors
    /// As [`load_latest`](Self::load_latest), plus [`CheckpointError::Invalid`].
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
        let dir = self.config.dir().to_path_buf();
        let found = on_rank0(&self.pg, "read the checkpoint", || {
            read_one(&dir, name).map_err(|reason| CheckpointError::Invalid {
                name: name.to_string(),
                dir: dir.clone(),
                reason,
            })
        })?;
        self.restore::<B, M, O>(device, model, optim, name, found, Vec::new())
    }

    /// The checkpoints in the directory, oldest first (rank-local; not verified).
    ///
    /// # Errors
    /// [`CheckpointError::Read`].
    pub fn list(&self) -> Result<Vec<String>, CheckpointError> {
        let mut all = list_checkpoints(self.config.dir())?;
        all.sort();
        Ok(all.into_iter().map(|(_, name)| name).collect())
    }

    /// The checkpoint `latest` names (rank-local; not verified).
    ///
    /// # Errors
    /// [`CheckpointError::Read`].
    pub fn latest(&self) -> Result<Option<String>, CheckpointError> {
        read_latest(self.config.dir())
    }

    fn share_header(&self, header: Header) -> Result<Header, CheckpointError> {
        let bytes = if self.pg.rank() == 0 {
            serde_json::to_vec(&header)
                .map_err(CheckpointError::json("serialising the resume header"))?
        } else {
            Vec::new()
        };
        let bytes = broadcast_bytes(&self.pg, bytes, 0, "sharing the resume header")?;
        serde_json::from_slice(&bytes).map_err(CheckpointError::json("decoding the resume header"))
    }

    /// Brings checkpoint `name` (read by rank 0 as `found`) to every rank and loads it.
    fn restore<B, M, O>(
        &self,
        device: &B::Device,
        model: &mut M,
        optim: &mut O,
        name: &str,
        found: Option<FoundCheckpoint>,
        invalid: Vec<InvalidCheckpoint>,
    ) -> Result<Resumed, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let (rank, dir) = (self.pg.rank(), self.config.dir().to_path_buf());
        let files = self.distribute(name, found)?;
        let state = parse_state(files.get(STATE_FILE)).map_err(|reason| CheckpointError::Invalid {
            name: name.to_string(),
            dir: dir.clone(),
            reason,
        });
        // Decode into copies: on any rank's failure, every rank's model and optimizer stay as
        // they were.
        let decoded = state.and_then(|state| {
            self.check_run_config(name, &state)?;
            let (mut m, mut o) = (model.clone(), optim.clone());
            decode_model::<B, M>(
                &mut m,
                device,
                files.get(MODEL_FILE).to_vec(),
                files.get(PARAM_IDS_FILE),
                name,
                rank,
            )?;
            decode_optimizer::<B, M, O>(
                &mut o,
                device,
                files.get(OPTIMIZER_FILE).to_vec(),
                name,
                rank,
            )?;
            Ok((m, o, state))
        });
        let (m, o, saved) = all_succeeded(&self.pg, decoded, "load the checkpoint")?;
        *model = m;
        *optim = o;

        let world_size = self.pg.world_size();
        let mut state = saved.training;
        if saved.world_size == world_size {
            state.rank_rng = saved.rank_rngs.get(rank).cloned().flatten();
        } else {
            tracing::warn!(
                checkpoint = name,
                saved = saved.world_size,
                current = world_size,
                "resuming on a different world size: model and optimizer load as saved; the sampler position \
                 is translated by global sample count where exact; per-rank rng states are dropped"
            );
        }
        let info = CheckpointInfo {
            name: name.to_string(),
            path: dir.join(name),
            global_step: files.manifest.global_step,
            saved_world_size: saved.world_size,
            world_size,
            run_config_hash: saved.run_config_hash,
            framework_version: saved.framework_version,
            bytes: files.manifest.total_bytes(),
        };
        if info.framework_version != FRAMEWORK_VERSION {
            tracing::warn!(checkpoint = name, saved = %info.framework_version, current = FRAMEWORK_VERSION, "checkpoint written by another ddp-core version");
        }
        tracing::info!(
            checkpoint = %info.path.display(),
            epoch = state.epoch,
            global_step = state.global_step,
            skipped = invalid.len(),
            "resumed from checkpoint {name}"
        );
        Ok(Resumed {
            info,
            state,
            invalid,
        })
    }

    /// Every rank gets checkpoint `name`'s files: rank 0 from `found`, the others by broadcast
    /// or (shared filesystem) by reading and verifying them themselves.
    fn distribute(
        &self,
        name: &str,
        found: Option<FoundCheckpoint>,
    ) -> Result<VerifiedFiles, CheckpointError> {
        let dir = self.config.dir();
        if self.config.shared_filesystem() {
            let mine = match found {
                Some(found) => Ok(found.files),
                None => read_one(dir, name).map(|f| f.files).map_err(|reason| {
                    CheckpointError::Invalid {
                        name: name.to_string(),
                        dir: dir.to_path_buf(),
                        reason,
                    }
                }),
            };
            return all_succeeded(
                &self.pg,
                mine,
                "read the checkpoint from the shared filesystem",
            );
        }
        let mut found = found.map(|f| f.files);
        let manifest = match &found {
            Some(files) => serde_json::to_vec(&files.manifest)
                .map_err(CheckpointError::json("serialising the manifest"))?,
            None => Vec::new(),
        };
        let manifest = broadcast_bytes(&self.pg, manifest, 0, "broadcasting the manifest")?;
        let manifest = serde_json::from_slice(&manifest)
            .map_err(CheckpointError::json("decoding the broadcast manifest"))?;
        let mut files = BTreeMap::new();
        for file in CHECKPOINT_FILES {
            let bytes = found
                .as_mut()
                .and_then(|f| f.files.remove(file))
                .unwrap_or_default();
            files.insert(
                file.to_string(),
                broadcast_bytes(&self.pg, bytes, 0, "broadcasting checkpoint files")?,
            );
        }
        Ok(VerifiedFiles { manifest, files })
    }

    fn check_run_config(&self, name: &str, saved: &StateFile) -> Result<(), CheckpointError> {
        let (Some(current), Some(saved)) = (
            self.config.run_config_hash(),
            saved.run_config_hash.as_deref(),
        ) else {
            return Ok(());
        };
        if current == saved {
            return Ok(());
        }
        if self.config.strict_run_config() {
            return Err(CheckpointError::RunConfigMismatch {
                name: name.to_string(),
                saved: saved.to_string(),
                current: current.to_string(),
            });
        }
        tracing::warn!(
            checkpoint = name,
            saved,
            current,
            "the run config changed since this checkpoint was saved"
        );
        Ok(())
    }
}
