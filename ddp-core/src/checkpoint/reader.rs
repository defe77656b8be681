//! Finding and verifying checkpoints (rank 0, or every rank on a shared filesystem).
//!
//! The newest valid checkpoint wins: every checkpoint is tried, newest first, and `latest` is
//! only a hint (a `latest` naming a missing checkpoint is reported as such). A complete
//! checkpoint newer than `latest` was committed by its rename; the writer died before moving
//! the pointer. Only genuine corruption moves the search to an older checkpoint: an I/O error
//! stops it (see [`ReadFailure`]).

use super::error::CheckpointError;
use super::error::{InvalidCheckpoint, InvalidReason};
use super::manifest::{ReadFailure, STATE_FILE, VerifiedFiles, read_verified};
use super::naming::{LATEST_FILE, list_checkpoints, parse_checkpoint_name};
use super::state::StateFile;
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

/// The name `<dir>/latest` holds, if it exists and names a checkpoint. `latest` is only a hint
/// (the search tries every checkpoint), so one that names no checkpoint, UTF-8 or not, is
/// ignored with a warning instead of failing the load.
pub(crate) fn read_latest(dir: &Path) -> Result<Option<String>, CheckpointError> {
    let path = dir.join(LATEST_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let name = text.trim();
            if parse_checkpoint_name(name).is_some() {
                Ok(Some(name.to_string()))
            } else {
                tracing::warn!(path = %path.display(), content = name, "ignoring a latest pointer that names no checkpoint");
                Ok(None)
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Read { path, source }),
    }
}

/// Finds the newest valid checkpoint in `dir`, warning about (and listing) every invalid one
/// tried before it.
///
/// # Errors
/// Listing `dir` or reading `latest` fails, or a checkpoint cannot be read for a reason other
/// than corruption ([`CheckpointError::ReadCheckpoint`]): falling back then would resume from
/// older state than what is on disk.
pub(crate) fn find_latest_valid(dir: &Path) -> Result<Search, CheckpointError> {
    let mut all = list_checkpoints(dir)?;
    let latest = read_latest(dir)?;
    let latest_step = latest.as_deref().and_then(parse_checkpoint_name);
    if let (Some(name), Some(step)) = (&latest, latest_step)
        && !all.iter().any(|(_, n)| n == name)
    {
        // Tried (and reported as missing) in its place.
        all.push((step, name.clone()));
    }
    all.sort_by(|a, b| b.cmp(a)); // newest first
    let mut search = Search::default();
    for (step, name) in all {
        if let Some(latest_step) = latest_step
            && step > latest_step
        {
            tracing::warn!(
                checkpoint = %name,
                latest = ?latest,
                "checkpoint {name} is newer than `latest` (the writer stopped before moving the pointer); using it if valid"
            );
        }
        match read_one(dir, &name) {
            Ok(found) => {
                search.found = Some(found);
                break;
            }
            Err(ReadFailure::Invalid(reason)) => {
                tracing::warn!(
                    checkpoint = %name,
                    dir = %dir.display(),
                    %reason,
                    "skipping invalid checkpoint {name}: {reason}; trying the previous one"
                );
                search.invalid.push(InvalidCheckpoint {
                    name,
                    reason,
                    set_aside: None,
                });
            }
            Err(io) => {
                let err = io.into_error(&name, dir);
                tracing::error!(checkpoint = %name, error = %err, "cannot read checkpoint {name}; not falling back");
                return Err(err);
            }
        }
    }
    Ok(search)
}

/// Reads and verifies checkpoint `name` of `dir`. A directory named like a checkpoint
/// (`step-N`) must hold checkpoint `step-N`: a renamed or copied one would otherwise be resumed
/// as newer (or older) than it is, and block every save below its name.
pub(crate) fn read_one(dir: &Path, name: &str) -> Result<FoundCheckpoint, ReadFailure> {
    let files = read_verified(&dir.join(name))?;
    let manifest = &files.manifest;
    if let Some(step) = parse_checkpoint_name(name)
        && (manifest.global_step != step || manifest.name != name)
    {
        return Err(InvalidReason::NameMismatch {
            dir_name: name.to_string(),
            manifest_name: manifest.name.clone(),
            manifest_step: manifest.global_step,
        }
        .into());
    }
    // A state file that passes the hash check but does not parse (another format) is as
    // unusable as a corrupted one.
    parse_state(files.get(STATE_FILE))?;
    Ok(FoundCheckpoint {
        name: name.to_string(),
        files,
    })
}

pub(crate) fn parse_state(bytes: &[u8]) -> Result<StateFile, InvalidReason> {
    serde_json::from_slice(bytes).map_err(|e| InvalidReason::BadState {
        file: STATE_FILE.into(),
        error: e.to_string(),
    })
}
