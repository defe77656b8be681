//! The durable file operations every checkpoint write is built of: a file written and fsynced,
//! a rename, a directory fsynced (so renames and new entries survive a crash), and one file
//! replaced atomically. The rank-0 writer, the sharded commit, setting invalid checkpoints
//! aside, the fresh-start record and ddp-train's burn-train files all write through these.

use super::super::error::{CheckpointError, StorageError};
use super::naming::TMP_PREFIX;
use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a new file at `path` and fsyncs it.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let write = |source| StorageError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(source) = super::super::crash_point::write_fault(path) {
        return Err(write(source));
    }
    let mut file = File::create(path).map_err(write)?;
    file.write_all(bytes).map_err(write)?;
    file.sync_all().map_err(|source| StorageError::Sync {
        path: path.to_path_buf(),
        source,
    })
}

/// fsyncs a directory, making renames and new entries in it durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    let sync = |source| StorageError::Sync {
        path: dir.to_path_buf(),
        source,
    };
    File::open(dir).map_err(sync)?.sync_all().map_err(sync)
}

/// Renames `from` to `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> Result<(), StorageError> {
    std::fs::rename(from, to).map_err(|source| StorageError::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
        source,
    })
}

/// Removes a file or a directory tree.
pub(crate) fn remove_path(path: &Path) -> Result<(), StorageError> {
    let result = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    result.map_err(|source| StorageError::Remove {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates the empty directory `dir`, removing what a failed attempt left there, and fsyncs
/// its parent.
pub(crate) fn fresh_dir(dir: &Path) -> Result<(), StorageError> {
    if dir.exists() {
        remove_path(dir)?;
    }
    std::fs::create_dir(dir).map_err(|source| StorageError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    sync_parent(dir)
}

/// Creates `dir` and its missing parents, fsyncing the parent of each directory it creates,
/// so that none of them (and no file later written and fsynced in them) can vanish after a
/// power loss. An existing `dir` is left as it is.
///
/// # Errors
/// [`StorageError::CreateDir`] or [`StorageError::Sync`], naming the path.
pub fn ensure_dir(dir: &Path) -> Result<(), StorageError> {
    if dir.is_dir() {
        return Ok(());
    }
    let created: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .collect();
    std::fs::create_dir_all(dir).map_err(|source| StorageError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    // Deepest first: each new directory's entry, in its parent.
    created.into_iter().try_for_each(sync_parent)
}

fn sync_parent(dir: &Path) -> Result<(), StorageError> {
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Replaces the file at `path` atomically: `fill` writes a temporary file next to it (named
/// `.tmp-<name>-<pid>`, which no checkpoint reader takes for a checkpoint), which is fsynced
/// and renamed over `path`, then the directory is fsynced. A crash, or a failing `fill`, at any
/// point leaves `path` as it was, never cut short; on failure the temporary file is removed
/// (after a crash, [`remove_temporary_files`] removes it at the next start).
///
/// For checkpoint files written outside a checkpointer, such as ddp-train's burn-train files;
/// a checkpointer commits whole directories instead.
///
/// # Errors
/// [`CheckpointError::Storage`] holding [`StorageError::Write`] (also when `fill` fails),
/// [`StorageError::Sync`] or [`StorageError::Rename`], each naming the file.
pub fn write_file_atomically(
    path: &Path,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => dir,
        None => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!("{TMP_PREFIX}{name}-{}", std::process::id()));
    let written = (|| {
        let write = |source| StorageError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::create(&tmp).map_err(write)?;
        fill(&mut file).map_err(write)?;
        file.flush().map_err(write)?;
        file.sync_all().map_err(|source| StorageError::Sync {
            path: tmp.clone(),
            source,
        })?;
        rename(&tmp, path)?;
        // The rename itself must reach the disk, or a power loss could bring back the old file.
        sync_dir(dir)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(written?)
}

/// Removes the temporary files [`write_file_atomically`] left in `dir` when a crash cut it
/// short (best effort: readers ignore them anyway); returns how many it removed.
pub fn remove_temporary_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !is_file || !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                removed += 1;
                tracing::debug!(path = %path.display(), "removed a leftover temporary checkpoint file");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a leftover temporary checkpoint file");
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_dir_creates_every_missing_level_and_leaves_an_existing_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deep = dir.path().join("a").join("b").join("c");
        ensure_dir(&deep).expect("create");
        assert!(deep.is_dir());
        std::fs::write(deep.join("keep"), b"x").expect("write");
        ensure_dir(&deep).expect("again");
        assert!(deep.join("keep").is_file());
        let file = dir.path().join("a").join("file");
        std::fs::write(&file, b"x").expect("write");
        let err = ensure_dir(&file.join("below")).expect_err("below a file");
        assert!(err.to_string().contains("file"), "{err}");
    }

    #[test]
    fn a_fill_that_fails_halfway_leaves_the_previous_file_whole_and_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model-1.mpk");
        write_file_atomically(&path, |f| f.write_all(b"first")).expect("first write");
        let err = write_file_atomically(&path, |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        })
        .expect_err("the fill fails");
        assert!(
            matches!(err, CheckpointError::Storage(StorageError::Write { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("model-1.mpk"), "{err}");
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("model-1.mpk")]);
    }

    #[test]
    fn leftover_temporary_files_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(".tmp-model-1.mpk-77"), b"cut").expect("write");
        std::fs::write(dir.path().join("model-1.mpk"), b"whole").expect("write");
        std::fs::create_dir(dir.path().join(".tmp-step-0000000001-77")).expect("mkdir");
        assert_eq!(remove_temporary_files(dir.path()), 1);
        assert!(dir.path().join("model-1.mpk").exists());
        assert!(!dir.path().join(".tmp-model-1.mpk-77").exists());
        // A checkpointer's staging directory is its own to clean (under its lock).
        assert!(dir.path().join(".tmp-step-0000000001-77").exists());
    }
}
