//! The durable file operations every checkpoint write is built of: a file written and fsynced,
//! a rename, a directory fsynced (so renames and new entries survive a crash). One place, used
//! by the writer, setting invalid checkpoints aside and the fresh-start record.

use super::error::CheckpointError;
use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a new file at `path` and fsyncs it.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
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
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    let sync = |source| CheckpointError::Sync {
        path: dir.to_path_buf(),
        source,
    };
    File::open(dir).map_err(sync)?.sync_all().map_err(sync)
}

pub(crate) fn rename(from: &Path, to: &Path) -> Result<(), CheckpointError> {
    std::fs::rename(from, to).map_err(|source| CheckpointError::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
        source,
    })
}
