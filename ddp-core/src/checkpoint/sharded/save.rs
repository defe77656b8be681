//! [`ShardedCheckpointer`] and its save: every rank writes its shard into the staging
//! directory, then rank 0 checks that every shard is there, writes the manifest and commits
//! by renaming the directory (see the [module docs](super) for the protocol).

use super::super::base::{CheckpointerBase, SAVE_SUMMARY, SaveSummary};
use super::super::comm_hook_files::{comm_hook_state_file, encode_comm_hook_state};
use super::super::config::CheckpointConfig;
use super::super::crash_point::crash_point;
use super::super::error::{CheckpointError, StorageError};
use super::super::manifest::FileEntry;
use super::super::outcome::SavedCheckpoint;
use super::super::state::{FRAMEWORK_VERSION, TrainingState};
use super::super::storage::directory::{check_not_backwards, point_latest_at_committed};
use super::super::storage::durable::{fresh_dir, remove_path, sync_dir, write_synced};
use super::super::storage::install::install_checkpoint;
use super::super::storage::naming::{TMP_PREFIX, checkpoint_name};
use super::super::storage::rank0::{agree_on_step, all_gather_bytes};
use super::super::storage::rank0::{all_succeeded, on_rank0};
use super::super::storage::run_id::run_id_to_save;
use super::codec::{encode_model_shard, encode_optimizer_shard, tensor_ids};
use super::error::ShardedCheckpointError;
use super::manifest::{
    SHARDED_FORMAT_VERSION, SHARDED_MANIFEST_FILE, ShardEntry, ShardedManifest, TensorEntry,
    model_shard_file, optimizer_shard_file, verify_checkpoint,
};
use super::optimizer_state::{ShardedOptimizerState, StateHolding};
use super::ownership::Ownership;
use super::safetensors;
use burn::module::{AutodiffModule, ParamId};
use burn::optim::Optimizer;
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::ProcessGroup;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Test-only crash points of a sharded save (with the `test-hooks` feature), in the order a
/// save passes them, for [`TEST_CRASH_AT_ENV`](super::super::TEST_CRASH_AT_ENV):
///
/// - `sharded-before-manifest`: every shard is written, fsynced and confirmed; no manifest;
/// - `sharded-before-rename`: the manifest is in the staging directory, not yet committed;
/// - `sharded-after-rename`: committed under its final name, `latest` not yet moved.
#[cfg(any(test, feature = "test-hooks"))]
pub const SHARDED_CRASH_POINTS: &[&str] = &[
    "sharded-before-manifest",
    "sharded-before-rename",
    "sharded-after-rename",
];

/// Saves and loads sharded checkpoints: every rank writes its own shard of the model and of
/// the optimizer state, and a load at any world size takes what it needs from whichever shards
/// hold it. See the [module docs](super) for the layout, the commit protocol and the
/// shared-filesystem requirement.
///
/// Every method is **collective**: all ranks call it at the same point.
#[derive(Debug)]
pub struct ShardedCheckpointer {
    pub(super) base: CheckpointerBase,
}

/// What a rank tells the others after writing its shard.
#[derive(Debug, Serialize, Deserialize)]
struct ShardReport {
    model: FileEntry,
    optimizer: FileEntry,
    tensors: BTreeMap<String, TensorEntry>,
    rank_rng: Option<serde_json::Value>,
    /// Its communication-hook state file, if it has a state.
    comm_hook: Option<FileEntry>,
}

impl ShardedCheckpointer {
    /// Creates the checkpointer; rank 0 creates the directory and removes what an interrupted
    /// save left behind (staging directories, temporary files).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidConfig`]; I/O errors of rank 0 (on every rank).
    pub fn new(config: CheckpointConfig, pg: ProcessGroup) -> Result<Self, ShardedCheckpointError> {
        Ok(ShardedCheckpointer {
            base: CheckpointerBase::open(config, pg, "sharded")?,
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

    /// Deletes every checkpoint above `global_step` and points `latest` at the newest one
    /// left; returns the deleted names. As [`FullCheckpointer::rewind_to`]: the explicit way
    /// to rewind a run, or to start a fresh one over an old one, since a save never moves
    /// `latest` below a newer valid checkpoint. Set-aside invalid checkpoints stay.
    ///
    /// # Collective
    /// Every rank calls it at the same point; rank 0 deletes.
    ///
    /// # Errors
    /// Rank 0's I/O errors (on every rank).
    ///
    /// [`FullCheckpointer::rewind_to`]: crate::checkpoint::FullCheckpointer::rewind_to
    pub fn rewind_to(&self, global_step: u64) -> Result<Vec<String>, ShardedCheckpointError> {
        Ok(self.base.rewind_to(global_step)?)
    }

    /// Saves `model`, a replicated optimizer (plain DDP: every rank holds every parameter's
    /// state) and `state` as checkpoint `step-<global_step>`: each rank writes the tensors and
    /// optimizer state of its part of the partition (about `1/world` of the bytes), then rank
    /// 0 commits. `rank_rng` is kept per rank, and so is
    /// [`comm_hook_state`](TrainingState::comm_hook_state): each rank writes its own file.
    ///
    /// # Collective
    /// Every rank calls it at the same point, with identical replicas.
    ///
    /// # Errors
    /// [`CheckpointError::StepMismatch`], [`CheckpointError::NewerCheckpointExists`], I/O
    /// and serialisation errors (of any rank, on every rank),
    /// [`ShardedCheckpointError::MissingShard`] (no shared filesystem). A failed save commits
    /// nothing and keeps the previous `latest`, except [`CheckpointError::LatestNotUpdated`]:
    /// the checkpoint is committed (and resumable), only `latest` could not be moved to it.
    pub fn save<B, M, O, R>(
        &self,
        model: &M,
        optim: &O,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B>,
    {
        self.save_record::<B, M, R>(model, optim.to_record(), StateHolding::Replicated, state)
    }

    /// Saves `model`, the optimizer state `optim` holds (replicated or partitioned, as it
    /// says: see [`ShardedOptimizerState`]) and `state` as sharded checkpoint
    /// `step-<global_step>`. The one save of every holder: DDP's burn optimizer, ZeRO's
    /// optimizer, FSDP's state, or a user's own sharded optimizer.
    ///
    /// # Collective
    /// Every rank calls it at the same point, with identical replicas.
    ///
    /// # Errors
    /// As [`save`](Self::save), plus [`ShardedCheckpointError::ForeignOptimizerState`] when a
    /// partitioned holder has state of parameters another rank owns at this world size (a
    /// partition of another process group).
    pub fn save_state<B, M, S>(
        &self,
        model: &M,
        optim: &S,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        S: ShardedOptimizerState<B, M>,
    {
        self.save_record::<B, M, S::Record>(model, optim.state_to_save(), optim.holding(), state)
    }

    /// Saves `model` and `record` (this rank's optimizer state, as `held` says).
    fn save_record<B, M, R>(
        &self,
        model: &M,
        record: HashMap<ParamId, R>,
        held: StateHolding,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        R: Record<B>,
    {
        self.base.config.writable("save a checkpoint")?;
        let started = std::time::Instant::now();
        let (rank, world) = (self.base.pg.rank(), self.base.pg.world_size());
        let step = state.global_step;
        agree_on_step(&self.base.pg, step)?;
        let dir = self.base.config.dir().to_path_buf();
        let name = checkpoint_name(step);
        let staging = dir.join(format!("{TMP_PREFIX}{name}-sharded"));
        on_rank0::<_, ShardedCheckpointError>(
            &self.base.pg,
            "prepare the staging directory",
            || {
                check_not_backwards(&dir, step, verify_checkpoint)?;
                fresh_dir(&staging)?;
                Ok(())
            },
        )?;

        let written = self.write_shard::<B, M, R>(model, record, held, state, &staging);
        let written =
            all_succeeded::<_, ShardedCheckpointError>(&self.base.pg, written, "write its shard");
        let report = match written {
            Ok(report) => report,
            Err(e) => {
                if rank == 0 {
                    // Best effort: the next start removes it anyway.
                    let _ = remove_path(&staging);
                }
                return Err(e);
            }
        };
        // Nothing fails alone before the collective: an unencodable report travels as empty
        // bytes, which rank 0's commit refuses for every rank.
        let report = serde_json::to_vec(&report).unwrap_or_default();
        let reports = all_gather_bytes(&self.base.pg, report)?;

        let summary = SAVE_SUMMARY.decide::<_, ShardedCheckpointError>(
            &self.base.pg,
            "commit the sharded checkpoint",
            || {
                let committed = self.commit(&staging, &name, state, reports);
                if committed.is_err() && staging.exists() {
                    let _ = remove_path(&staging);
                }
                committed
            },
        )?;
        tracing::info!(
            checkpoint = %dir.join(&name).display(),
            rank,
            world,
            bytes = summary.bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "saved sharded checkpoint {name}"
        );
        Ok(summary.into_saved(&dir, name, step))
    }

    /// Writes and fsyncs this rank's two shard files into `staging`.
    fn write_shard<B, M, R>(
        &self,
        model: &M,
        record: HashMap<ParamId, R>,
        held: StateHolding,
        state: &TrainingState,
        staging: &Path,
    ) -> Result<ShardReport, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        R: Record<B>,
    {
        let (rank, world) = (self.base.pg.rank(), self.base.pg.world_size());
        let ownership = Ownership::of::<B, M>(model, world);
        let foreign = record
            .keys()
            .filter(|id| !ownership.owns(rank, **id))
            .count();
        if held == StateHolding::Partitioned && foreign > 0 {
            return Err(ShardedCheckpointError::ForeignOptimizerState {
                rank,
                count: foreign,
                world_size: world,
            });
        }
        let mine: HashMap<ParamId, R> = record
            .into_iter()
            .filter(|(id, _)| ownership.owns(rank, *id))
            .collect();
        let model_file = model_shard_file(rank, world);
        let optim_file = optimizer_shard_file(rank, world);
        let model_bytes = encode_model_shard::<B, M>(model, &ownership, rank, &model_file)?;
        let (raw, _) = safetensors::tensors(&model_bytes).map_err(|reason| {
            CheckpointError::SerializeModel {
                file: model_file.clone(),
                reason,
            }
        })?;
        let mut tensors = BTreeMap::new();
        for (path, id) in tensor_ids::<B, M>(model) {
            if let Some(t) = raw.get(&path) {
                tensors.insert(
                    path,
                    TensorEntry {
                        rank,
                        dtype: t.dtype.clone(),
                        shape: t.shape.clone(),
                        param_id: id.val(),
                        optimizer_state: mine.contains_key(&id),
                    },
                );
            }
        }
        let optim_bytes = encode_optimizer_shard::<B, R>(mine, &optim_file)?;
        if !staging.is_dir() {
            // Rank 0 created it before this rank got here: it is on another file system.
            return Err(ShardedCheckpointError::NotShared {
                rank,
                path: staging.to_path_buf(),
            });
        }
        write_synced(&staging.join(&model_file), &model_bytes)?;
        write_synced(&staging.join(&optim_file), &optim_bytes)?;
        let hook_bytes = encode_comm_hook_state(state);
        let comm_hook = if hook_bytes.is_empty() {
            None
        } else {
            let file = comm_hook_state_file(rank, world);
            write_synced(&staging.join(&file), &hook_bytes)?;
            Some(FileEntry::of(&file, &hook_bytes))
        };
        Ok(ShardReport {
            model: FileEntry::of(&model_file, &model_bytes),
            optimizer: FileEntry::of(&optim_file, &optim_bytes),
            tensors,
            rank_rng: state.rank_rng.clone(),
            comm_hook,
        })
    }

    /// Rank 0: checks that every rank's shard is in `staging`, writes the manifest, renames
    /// the directory into place (the commit), moves `latest` and prunes.
    fn commit(
        &self,
        staging: &Path,
        name: &str,
        state: &TrainingState,
        reports: Vec<Vec<u8>>,
    ) -> Result<SaveSummary, ShardedCheckpointError> {
        let dir = self.base.config.dir();
        let mut shards = Vec::with_capacity(reports.len());
        let mut tensors = BTreeMap::new();
        let mut rank_rngs = Vec::with_capacity(reports.len());
        for (rank, bytes) in reports.iter().enumerate() {
            let report: ShardReport = serde_json::from_slice(bytes)
                .map_err(CheckpointError::json("decoding a rank's shard report"))?;
            for file in [&report.model, &report.optimizer]
                .into_iter()
                .chain(report.comm_hook.as_ref())
            {
                check_present(staging, rank, file)?;
            }
            for (path, entry) in report.tensors {
                if tensors.insert(path.clone(), entry).is_some() {
                    return Err(ShardedCheckpointError::Duplicate {
                        name: name.to_string(),
                        what: format!("tensor {path}"),
                    });
                }
            }
            rank_rngs.push(report.rank_rng);
            shards.push(ShardEntry {
                rank,
                model: report.model,
                optimizer: report.optimizer,
                comm_hook: report.comm_hook,
            });
        }
        crash_point("sharded-before-manifest");
        let run_id = run_id_to_save(dir, state.global_step, SHARDED_MANIFEST_FILE)?;
        let manifest = ShardedManifest {
            format_version: SHARDED_FORMAT_VERSION,
            name: name.to_string(),
            global_step: state.global_step,
            world_size: shards.len(),
            framework_version: FRAMEWORK_VERSION.to_string(),
            run_id: Some(run_id),
            shards,
            tensors,
            state: self.base.state_file(state, rank_rngs),
        };
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(CheckpointError::json("serialising the sharded manifest"))?;
        write_synced(&staging.join(SHARDED_MANIFEST_FILE), &bytes)?;
        sync_dir(staging)?;
        crash_point("sharded-before-rename");
        install_checkpoint(dir, staging, name)?.remove_replaced();
        crash_point("sharded-after-rename");
        point_latest_at_committed(dir, name)?;
        Ok(SaveSummary {
            bytes: manifest.total_bytes(),
            removed: self.base.prune_after_save(state.global_step),
        })
    }
}

/// Checks that rank `rank`'s shard `file` is in `staging` with the size that rank wrote:
/// without a shared filesystem it is not.
fn check_present(
    staging: &Path,
    rank: usize,
    file: &FileEntry,
) -> Result<(), ShardedCheckpointError> {
    let path = staging.join(&file.name);
    let found = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() && meta.len() == file.size => return Ok(()),
        Ok(meta) if meta.is_file() => {
            format!("{} bytes, rank {rank} wrote {}", meta.len(), file.size)
        }
        Ok(_) => "not a file".to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no such file".to_string(),
        Err(source) => {
            return Err(CheckpointError::from(StorageError::Read { path, source }).into());
        }
    };
    Err(ShardedCheckpointError::MissingShard { rank, path, found })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_rank_0_cannot_see_is_an_error_naming_the_rank_and_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.bin"), b"abc").expect("write");
        assert!(check_present(dir.path(), 0, &FileEntry::of("a.bin", b"abc")).is_ok());
        let err = check_present(dir.path(), 2, &FileEntry::of("b.bin", b"abc")).unwrap_err();
        assert!(
            matches!(&err, ShardedCheckpointError::MissingShard { rank: 2, path, .. } if path.ends_with("b.bin")),
            "{err}"
        );
        assert!(err.to_string().contains("shares"), "{err}");
        let short = check_present(dir.path(), 1, &FileEntry::of("a.bin", b"abcd")).unwrap_err();
        assert!(
            short.to_string().contains("3 bytes, rank 1 wrote 4"),
            "{short}"
        );
    }
}
