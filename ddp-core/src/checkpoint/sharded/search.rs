//! Finding the newest valid sharded checkpoint (rank 0): every checkpoint directory, newest
//! first, `latest` only a hint, as for rank-0 checkpoints. A checkpoint is valid when its
//! manifest parses and every shard file has the size and sha256 the manifest lists; only such
//! corruption moves the search to an older checkpoint, an I/O error stops it.

use super::super::error::{CheckpointError, InvalidCheckpoint};
use super::super::manifest::ReadFailure;
use super::super::naming::{list_checkpoints, parse_checkpoint_name};
use super::super::reader::read_latest;
use super::super::set_aside::set_aside;
use super::manifest::verify_all;
use std::path::Path;

/// The name of the newest valid checkpoint of `dir` and the invalid ones tried before it.
pub(super) fn find_latest_valid(
    dir: &Path,
) -> Result<(Option<String>, Vec<InvalidCheckpoint>), CheckpointError> {
    let mut all = list_checkpoints(dir)?;
    if let Some(name) = read_latest(dir)?
        && let Some(step) = parse_checkpoint_name(&name)
        && !all.iter().any(|(_, n)| *n == name)
    {
        // Tried (and reported as missing) in its place.
        all.push((step, name));
    }
    all.sort_by(|a, b| b.cmp(a)); // newest first
    let mut invalid = Vec::new();
    for (_, name) in all {
        match verify_all(&dir.join(&name)) {
            Ok(_) => return Ok((Some(name), invalid)),
            Err(ReadFailure::Invalid(reason)) => {
                tracing::warn!(
                    checkpoint = %name,
                    dir = %dir.display(),
                    %reason,
                    "skipping invalid sharded checkpoint {name}: {reason}; trying the previous one"
                );
                invalid.push(InvalidCheckpoint {
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
    Ok((None, invalid))
}

/// Refuses to save `step` below a newer valid sharded checkpoint: `latest` never moves
/// backwards.
pub(super) fn check_not_backwards(dir: &Path, step: u64) -> Result<(), CheckpointError> {
    let mut newer: Vec<(u64, String)> = list_checkpoints(dir)?
        .into_iter()
        .filter(|(s, _)| *s > step)
        .collect();
    newer.sort_by(|a, b| b.cmp(a));
    for (_, name) in newer {
        match verify_all(&dir.join(&name)) {
            Ok(_) => {
                return Err(CheckpointError::NewerCheckpointExists {
                    step,
                    newer: name,
                    dir: dir.to_path_buf(),
                });
            }
            Err(ReadFailure::Invalid(reason)) => {
                // Renamed out of the way, never deleted.
                set_aside(dir, &name, &reason)?;
            }
            Err(io) => return Err(io.into_error(&name, dir)),
        }
    }
    Ok(())
}
