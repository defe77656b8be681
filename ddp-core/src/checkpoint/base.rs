//! What both checkpointers ([`FullCheckpointer`](super::FullCheckpointer) and
//! [`ShardedCheckpointer`](super::sharded::ShardedCheckpointer)) are made of and say to each
//! other's ranks the same way: the directory they open, the state file they write, what rank 0
//! tells the others after a save or a search.

use super::config::CheckpointConfig;
use super::error::{CheckpointError, InvalidCheckpoint};
use super::outcome::{LoadOutcome, Resumed, SavedCheckpoint};
use super::state::{FRAMEWORK_VERSION, StateFile, TrainingState};
use super::storage::directory::{prune, remove_newer_than};
use super::storage::elsewhere::check_no_newer_elsewhere;
use super::storage::lock::DirLock;
use super::storage::rank0::{Rank0Json, prepare_dir};
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// A checkpointer's shell, one for both formats: its configuration, its process group and rank
/// 0's lock on the directory, held for the checkpointer's life.
#[derive(Debug)]
pub(crate) struct CheckpointerBase {
    pub(crate) config: CheckpointConfig,
    pub(crate) pg: ProcessGroup,
    /// Rank 0's lock on the directory (one job per directory).
    _lock: Option<DirLock>,
}

impl CheckpointerBase {
    /// Validates `config`; rank 0 creates the directory, locks it and removes what an
    /// interrupted save of a `kind` checkpoint left behind. Collective.
    pub(crate) fn open(
        config: CheckpointConfig,
        pg: ProcessGroup,
        kind: &str,
    ) -> Result<Self, CheckpointError> {
        config.validate()?;
        let lock = prepare_dir(&pg, &config, kind)?;
        Ok(CheckpointerBase {
            config,
            pg,
            _lock: lock,
        })
    }

    /// The state file of a save of `state` now, with every rank's `rank_rngs`.
    pub(crate) fn state_file(
        &self,
        state: &TrainingState,
        rank_rngs: Vec<Option<serde_json::Value>>,
    ) -> StateFile {
        StateFile {
            training: state.without_comm_hook_state(),
            rank_rngs,
            world_size: self.pg.world_size(),
            run_config_hash: self.config.run_config_hash().map(str::to_string),
            framework_version: FRAMEWORK_VERSION.to_string(),
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }

    /// Every rank: rank 0 deletes every checkpoint above `global_step` and points `latest`
    /// at the newest one left; returns the deleted names (see `FullCheckpointer::rewind_to`).
    pub(crate) fn rewind_to(&self, global_step: u64) -> Result<Vec<String>, CheckpointError> {
        self.config.writable("rewind")?;
        let dir = self.config.dir().to_path_buf();
        REMOVED_NAMES.decide(
            &self.pg,
            "remove the checkpoints after the rewind point",
            || {
                let removed = remove_newer_than(&dir, global_step)?;
                if !removed.is_empty() {
                    tracing::warn!(dir = %dir.display(), removed = ?removed, "rewound to step {global_step}: removed newer checkpoints");
                }
                Ok::<_, CheckpointError>(removed)
            },
        )
    }

    /// Every rank, with rank 0's `header`: fails if another rank's directory holds a newer
    /// checkpoint (one with a `manifest_file`), else starts fresh (logged, naming the `kind`
    /// of checkpoint) or resumes the one found with `restore`. One resume decision for both
    /// formats.
    pub(crate) fn resume_or_fresh<E: From<CheckpointError>>(
        &self,
        header: ResumeHeader,
        manifest_file: &str,
        kind: &str,
        restore: impl FnOnce(&str, Vec<InvalidCheckpoint>) -> Result<Resumed, E>,
    ) -> Result<LoadOutcome, E> {
        check_no_newer_elsewhere(
            &self.pg,
            &self.config,
            manifest_file,
            header.name.as_deref(),
            &header.invalid,
        )?;
        match header.name {
            None => {
                let dir = self.config.dir().to_path_buf();
                tracing::info!(dir = %dir.display(), invalid = header.invalid.len(), "no valid {kind} in {}: starting fresh", dir.display());
                Ok(LoadOutcome::Fresh {
                    dir,
                    invalid: header.invalid,
                })
            }
            Some(name) => {
                let resumed = restore(&name, header.invalid)?;
                Ok(LoadOutcome::Resumed(Box::new(resumed)))
            }
        }
    }

    /// Rank 0, after the checkpoint of `global_step` is complete: removes the checkpoints
    /// beyond keep-last-K and returns their names. A failure is only a warning: the new
    /// checkpoint is safely on disk.
    pub(crate) fn prune_after_save(&self, global_step: u64) -> Vec<String> {
        match self.config.keep_last() {
            Some(keep) => prune(self.config.dir(), keep, global_step).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not remove old checkpoints");
                Vec::new()
            }),
            None => Vec::new(),
        }
    }
}

/// The names rank 0's rewind removed, as every rank learns them.
const REMOVED_NAMES: Rank0Json = Rank0Json {
    serialising: "serialising the removed names",
    sharing: "sharing the removed names",
    decoding: "decoding the removed names",
};

/// What rank 0 tells the others after a save.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SaveSummary {
    pub(crate) bytes: u64,
    pub(crate) removed: Vec<String>,
}

/// How [`SaveSummary`] travels from rank 0.
pub(crate) const SAVE_SUMMARY: Rank0Json = Rank0Json {
    serialising: "serialising the save summary",
    sharing: "sharing the save summary",
    decoding: "decoding the save summary",
};

impl SaveSummary {
    /// The caller's view of checkpoint `name` of `global_step`, saved in `dir`.
    pub(crate) fn into_saved(self, dir: &Path, name: String, global_step: u64) -> SavedCheckpoint {
        SavedCheckpoint {
            path: dir.join(&name),
            name,
            global_step,
            bytes: self.bytes,
            removed: self.removed,
        }
    }
}

/// What rank 0 tells the others after its search for the checkpoint to resume.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ResumeHeader {
    /// The checkpoint to resume, if any.
    pub(crate) name: Option<String>,
    /// The invalid checkpoints passed over (and set aside).
    pub(crate) invalid: Vec<InvalidCheckpoint>,
}

/// How [`ResumeHeader`] travels from rank 0.
pub(crate) const RESUME_HEADER: Rank0Json = Rank0Json {
    serialising: "serialising the resume header",
    sharing: "sharing the resume header",
    decoding: "decoding the resume header",
};
