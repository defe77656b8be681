//! Setting invalid checkpoints aside instead of deleting them.
//!
//! A checkpoint that fails verification may still be worth hours of training: one flipped bit
//! in a tensor, a file a repair or a backup can restore. So the library never deletes one; it
//! renames `step-N` to `step-N.invalid` (`step-N.invalid-2`, ... if taken). The new name is no
//! checkpoint name, so the search, the "never backwards" check and keep-last-K retention no
//! longer see it: retention counts valid checkpoints only, and a later save of the same step
//! cannot replace it. Renaming it back resumes it.

use super::super::error::{CheckpointError, InvalidCheckpoint, InvalidReason};
use super::durable::{rename, sync_dir};
use std::path::Path;

/// The suffix of a checkpoint set aside as invalid.
pub const INVALID_SUFFIX: &str = ".invalid";

/// Renames checkpoint `name` of `dir` to a free `<name>.invalid[-k]` and warns naming both and
/// `reason`; returns the new name.
///
/// # Errors
/// [`StorageError::Rename`](crate::checkpoint::StorageError::Rename) /
/// [`StorageError::Sync`](crate::checkpoint::StorageError::Sync).
pub(crate) fn set_aside(
    dir: &Path,
    name: &str,
    reason: &InvalidReason,
) -> Result<String, CheckpointError> {
    let mut new_name = format!("{name}{INVALID_SUFFIX}");
    let mut k = 2u32;
    while dir.join(&new_name).symlink_metadata().is_ok() {
        new_name = format!("{name}{INVALID_SUFFIX}-{k}");
        k += 1;
    }
    rename(&dir.join(name), &dir.join(&new_name))?;
    sync_dir(dir)?;
    tracing::warn!(
        checkpoint = %name,
        set_aside = %new_name,
        dir = %dir.display(),
        %reason,
        "checkpoint {name} is invalid ({reason}); set aside as {new_name} (not deleted: repair it \
         and rename it back to resume it)"
    );
    Ok(new_name)
}

/// Sets aside every checkpoint of `invalid` that exists (a `latest` naming a missing directory
/// has nothing to move), recording the new names in it.
///
/// # Errors
/// As [`set_aside`].
pub(crate) fn set_aside_all(
    dir: &Path,
    invalid: &mut [InvalidCheckpoint],
) -> Result<(), CheckpointError> {
    for bad in invalid.iter_mut() {
        if matches!(bad.reason, InvalidReason::MissingDir { .. }) || bad.set_aside.is_some() {
            continue;
        }
        bad.set_aside = Some(set_aside(dir, &bad.name, &bad.reason)?);
    }
    Ok(())
}

/// Whether `invalid` names a checkpoint that exists on disk (not only a dangling `latest`).
pub(crate) fn any_exists(invalid: &[InvalidCheckpoint]) -> bool {
    invalid
        .iter()
        .any(|bad| !matches!(bad.reason, InvalidReason::MissingDir { .. }))
}
