//! Writing checkpoints atomically (rank 0 only).
//!
//! 1. Every file goes into `<dir>/.tmp-<name>-<pid>/` and is fsynced; the manifest (sizes and
//!    sha256 of the others) is written last; then the temporary directory is fsynced.
//! 2. It is renamed to `<dir>/<name>` and `<dir>` is fsynced: the checkpoint now exists whole.
//! 3. `<dir>/latest` is replaced atomically (temporary file, fsync, rename, fsync `<dir>`).
//! 4. Only then are checkpoints beyond keep-last-K removed (each renamed away first, so a
//!    crash never leaves a half-deleted checkpoint under a checkpoint name).
//!
//! A crash at any point leaves the previous checkpoint and the previous `latest` intact;
//! leftovers (`.tmp-*`, `.trash-*`) are removed by [`clean_temporaries`] at the next start.

use super::crash_point::crash_point;
use super::error::CheckpointError;
use super::manifest::{FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest};
use super::state::FRAMEWORK_VERSION;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The pointer file naming the newest complete checkpoint.
pub const LATEST_FILE: &str = "latest";
/// Prefix of directories and files being written.
pub(crate) const TMP_PREFIX: &str = ".tmp-";
/// Prefix of checkpoints being deleted or replaced.
pub(crate) const TRASH_PREFIX: &str = ".trash-";

/// The directory name of the checkpoint taken at `global_step`.
pub fn checkpoint_name(global_step: u64) -> String {
    format!("step-{global_step:010}")
}

/// The global step of a checkpoint directory name, if it is one.
pub fn parse_checkpoint_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

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

/// Removes checkpoints older than the newest `keep` among those up to `newest_step`; returns
/// the removed names. Checkpoints with a larger step (left by an abandoned run that was
/// resumed from an earlier checkpoint) are left alone and not counted.
pub(crate) fn prune(
    dir: &Path,
    keep: usize,
    newest_step: u64,
) -> Result<Vec<String>, CheckpointError> {
    let mut names: Vec<(u64, String)> = list_checkpoints(dir)?
        .into_iter()
        .filter(|(step, _)| *step <= newest_step)
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for (_, name) in names.into_iter().take(excess) {
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

/// The checkpoint directories in `dir` (complete or not), as `(step, name)`, unsorted.
pub(crate) fn list_checkpoints(dir: &Path) -> Result<Vec<(u64, String)>, CheckpointError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in read_dir(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(step) = parse_checkpoint_name(&name)
            && entry.path().is_dir()
        {
            out.push((step, name));
        }
    }
    Ok(out)
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>, CheckpointError> {
    let read = |source| CheckpointError::Read {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::read_dir(dir)
        .map_err(read)?
        .map(|e| e.map_err(read))
        .collect()
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

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let write = |source| CheckpointError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::create(path).map_err(write)?;
    file.write_all(bytes).map_err(write)?;
    file.sync_all().map_err(|source| CheckpointError::Sync {
        path: path.to_path_buf(),
        source,
    })
}

/// fsyncs a directory, making renames and new entries in it durable.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    let sync = |source| CheckpointError::Sync {
        path: dir.to_path_buf(),
        source,
    };
    File::open(dir).map_err(sync)?.sync_all().map_err(sync)
}

fn rename(from: &Path, to: &Path) -> Result<(), CheckpointError> {
    std::fs::rename(from, to).map_err(|source| CheckpointError::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
        source,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_step() {
        assert_eq!(checkpoint_name(120), "step-0000000120");
        assert_eq!(parse_checkpoint_name("step-0000000120"), Some(120));
        assert_eq!(parse_checkpoint_name("step-"), None);
        assert_eq!(parse_checkpoint_name("step-12a"), None);
        assert_eq!(parse_checkpoint_name(".tmp-step-1-5"), None);
        assert!(checkpoint_name(9) < checkpoint_name(10));
    }
}
