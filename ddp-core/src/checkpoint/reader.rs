//! Finding and verifying checkpoints (rank 0, or every rank on a shared filesystem).
//!
//! `latest` is authoritative: the checkpoint it names is tried first, then older ones, newest
//! first. A checkpoint newer than the one `latest` names was never committed (the writer
//! crashed between the rename and the pointer update) and is not used. Without a readable
//! `latest`, every checkpoint is tried, newest first.

use super::error::{CheckpointError, InvalidCheckpoint, InvalidReason};
use super::manifest::{STATE_FILE, VerifiedFiles, read_verified};
use super::state::StateFile;
use super::writer::{LATEST_FILE, list_checkpoints, parse_checkpoint_name};
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

/// The name `<dir>/latest` holds, if it exists and names a checkpoint.
pub(crate) fn read_latest(dir: &Path) -> Result<Option<String>, CheckpointError> {
    let path = dir.join(LATEST_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
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
pub(crate) fn find_latest_valid(dir: &Path) -> Result<Search, CheckpointError> {
    let mut all = list_checkpoints(dir)?;
    all.sort_by(|a, b| b.cmp(a)); // newest first
    let latest = read_latest(dir)?;
    let mut candidates: Vec<String> = Vec::new();
    match latest
        .as_ref()
        .and_then(|n| parse_checkpoint_name(n).map(|s| (s, n)))
    {
        Some((latest_step, latest_name)) => {
            candidates.push(latest_name.clone());
            for (step, name) in &all {
                if *step > latest_step {
                    tracing::warn!(
                        checkpoint = %name,
                        latest = %latest_name,
                        "ignoring checkpoint newer than `latest` (never committed)"
                    );
                } else if name != latest_name {
                    candidates.push(name.clone());
                }
            }
        }
        None => candidates.extend(all.into_iter().map(|(_, name)| name)),
    }
    let mut search = Search::default();
    for name in candidates {
        match read_one(dir, &name) {
            Ok(found) => {
                search.found = Some(found);
                break;
            }
            Err(reason) => {
                tracing::warn!(
                    checkpoint = %name,
                    dir = %dir.display(),
                    %reason,
                    "skipping invalid checkpoint {name}: {reason}; trying the previous one"
                );
                search.invalid.push(InvalidCheckpoint { name, reason });
            }
        }
    }
    Ok(search)
}

/// Reads and verifies checkpoint `name` of `dir`.
pub(crate) fn read_one(dir: &Path, name: &str) -> Result<FoundCheckpoint, InvalidReason> {
    let files = read_verified(&dir.join(name))?;
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
