//! Finding and verifying rank-0 checkpoints (rank 0, or every rank on a shared filesystem).
//! What a valid checkpoint of this format is lives here ([`read_one`]); the newest-valid
//! search itself is the [storage layer's](super::super::storage::directory), shared with sharded
//! checkpoints.

use super::super::error::CheckpointError;
use super::super::error::{InvalidCheckpoint, InvalidReason};
use super::super::manifest::{
    HookStateFiles, ReadFailure, STATE_FILE, VerifiedFiles, read_verified,
};
use super::super::state::StateFile;
use super::super::storage::directory::newest_valid_to_resume;
use super::super::storage::naming::check_name;
use std::path::Path;

/// A verified checkpoint read into memory.
#[derive(Debug, Clone)]
pub(crate) struct FoundCheckpoint {
    pub(crate) name: String,
    pub(crate) files: VerifiedFiles,
}

/// What the search for the latest valid checkpoint found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Search {
    pub(crate) found: Option<FoundCheckpoint>,
    pub(crate) invalid: Vec<InvalidCheckpoint>,
}

/// Finds the checkpoint to resume in `dir`: the newest valid one, every invalid one tried
/// before it set aside unless `read_only` (see [`newest_valid_to_resume`]).
///
/// # Errors
/// [`CheckpointError::NoValidCheckpoint`]; listing `dir` or reading `latest` fails, or a
/// checkpoint cannot be read for a reason other than corruption
/// ([`CheckpointError::ReadCheckpoint`]), or another version wrote it
/// ([`CheckpointError::Incompatible`]): falling back then would resume from older state than
/// what is on disk.
pub(crate) fn find_checkpoint_to_resume(
    dir: &Path,
    read_only: bool,
) -> Result<Search, CheckpointError> {
    let search = newest_valid_to_resume(dir, read_only, read_one)?;
    Ok(Search {
        found: search.found.map(|(_, found)| found),
        invalid: search.invalid,
    })
}

/// Reads and verifies checkpoint `name` of `dir`. A directory named like a checkpoint
/// (`step-N`) must hold checkpoint `step-N`: a renamed or copied one would otherwise be resumed
/// as newer (or older) than it is, and block every save below its name.
pub(crate) fn read_one(dir: &Path, name: &str) -> Result<FoundCheckpoint, ReadFailure> {
    read_one_with(dir, name, HookStateFiles::All)
}

/// [`read_one`], loading only the communication-hook state files `hook_states` asks for.
pub(crate) fn read_one_with(
    dir: &Path,
    name: &str,
    hook_states: HookStateFiles,
) -> Result<FoundCheckpoint, ReadFailure> {
    let files = read_verified(&dir.join(name), hook_states)?;
    let manifest = &files.manifest;
    check_name(name, &manifest.name, manifest.global_step)?;
    // The hash check covers the state file: one that passes it and does not parse was
    // written that way, by a version with another state schema. Version skew, not corruption:
    // falling back would resume older state only because of the build.
    parse_state(files.get(STATE_FILE), &manifest.framework_version)
        .map_err(ReadFailure::Incompatible)?;
    Ok(FoundCheckpoint {
        name: name.to_string(),
        files,
    })
}

/// Parses `training_state.json` (`bytes`) of a checkpoint the ddp-core version `written_by`
/// wrote.
pub(crate) fn parse_state(bytes: &[u8], written_by: &str) -> Result<StateFile, InvalidReason> {
    serde_json::from_slice(bytes).map_err(|e| InvalidReason::BadState {
        file: STATE_FILE.into(),
        error: format!("{e} (written by ddp-core {written_by})"),
    })
}
