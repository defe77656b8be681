//! Writing checkpoints atomically (rank 0 only).
//!
//! 1. Every file goes into `<dir>/.tmp-<name>-<pid>/` and is fsynced; the manifest (sizes and
//!    sha256 of the others) is written last; then the temporary directory is fsynced.
//! 2. It is renamed to `<dir>/<name>` and `<dir>` is fsynced: the checkpoint now exists whole.
//! 3. `<dir>/latest` is replaced atomically (temporary file, fsync, rename, fsync `<dir>`).
//! 4. Only then are checkpoints beyond keep-last-K removed (each renamed away first, so a
//!    crash never leaves a half-deleted checkpoint under a checkpoint name).
//!
//! Before all this, a save below a newer valid checkpoint is refused
//! ([`check_not_backwards`]): `latest` never moves backwards.
//!
//! A crash at any point leaves the previous checkpoint and the previous `latest` intact;
//! leftovers (`.tmp-*`, `.trash-*`) are removed by [`clean_temporaries`] at the next start.

use super::crash_point::crash_point;
pub(crate) use super::durable::{rename, sync_dir, write_synced};
use super::error::CheckpointError;
use super::manifest::{FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest, ReadFailure};
use super::naming::{LATEST_FILE, TMP_PREFIX, TRASH_PREFIX, list_checkpoints, read_dir};
use super::set_aside::set_aside;
use super::state::FRAMEWORK_VERSION;
use std::path::{Path, PathBuf};

/// Writes `files` as checkpoint `name` in `dir` and points `latest` at it; returns the
/// checkpoint's path and its manifest. An existing checkpoint of the same name is replaced.
pub(crate) fn write_checkpoint(
    dir: &Path,
    name: &str,
    global_step: u64,
    files: &[(&str, Vec<u8>)],
) -> Result<(PathBuf, Manifest), CheckpointError> {
    ensure_dir(dir)?;
    let pid = std::process::id();
    let tmp = dir.join(format!("{TMP_PREFIX}{name}-{pid}"));
    if tmp.exists() {
        remove_path(&tmp)?;
    }
    std::fs::create_dir(&tmp).map_err(|source| CheckpointError::CreateDir {
        path: tmp.clone(),
        source,
    })?;
    let manifest = match fill_temporary(&tmp, name, global_step, files) {
        Ok(manifest) => manifest,
        Err(e) => {
            // Best effort: the next start removes it anyway.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };

    crash_point("before-rename");
    let target = dir.join(name);
    let trash = if target.exists() {
        // Same step saved again: move the old one aside; `latest` may name it for a moment,
        // and a reader then falls back to the previous checkpoint.
        let trash = dir.join(format!("{TRASH_PREFIX}{name}-{pid}"));
        rename(&target, &trash)?;
        Some(trash)
    } else {
        None
    };
    if let Err(e) = rename(&tmp, &target) {
        if let Some(trash) = &trash {
            // Put the replaced checkpoint back (best effort).
            let _ = std::fs::rename(trash, &target);
        }
        return Err(e);
    }
    crash_point("after-rename");
    sync_dir(dir)?;
    write_latest(dir, name)?;
    crash_point("after-latest");
    if let Some(trash) = trash
        && let Err(e) = remove_path(&trash)
    {
        // The new checkpoint is committed; the leftover goes at the next start.
        tracing::warn!(error = %e, "could not remove the replaced checkpoint");
    }
    Ok((target, manifest))
}

/// Writes `files` and then the manifest into the temporary directory `tmp`, fsyncing each file
/// and finally the directory.
fn fill_temporary(
    tmp: &Path,
    name: &str,
    global_step: u64,
    files: &[(&str, Vec<u8>)],
) -> Result<Manifest, CheckpointError> {
    crash_point("before-files");
    let mut entries = Vec::with_capacity(files.len());
    for (file, bytes) in files {
        write_synced(&tmp.join(file), bytes)?;
        entries.push(FileEntry::of(file, bytes));
        crash_point(&format!("after-{file}"));
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: name.to_string(),
        global_step,
        framework_version: FRAMEWORK_VERSION.to_string(),
        files: entries,
    };
    let manifest_bytes = serde_json::to_vec_pretty(&manifest)
        .map_err(CheckpointError::json("serialising the manifest"))?;
    write_synced(&tmp.join(MANIFEST_FILE), &manifest_bytes)?;
    sync_dir(tmp)?;
    Ok(manifest)
}

/// Atomically makes `<dir>/latest` contain `name`.
pub(crate) fn write_latest(dir: &Path, name: &str) -> Result<(), CheckpointError> {
    let tmp = dir.join(format!("{TMP_PREFIX}{LATEST_FILE}-{}", std::process::id()));
    write_synced(&tmp, format!("{name}\n").as_bytes())?;
    crash_point("before-latest");
    rename(&tmp, &dir.join(LATEST_FILE))?;
    sync_dir(dir)
}

/// Refuses a save at `step` while a newer *valid* checkpoint exists in `dir`: committing it
/// would move `latest` backwards, below a checkpoint the reader then prefers anyway. Newer
/// checkpoints that fail verification (corrupt) do not block the save; they are set aside
/// (renamed, never deleted: see [`set_aside`]). A newer checkpoint that cannot be read (I/O
/// error) fails the save: it may well be valid.
pub(crate) fn check_not_backwards(dir: &Path, step: u64) -> Result<(), CheckpointError> {
    let mut newer: Vec<(u64, String)> = list_checkpoints(dir)?
        .into_iter()
        .filter(|(s, _)| *s > step)
        .collect();
    newer.sort_by(|a, b| b.cmp(a));
    for (_, name) in newer {
        match super::reader::read_one(dir, &name) {
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
        let trash = dir.join(format!("{TRASH_PREFIX}{name}-{}", std::process::id()));
        rename(&dir.join(name), &trash)?;
        remove_path(&trash)?;
        removed.push(name.clone());
    }
    match all.iter().rfind(|(s, _)| *s <= step) {
        Some((_, newest)) => write_latest(dir, newest)?,
        None => match std::fs::remove_file(dir.join(LATEST_FILE)) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(CheckpointError::Remove {
                    path: dir.join(LATEST_FILE),
                    source,
                });
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
    let mut kept = 0usize;
    let mut doomed = Vec::new();
    for (step, name) in names {
        if step > newest_step {
            continue;
        }
        if kept < keep {
            kept += 1;
        } else {
            doomed.push(name);
        }
    }
    doomed.reverse(); // oldest first, as before
    let mut removed = Vec::new();
    for name in doomed {
        let trash = dir.join(format!("{TRASH_PREFIX}{name}-{}", std::process::id()));
        rename(&dir.join(&name), &trash)?;
        crash_point("during-prune");
        remove_path(&trash)?;
        removed.push(name);
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Removes what an interrupted writer left behind (`.tmp-*`, `.trash-*`); returns the paths.
pub(crate) fn clean_temporaries(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut removed = Vec::new();
    for entry in read_dir(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(TMP_PREFIX) || name.starts_with(TRASH_PREFIX) {
            let path = entry.path();
            remove_path(&path)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Creates `dir` (and parents) if needed, fsyncing the parent of a new directory.
pub(crate) fn ensure_dir(dir: &Path) -> Result<(), CheckpointError> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|source| CheckpointError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

fn remove_path(path: &Path) -> Result<(), CheckpointError> {
    let result = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    result.map_err(|source| CheckpointError::Remove {
        path: path.to_path_buf(),
        source,
    })
}
