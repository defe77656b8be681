//! How a checkpoint directory is laid out: the names of checkpoints (`step-<global step>`), of
//! the `latest` pointer and of leftovers being written or deleted, and the listing of the
//! checkpoints in it. Shared by the writer and the reader, so that neither depends on the
//! other for it.

use super::super::error::{CheckpointError, InvalidReason, StorageError};
use std::path::Path;

/// The pointer file naming the newest complete checkpoint.
pub const LATEST_FILE: &str = "latest";
/// Prefix of directories and files being written.
pub(crate) const TMP_PREFIX: &str = ".tmp-";
/// Prefix of checkpoints being deleted.
pub(crate) const TRASH_PREFIX: &str = ".trash-";
/// Prefix of a committed checkpoint moved aside while the same step is saved again
/// (`.replaced-<name>-<pid>`): the next start puts it back if the new one never took its name.
pub(crate) const REPLACED_PREFIX: &str = ".replaced-";

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

/// Checks that a checkpoint directory named like a checkpoint (`step-N`) holds the checkpoint
/// its manifest names, of either format: a renamed or copied one would otherwise be resumed as
/// newer (or older) than it is, and block every save below its name.
pub(crate) fn check_name(
    dir_name: &str,
    manifest_name: &str,
    manifest_step: u64,
) -> Result<(), InvalidReason> {
    match parse_checkpoint_name(dir_name) {
        Some(step) if manifest_step != step || manifest_name != dir_name => {
            Err(InvalidReason::NameMismatch {
                dir_name: dir_name.to_string(),
                manifest_name: manifest_name.to_string(),
                manifest_step,
            })
        }
        _ => Ok(()),
    }
}

/// The checkpoint directories in `dir` (complete or not), as `(step, name)`, unsorted.
///
/// # Errors
/// [`StorageError::Read`] if `dir` or an entry's metadata cannot be read.
pub(crate) fn list_checkpoints(dir: &Path) -> Result<Vec<(u64, String)>, StorageError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in read_dir(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(step) = parse_checkpoint_name(&name) else {
            continue;
        };
        // Follows symlinks like `is_dir`, but an I/O error is an error, not "not a directory".
        match std::fs::metadata(entry.path()) {
            Ok(meta) if meta.is_dir() => out.push((step, name)),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StorageError::Read {
                    path: entry.path(),
                    source,
                });
            }
        }
    }
    Ok(out)
}

/// The entries of `dir`; an I/O error names `dir`.
pub(super) fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>, StorageError> {
    let read = |source| StorageError::Read {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::read_dir(dir)
        .map_err(read)?
        .map(|e| e.map_err(read))
        .collect()
}

/// Checks that `name`, a checkpoint to load by name, is one normal path component, so
/// `dir.join(name)` stays inside `dir`.
pub(crate) fn validate_checkpoint_name(name: &str) -> Result<(), CheckpointError> {
    use std::path::{Component, Path};
    let invalid = |reason| {
        Err(CheckpointError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("it is empty");
    }
    if name.contains('/') || name.contains('\\') || name.contains('\0') {
        return invalid("it contains a path separator or NUL");
    }
    let mut components = Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(_)), None) => Ok(()),
        _ => invalid("it must be a single plain directory name, not `.`, `..` or a path"),
    }
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

    #[test]
    fn only_single_plain_names_are_valid_checkpoint_names() {
        assert!(validate_checkpoint_name("step-0000000120").is_ok());
        assert!(validate_checkpoint_name("my.checkpoint").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "../step-0000000001",
            "../../etc",
            "a/b",
            "step-1/",
            "/abs",
            "/",
            "a\\..\\b",
            "nul\0",
        ] {
            let err = validate_checkpoint_name(bad).expect_err(bad);
            assert!(
                matches!(err, CheckpointError::InvalidName { ref name, .. } if name == bad),
                "{bad:?}: {err}"
            );
        }
    }
}
