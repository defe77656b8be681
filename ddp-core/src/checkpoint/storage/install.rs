//! Committing a checkpoint written whole in a staging directory, for both formats: the rename
//! that gives it its name, the same step saved again (its committed copy moved aside, never
//! lost), and what an interrupted or failed save leaves behind.

use super::super::crash_point::crash_point;
use super::super::error::{CheckpointError, StorageError};
use super::durable::{remove_path, rename, sync_dir};
use super::naming::{REPLACED_PREFIX, TMP_PREFIX, TRASH_PREFIX, parse_checkpoint_name, read_dir};
use std::path::{Path, PathBuf};

/// A checkpoint put in place by [`install_checkpoint`]: where it is, and the copy of the same
/// step it replaced. The new checkpoint has its name and the directory is fsynced (nothing
/// else makes an `Installed`), so the replaced copy is removed when this is dropped, also when
/// what follows fails (`latest`): the search resumes the newest valid checkpoint whatever
/// `latest` says, and a leftover copy would block the next save of the step.
pub(crate) struct Installed {
    path: PathBuf,
    replaced: Option<PathBuf>,
}

impl Installed {
    /// Deletes the replaced checkpoint now; returns the new checkpoint's path.
    pub(crate) fn remove_replaced(mut self) -> PathBuf {
        self.remove_now();
        std::mem::take(&mut self.path)
    }

    /// Best effort: the new checkpoint is committed, and the next start removes a leftover.
    fn remove_now(&mut self) {
        if let Some(trash) = self.replaced.take()
            && let Err(e) = remove_path(&trash)
        {
            tracing::warn!(error = %e, "could not remove the replaced checkpoint");
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.remove_now();
    }
}

/// The commit of a checkpoint written whole in `staging`: renames it to `<dir>/<name>` and
/// fsyncs `dir`. A checkpoint of the same name (the same step saved again) is moved aside first
/// (to `.replaced-<name>-<pid>`) and put back if the rename fails, or by the next start's
/// [`clean_temporaries`] if the process dies between the two renames: the step's committed
/// checkpoint is never lost, even when it is the only one. A copy an earlier failed attempt of
/// this process left under that aside name is settled first, as the next start would.
pub(crate) fn install_checkpoint(
    dir: &Path,
    staging: &Path,
    name: &str,
) -> Result<Installed, StorageError> {
    let target = dir.join(name);
    let aside = dir.join(format!("{REPLACED_PREFIX}{name}-{}", std::process::id()));
    if aside.symlink_metadata().is_ok() {
        settle_replaced(dir, &aside, name)?;
    }
    let replaced = if target.exists() {
        rename(&target, &aside)?;
        crash_point("replacing");
        Some(aside)
    } else {
        None
    };
    if let Err(e) = rename(staging, &target) {
        if let Some(trash) = &replaced {
            // Put the replaced checkpoint back (best effort).
            let _ = std::fs::rename(trash, &target);
        }
        return Err(e);
    }
    // Until this fsync succeeds the new checkpoint may not survive a crash: the replaced copy
    // stays (the next attempt or start settles it).
    sync_dir(dir)?;
    Ok(Installed {
        path: target,
        replaced,
    })
}

/// Settles `aside`, a copy of checkpoint `original` moved aside by a save that did not finish:
/// puts it back when nothing took its name; otherwise the checkpoint under the name replaced
/// it, made durable first (fsync of `dir`), and the copy is removed. Returns whether it was
/// removed.
fn settle_replaced(dir: &Path, aside: &Path, original: &str) -> Result<bool, StorageError> {
    let target = dir.join(original);
    if !target.exists() {
        rename(aside, &target)?;
        sync_dir(dir)?;
        tracing::warn!(
            checkpoint = %target.display(),
            "a save of the same step was interrupted: its committed checkpoint is put back"
        );
        return Ok(false);
    }
    sync_dir(dir)?;
    remove_path(aside)?;
    Ok(true)
}

/// Removes what an interrupted writer left behind (`.tmp-*`, `.trash-*`) and puts back a
/// checkpoint that a crash left moved aside (`.replaced-*`, see [`install_checkpoint`]) when
/// nothing took its name; returns the paths removed.
pub(crate) fn clean_temporaries(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut removed = Vec::new();
    for entry in read_dir(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some(original) = replaced_checkpoint_name(&name) {
            if settle_replaced(dir, &path, original)? {
                removed.push(path);
            }
            continue;
        }
        if name.starts_with(TMP_PREFIX) || name.starts_with(TRASH_PREFIX) {
            remove_path(&path)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// The checkpoint name in `.replaced-<name>-<pid>`, if `entry` is one.
fn replaced_checkpoint_name(entry: &str) -> Option<&str> {
    let (name, pid) = entry.strip_prefix(REPLACED_PREFIX)?.rsplit_once('-')?;
    let is_pid = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (is_pid && parse_checkpoint_name(name).is_some()).then_some(name)
}
