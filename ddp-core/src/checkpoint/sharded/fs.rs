//! Durable file operations of the sharded commit: every write is fsynced, and so is every
//! directory whose entries change, before the next step of the protocol relies on it.

use super::super::error::CheckpointError;
use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` and fsyncs the file.
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
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

/// fsyncs a directory, making new entries and renames in it durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    let sync = |source| CheckpointError::Sync {
        path: dir.to_path_buf(),
        source,
    };
    File::open(dir).map_err(sync)?.sync_all().map_err(sync)
}

/// Renames `from` to `to`.
pub(super) fn rename(from: &Path, to: &Path) -> Result<(), CheckpointError> {
    std::fs::rename(from, to).map_err(|source| CheckpointError::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
        source,
    })
}

/// Removes a file or a directory tree.
pub(super) fn remove_path(path: &Path) -> Result<(), CheckpointError> {
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

/// Creates the empty directory `dir`, removing what a failed attempt left there, and fsyncs
/// its parent.
pub(super) fn fresh_dir(dir: &Path) -> Result<(), CheckpointError> {
    if dir.exists() {
        remove_path(dir)?;
    }
    std::fs::create_dir(dir).map_err(|source| CheckpointError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    match dir.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}
