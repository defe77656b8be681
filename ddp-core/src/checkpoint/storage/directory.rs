//! The checkpoint directory as a whole, for both formats (rank-0 and sharded): the `latest`
//! pointer, the search for the newest valid checkpoint, the "never backwards" rule, keep-last-K
//! pruning, rewinding, and the removal of an interrupted writer's leftovers. A format says only
//! how one checkpoint is verified (the `verify` argument).
//!
//! The newest valid checkpoint wins: every checkpoint is tried, newest first, and `latest` is
//! only a hint (a `latest` naming a missing checkpoint is reported as such). A complete
//! checkpoint newer than `latest` was committed by its rename; the writer died before moving
//! the pointer. Only genuine corruption moves the search to an older checkpoint: an I/O error,
//! or an intact checkpoint of another version, stops it (see [`ReadFailure`]).

use super::super::crash_point::{crash_point, write_fault};
use super::super::error::{CheckpointError, InvalidCheckpoint, StorageError};
use super::super::manifest::ReadFailure;
use super::durable::{remove_path, rename, sync_dir, write_synced};
use super::naming::{
    LATEST_FILE, TMP_PREFIX, TRASH_PREFIX, list_checkpoints, parse_checkpoint_name,
};
use super::set_aside::{any_exists, set_aside, set_aside_all};
use std::path::Path;

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
        Err(source) => Err(StorageError::Read { path, source }.into()),
    }
}

/// [`write_latest`] after a save installed checkpoint `name`: a failure says that the
/// checkpoint is committed ([`CheckpointError::LatestNotUpdated`]), not that the save lost it.
pub(crate) fn point_latest_at_committed(dir: &Path, name: &str) -> Result<(), CheckpointError> {
    write_latest(dir, name).map_err(|e| match e {
        CheckpointError::Storage(source) => CheckpointError::LatestNotUpdated {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            source,
        },
        other => other,
    })
}

/// Atomically makes `<dir>/latest` contain `name`.
pub(crate) fn write_latest(dir: &Path, name: &str) -> Result<(), CheckpointError> {
    let tmp = dir.join(format!("{TMP_PREFIX}{LATEST_FILE}-{}", std::process::id()));
    if let Some(source) = write_fault(&dir.join(LATEST_FILE)) {
        return Err(StorageError::Write { path: tmp, source }.into());
    }
    if let Err(e) = write_synced(&tmp, format!("{name}\n").as_bytes()) {
        // Best effort (the next start removes it): a full disk may have left part of it.
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    crash_point("before-latest");
    rename(&tmp, &dir.join(LATEST_FILE))?;
    Ok(sync_dir(dir)?)
}

/// What the search for the newest valid checkpoint found.
#[derive(Debug)]
pub(crate) struct NewestValid<T> {
    /// The checkpoint's name and what `verify` returned for it.
    pub(crate) found: Option<(String, T)>,
    /// Every invalid checkpoint tried before it, newest first.
    pub(crate) invalid: Vec<InvalidCheckpoint>,
}

/// The newest checkpoint of `dir` that `verify(dir, name)` accepts, with what `verify`
/// returned, and every invalid one tried before it (each with a warning).
///
/// # Errors
/// Listing `dir` or reading `latest` fails, or `verify` meets an I/O error rather than
/// corruption ([`CheckpointError::ReadCheckpoint`]) or a checkpoint another version wrote
/// ([`CheckpointError::Incompatible`]): falling back then would resume from older state than
/// what is on disk.
pub(crate) fn newest_valid<T>(
    dir: &Path,
    verify: impl Fn(&Path, &str) -> Result<T, ReadFailure>,
) -> Result<NewestValid<T>, CheckpointError> {
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
    let mut invalid = Vec::new();
    for (step, name) in all {
        if latest_step.is_some_and(|latest_step| step > latest_step) {
            tracing::warn!(
                checkpoint = %name,
                latest = ?latest,
                "checkpoint {name} is newer than `latest` (the writer stopped before moving the pointer); using it if valid"
            );
        }
        match verify(dir, &name) {
            Ok(found) => {
                return Ok(NewestValid {
                    found: Some((name, found)),
                    invalid,
                });
            }
            Err(ReadFailure::Invalid(reason)) => {
                tracing::warn!(
                    checkpoint = %name,
                    dir = %dir.display(),
                    %reason,
                    "skipping invalid checkpoint {name}: {reason}; trying the previous one"
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
    Ok(NewestValid {
        found: None,
        invalid,
    })
}

/// The search a load runs before resuming (rank 0), for both formats: [`newest_valid`], then
/// the two rules of resuming. Never start fresh over a run's checkpoints: when checkpoints
/// exist and none is valid, [`CheckpointError::NoValidCheckpoint`], and nothing is moved (the
/// user decides). Otherwise every invalid checkpoint tried is set aside (renamed, never
/// deleted), so that keep-last-K pruning neither counts nor removes it; not when `read_only`
/// (a read-only checkpointer never prunes, and must not write).
pub(crate) fn newest_valid_to_resume<T>(
    dir: &Path,
    read_only: bool,
    verify: impl Fn(&Path, &str) -> Result<T, ReadFailure>,
) -> Result<NewestValid<T>, CheckpointError> {
    let mut search = newest_valid(dir, verify)?;
    if search.found.is_none() && any_exists(&search.invalid) {
        return Err(CheckpointError::NoValidCheckpoint {
            dir: dir.to_path_buf(),
            invalid: search.invalid,
        });
    }
    if !read_only {
        set_aside_all(dir, &mut search.invalid)?;
    }
    Ok(search)
}

/// Refuses a save at `step` while a checkpoint newer than it that `verify` accepts exists in
/// `dir`: committing it would move `latest` backwards, below a checkpoint the reader then
/// prefers anyway. Newer checkpoints that fail verification (corrupt) do not block the save;
/// they are set aside (renamed, never deleted: see [`set_aside`]). A newer checkpoint that
/// cannot be read (I/O error) or that another version wrote fails the save: it may well be
/// valid.
pub(crate) fn check_not_backwards<T>(
    dir: &Path,
    step: u64,
    verify: impl Fn(&Path, &str) -> Result<T, ReadFailure>,
) -> Result<(), CheckpointError> {
    let mut newer: Vec<(u64, String)> = list_checkpoints(dir)?
        .into_iter()
        .filter(|(s, _)| *s > step)
        .collect();
    newer.sort_by(|a, b| b.cmp(a));
    for (_, name) in newer {
        match verify(dir, &name) {
            Ok(_) => {
                return Err(CheckpointError::NewerCheckpointExists {
                    step,
                    newer: name,
                    dir: dir.to_path_buf(),
                });
            }
            Err(ReadFailure::Invalid(reason)) => {
                set_aside(dir, &name, &reason)?;
            }
            Err(io) => return Err(io.into_error(&name, dir)),
        }
    }
    Ok(())
}

/// Removes every checkpoint with a step above `step` (each renamed away first) and points
/// `latest` at the newest remaining one (or removes it when none remains); returns the removed
/// names, oldest first. The explicit way to rewind a run, since a save never moves `latest`
/// below a newer valid checkpoint.
pub(crate) fn remove_newer_than(dir: &Path, step: u64) -> Result<Vec<String>, CheckpointError> {
    let mut all = list_checkpoints(dir)?;
    all.sort();
    let mut removed = Vec::new();
    for (_, name) in all.iter().filter(|(s, _)| *s > step) {
        remove_checkpoint(dir, name)?;
        removed.push(name.clone());
    }
    match all.iter().rfind(|(s, _)| *s <= step) {
        Some((_, newest)) => write_latest(dir, newest)?,
        None => match std::fs::remove_file(dir.join(LATEST_FILE)) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StorageError::Remove {
                    path: dir.join(LATEST_FILE),
                    source,
                }
                .into());
            }
        },
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Removes every checkpoint at or below the one just saved (`newest_step`) but the newest
/// `keep`; returns the removed names. Checkpoints found invalid were set aside under another
/// name before (at load, or by [`check_not_backwards`]), so they neither count nor go; one
/// newer than `newest_step` is left alone (it can only have appeared since that check).
pub(crate) fn prune(
    dir: &Path,
    keep: usize,
    newest_step: u64,
) -> Result<Vec<String>, CheckpointError> {
    let mut names: Vec<(u64, String)> = list_checkpoints(dir)?;
    names.sort_by(|a, b| b.cmp(a)); // newest first
    let mut doomed: Vec<String> = names
        .into_iter()
        .filter(|(step, _)| *step <= newest_step)
        .skip(keep)
        .map(|(_, name)| name)
        .collect();
    doomed.reverse(); // oldest first
    for name in &doomed {
        remove_checkpoint(dir, name)?;
    }
    if !doomed.is_empty() {
        sync_dir(dir)?;
    }
    Ok(doomed)
}

/// Renames checkpoint `name` away, then deletes it: a crash never leaves a half-deleted
/// checkpoint under a checkpoint name.
fn remove_checkpoint(dir: &Path, name: &str) -> Result<(), CheckpointError> {
    let trash = dir.join(format!("{TRASH_PREFIX}{name}-{}", std::process::id()));
    rename(&dir.join(name), &trash)?;
    crash_point("during-prune");
    Ok(remove_path(&trash)?)
}
