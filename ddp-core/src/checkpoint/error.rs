//! [`CheckpointError`]: every way saving or restoring a checkpoint can fail; in it,
//! [`StorageError`]: the directory's reads, writes and lock, and [`InvalidReason`]: why a
//! checkpoint on disk failed verification.

use ddp_comm::CommError;
use ddp_data::DataError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Why a checkpoint directory failed verification against its manifest. Such a checkpoint is
/// skipped by [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest) (with a warning
/// naming it) in favour of the previous valid one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidReason {
    /// The directory does not exist (for example `latest` names a deleted checkpoint).
    #[error("directory {path} does not exist")]
    MissingDir {
        /// The checkpoint directory.
        path: String,
    },
    /// The manifest is missing (the checkpoint was never completed).
    #[error("manifest {file} is missing")]
    MissingManifest {
        /// The manifest's file name.
        file: String,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("manifest {file} is unreadable: {error}")]
    BadManifest {
        /// The manifest's file name.
        file: String,
        /// The parser's message.
        error: String,
    },
    /// The manifest was written by another checkpoint format. Not corruption: a load stops
    /// on it ([`CheckpointError::Incompatible`]) instead of skipping it.
    #[error(
        "{file} says checkpoint format v{found} (written by ddp-core {written_by}); this build \
         reads v{supported}"
    )]
    UnsupportedFormat {
        /// The manifest's file name.
        file: String,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
        /// The ddp-core version the manifest names (`unknown` when it names none).
        #[serde(default)]
        written_by: String,
    },
    /// The manifest does not list a file every checkpoint has.
    #[error("manifest does not list {file}")]
    NotInManifest {
        /// The file's name.
        file: String,
    },
    /// A file listed in the manifest is missing.
    #[error("file {file} is missing")]
    MissingFile {
        /// The file's name.
        file: String,
    },
    /// A file could not be read. No longer produced: an I/O error while loading is not
    /// corruption and fails the load ([`CheckpointError::ReadCheckpoint`]) instead of
    /// falling back to an older checkpoint. Kept so matches on this enum keep compiling.
    #[error("file {file} could not be read: {error}")]
    Unreadable {
        /// The file's name.
        file: String,
        /// The I/O error.
        error: String,
    },
    /// A file's size differs from the manifest's (truncated or appended to).
    #[error("file {file} has {found} bytes, the manifest says {expected}")]
    SizeMismatch {
        /// The file's name.
        file: String,
        /// Size in the manifest.
        expected: u64,
        /// Size on disk.
        found: u64,
    },
    /// A file's sha256 differs from the manifest's (altered contents).
    #[error("file {file} has sha256 {found}, the manifest says {expected}")]
    HashMismatch {
        /// The file's name.
        file: String,
        /// Hash in the manifest.
        expected: String,
        /// Hash of the contents on disk.
        found: String,
    },
    /// The directory's name and the manifest disagree on the checkpoint (a renamed or copied
    /// checkpoint): trusting the name would make it look newer or older than it is.
    #[error("the manifest says it is {manifest_name} (step {manifest_step}), not {dir_name}")]
    NameMismatch {
        /// The directory's name.
        dir_name: String,
        /// The name the manifest records.
        manifest_name: String,
        /// The step the manifest records.
        manifest_step: u64,
    },
    /// The training state passed the hash check but cannot be parsed: it was written that way,
    /// by a version with another state schema. Not corruption: a load stops on it
    /// ([`CheckpointError::Incompatible`]) instead of skipping it.
    #[error("file {file} does not parse: {error}")]
    BadState {
        /// The file's name.
        file: String,
        /// The parser's message, and the ddp-core version the checkpoint's manifest names.
        error: String,
    },
}

/// A checkpoint that failed verification and was skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidCheckpoint {
    /// The checkpoint's directory name, e.g. `step-0000000120`.
    pub name: String,
    /// What was wrong with it.
    pub reason: InvalidReason,
    /// The name it was set aside under (`step-0000000120.invalid`), if it was moved out of the
    /// way: invalid checkpoints are renamed, never deleted.
    #[serde(default)]
    pub set_aside: Option<String>,
}

impl std::fmt::Display for InvalidCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "checkpoint {}: {}", self.name, self.reason)?;
        if let Some(new_name) = &self.set_aside {
            write!(f, " (set aside as {new_name})")?;
        }
        Ok(())
    }
}

/// Reading, writing or locking the checkpoint directory failed: the storage layer's errors
/// (`checkpoint/storage/`), each naming its path. [`CheckpointError::Storage`] carries them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Another job holds the checkpoint directory (one job per directory).
    #[error(
        "checkpoint directory {dir} is in use by another job ({holder}); two jobs writing one \
         directory delete and overwrite each other's checkpoints. Wait for that job to end, stop it, \
         or give this job another --checkpoint-dir"
    )]
    DirLocked {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Who holds it, as the holder recorded it: host, pid, start time.
        holder: String,
    },
    /// The directory's lock file cannot be opened or locked.
    #[error(
        "locking {path} (one job per checkpoint directory): {source}{hint}",
        hint = read_only_hint(source)
    )]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The directory's file system has no locks (`flock`).
    #[error(
        "locking {path} (one job per checkpoint directory): the file system has no locks \
         ({source}); mount it with locks on (a Lustre client: `-o flock`), or turn the lock off \
         (CheckpointConfig::with_dir_lock(false); ddp-train: DdpStrategy::with_dir_lock(false)) \
         if you make sure yourself that one job at a time writes the directory"
    )]
    LockUnsupported {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A directory could not be created.
    #[error("creating directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file or directory could not be read or listed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `fsync` failed: the data may not be on disk.
    #[error("syncing {path} to disk: {source}")]
    Sync {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A rename failed.
    #[error("renaming {from} to {to}: {source}")]
    Rename {
        /// The source path.
        from: PathBuf,
        /// The destination path.
        to: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A stale temporary or pruned checkpoint could not be removed.
    #[error("removing {path}: {source}")]
    Remove {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Failures of the [`FullCheckpointer`](crate::checkpoint::FullCheckpointer). Collective operations fail on every
/// rank: ranks other than 0 get [`Rank0Failed`](Self::Rank0Failed) or
/// [`PeerFailed`](Self::PeerFailed) when another rank hit the actual error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading, writing or locking the checkpoint directory failed (the storage layer's
    /// errors, each naming its path).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A save committed its checkpoint, but the `latest` pointer could not be moved to it
    /// (a full disk, say). The checkpoint is durable, and resuming takes it anyway: the search
    /// takes the newest valid checkpoint and `latest` is only a hint. The storage needs
    /// attention before the next save.
    #[error(
        "checkpoint {name} is committed and is what a resume takes (the newest valid checkpoint \
         wins; `latest` is only a hint), but {} could not be pointed at it: {source}. Free space \
         or fix the directory before the next save",
        dir.join("latest").display()
    )]
    LatestNotUpdated {
        /// The committed checkpoint.
        name: String,
        /// The checkpoint directory.
        dir: PathBuf,
        /// Why `latest` could not be written.
        source: StorageError,
    },
    /// Checkpoints exist but none is valid: starting fresh would silently discard the run.
    #[error(
        "{dir} holds {} checkpoint(s) and none is valid: {}. Nothing was deleted. To resume one \
         anyway, repair or restore the named file (the rest of that checkpoint is intact), or \
         accept the file as it is by writing its size and sha256 into that checkpoint's \
         manifest.json; to start over, move the checkpoints away or start with --fresh \
         (the checkpointer's rewind_to(0))",
        invalid.len(),
        invalid.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    NoValidCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Every checkpoint tried, with why it is invalid.
        invalid: Vec<InvalidCheckpoint>,
    },
    /// The configuration is invalid.
    #[error("invalid checkpoint config: {0}")]
    InvalidConfig(String),
    /// A value could not be converted to or from JSON.
    #[error("{what}: {source}")]
    Json {
        /// What was being converted, e.g. `serialising the run config`.
        what: String,
        /// The serde_json error.
        #[source]
        source: serde_json::Error,
    },
    /// The model could not be serialised.
    #[error("serialising the model into {file}: {reason}")]
    SerializeModel {
        /// The model file.
        file: String,
        /// The store's message.
        reason: String,
    },
    /// The optimizer state could not be serialised.
    #[error("serialising the optimizer state into {file}: {reason}")]
    SerializeOptimizer {
        /// The optimizer file.
        file: String,
        /// The recorder's message.
        reason: String,
    },
    /// The optimizer's record is only part of its state (a [`ZeroRedundancyOptimizer`]'s shard
    /// before `consolidate_state`): writing it would lose the other ranks' state on resume, so
    /// nothing was written.
    ///
    /// [`ZeroRedundancyOptimizer`]: crate::zero::ZeroRedundancyOptimizer
    #[error("refusing to save a checkpoint: the optimizer's record is {what}")]
    PartialOptimizerState {
        /// Which part the record holds, and how to save the whole state.
        what: String,
    },
    /// The model file does not fit the model (different architecture, missing tensors...).
    #[error("loading {file} of checkpoint {name} into the model on rank {rank}: {reason}")]
    LoadModel {
        /// The checkpoint.
        name: String,
        /// The file.
        file: String,
        /// The rank that failed.
        rank: usize,
        /// What did not fit.
        reason: String,
    },
    /// The optimizer file does not fit the optimizer (a different optimizer type...).
    #[error("loading {file} of checkpoint {name} into the optimizer on rank {rank}: {reason}")]
    LoadOptimizer {
        /// The checkpoint.
        name: String,
        /// The file.
        file: String,
        /// The rank that failed.
        rank: usize,
        /// The recorder's message.
        reason: String,
    },
    /// A file of a checkpoint could not be read for a reason other than its absence (EIO,
    /// ESTALE, EACCES...). The load stops instead of falling back to an older checkpoint: a
    /// transient error must not make the run resume from, and then save over, older state.
    #[error(
        "reading {path} of checkpoint {name}: {source} (an I/O error, not corruption: not falling back to an older checkpoint)"
    )]
    ReadCheckpoint {
        /// The checkpoint's directory name.
        name: String,
        /// The file or directory that failed.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A save would move `latest` below a newer valid checkpoint already on disk (for example
    /// after resuming from an older checkpoint with [`FullCheckpointer::load`](crate::checkpoint::FullCheckpointer::load)).
    /// Refused so that newer valid checkpoints are never hidden behind `latest` and never
    /// left out of pruning; [`FullCheckpointer::rewind_to`](crate::checkpoint::FullCheckpointer::rewind_to)
    /// and [`ShardedCheckpointer::rewind_to`](crate::checkpoint::sharded::ShardedCheckpointer::rewind_to)
    /// rewind a run deliberately.
    #[error(
        "refusing to save step {step} in {dir}: checkpoint {newer} is newer and valid, and `latest` never moves backwards; \
         resume from it, or rewind deliberately with the checkpointer's rewind_to"
    )]
    NewerCheckpointExists {
        /// The step being saved.
        step: u64,
        /// The newer valid checkpoint.
        newer: String,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A checkpoint name that is not a single plain path component (`../x`, `a/b`, `/abs`,
    /// empty...): loading it would read outside the checkpoint directory.
    #[error("invalid checkpoint name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An intact checkpoint that another version wrote (another manifest format, or a
    /// training state of another schema). Not skipped for an older checkpoint, nor set aside:
    /// resuming older state because of a build mismatch would silently discard training.
    #[error(
        "checkpoint {name} in {dir} was written by another version: {reason}. It is intact, not corrupt, so it was neither skipped for an older checkpoint \
         nor set aside. To resume it, upgrade to a build that reads it; to resume an older \
         checkpoint instead, move it out of {dir} deliberately"
    )]
    Incompatible {
        /// The checkpoint's directory name.
        name: String,
        /// The checkpoint root directory.
        dir: PathBuf,
        /// What this build cannot read ([`InvalidReason::UnsupportedFormat`] or
        /// [`InvalidReason::BadState`]); boxed to keep every `Result` of this error small.
        reason: Box<InvalidReason>,
    },
    /// Another rank's checkpoint directory holds a complete checkpoint newer than the one rank 0
    /// resumes (or rank 0 resumes none): the ranks do not share the directory, and rank 0 (after
    /// an elastic restart, maybe another host than the one that wrote it) would resume older
    /// state, or start over, without a word.
    #[error(
        "rank {rank} holds checkpoint {name} (step {step}) in its directory {dir}, newer than \
         what rank 0 would resume from {rank0_dir} ({}); not resuming. If it is this run's \
         (rank 0 was another host before a restart), checkpoints must be on a file system every \
         host that can become rank 0 shares: copy {name} into rank 0's directory. If it is left \
         from another run (starting over clears rank 0's directory only; a fresh start, \
         record_fresh_start or --fresh, passes over the runs the other ranks held then, and \
         this one's was not among them or has no run id), remove it there, or turn this check \
         off with CheckpointConfig::with_other_ranks_checked(false)",
        .resumed.as_deref().unwrap_or("no checkpoint: a fresh start")
    )]
    NewerCheckpointElsewhere {
        /// The rank holding the newer checkpoint (the newest one, if several do).
        rank: usize,
        /// The checkpoint's name.
        name: String,
        /// Its global step.
        step: u64,
        /// That rank's checkpoint directory, on its host.
        dir: PathBuf,
        /// Rank 0's checkpoint directory.
        rank0_dir: PathBuf,
        /// The checkpoint rank 0 would resume, if any.
        resumed: Option<String>,
    },
    /// The checkpoint rank 0 would resume is of a run that a fresh start superseded, as a
    /// rank's directory records: without a shared filesystem, rank 0 is back on a host that
    /// still holds the older run after `--fresh` started a new one with another host as rank 0.
    /// Resuming it would silently drop the newer run.
    #[error(
        "checkpoint {name} in rank 0's directory {rank0_dir} is of run {run_id}, which a fresh \
         start superseded (recorded in rank {rank}'s directory {dir}); not resuming it, which \
         would silently drop the run started then. Remove the superseded run's checkpoints from \
         {rank0_dir} (and copy the newer run's newest checkpoint there to continue it; better, \
         put the checkpoints on a file system every host that can become rank 0 shares), or \
         start fresh again (--fresh, record_fresh_start)"
    )]
    SupersededCheckpoint {
        /// The checkpoint rank 0 would resume.
        name: String,
        /// Its run id.
        run_id: String,
        /// Rank 0's checkpoint directory.
        rank0_dir: PathBuf,
        /// The lowest rank whose directory records the run as superseded.
        rank: usize,
        /// That rank's directory.
        dir: PathBuf,
    },
    /// The requested checkpoint failed verification.
    #[error("checkpoint {name} in {dir} is invalid: {reason}")]
    Invalid {
        /// The checkpoint directory's name.
        name: String,
        /// The checkpoint root directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: InvalidReason,
    },
    /// The ranks called `save` with different global steps.
    #[error(
        "ranks called save with different global steps ({min} to {max}); every rank must save at the same step"
    )]
    StepMismatch {
        /// The smallest step.
        min: u64,
        /// The largest step.
        max: u64,
    },
    /// The run config's hash differs from the checkpoint's and the check is strict.
    #[error(
        "the run config changed since checkpoint {name}: its hash was {saved}, now {current} (strict run-config check)"
    )]
    RunConfigMismatch {
        /// The checkpoint.
        name: String,
        /// The hash saved in the checkpoint.
        saved: String,
        /// The hash of the current run config.
        current: String,
    },
    /// The checkpoint holds no sampler state but a loader restore was requested.
    #[error("checkpoint {name} holds no sampler state; save one with TrainingState::with_sampler")]
    NoSamplerState {
        /// The checkpoint.
        name: String,
    },
    /// The data loader or sampler refused the saved position (see `ddp_data::DataError`, e.g.
    /// a mid-epoch world-size change that cannot be translated exactly).
    #[error("restoring the data loader from checkpoint {name}: {source}")]
    Sampler {
        /// The checkpoint.
        name: String,
        /// ddp-data's error.
        #[source]
        source: DataError,
    },
    /// A write to a checkpointer opened read-only.
    #[error(
        "cannot {action} in {dir}: this checkpointer was opened read-only \
         (CheckpointConfig::with_read_only(true)); open one without it to write"
    )]
    ReadOnly {
        /// What was asked.
        action: &'static str,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// Rank 0 failed; its message was broadcast to this rank.
    #[error("rank 0 failed to {action}: {message}")]
    Rank0Failed {
        /// What rank 0 was doing.
        action: &'static str,
        /// Rank 0's error message.
        message: String,
    },
    /// Another rank failed while this one succeeded.
    #[error("rank {rank} failed to {action} (see that rank's error)")]
    PeerFailed {
        /// The failing rank (the highest one, if several failed).
        rank: usize,
        /// What it was doing.
        action: &'static str,
    },
    /// A collective failed (a peer died, stalled, or disagreed).
    #[error("{context}: {source}")]
    Comm {
        /// What the checkpointer was doing.
        context: &'static str,
        /// The communication error.
        #[source]
        source: CommError,
    },
}

impl CheckpointError {
    pub(crate) fn comm(context: &'static str) -> impl FnOnce(CommError) -> CheckpointError {
        move |source| CheckpointError::Comm { context, source }
    }

    pub(crate) fn json(
        what: impl Into<String>,
    ) -> impl FnOnce(serde_json::Error) -> CheckpointError {
        let what = what.into();
        move |source| CheckpointError::Json { what, source }
    }
}

/// What to do when the lock file cannot be written because the directory is read-only.
fn read_only_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied => {
            "; to only load from a directory this job cannot write, open the checkpointer \
             read-only (CheckpointConfig::with_read_only(true))"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_this_job_cannot_write_points_at_read_only_loading() {
        let lock = |kind| StorageError::Lock {
            path: PathBuf::from("/mnt/ro/runs/lock"),
            source: std::io::Error::from(kind),
        };
        for kind in [
            std::io::ErrorKind::ReadOnlyFilesystem,
            std::io::ErrorKind::PermissionDenied,
        ] {
            let text = lock(kind).to_string();
            assert!(
                text.contains("CheckpointConfig::with_read_only(true)"),
                "{text}"
            );
        }
        let other = lock(std::io::ErrorKind::Other).to_string();
        assert!(!other.contains("read-only"), "{other}");
    }
}
