//! **Test-only hooks**, compiled only into this crate's unit tests and into builds with the
//! `test-hooks` cargo feature (enabled by the test crates as a dev-dependency feature, never
//! by default), so release binaries carry neither the environment lookup nor the fault table:
//!
//! - named points of a checkpoint write where the writer can be made to SIGKILL its own
//!   process, so tests can show that a crash at each phase loses nothing. Set
//!   [`TEST_CRASH_AT_ENV`] to one of [`CRASH_POINTS`]. The kill is a real SIGKILL: no
//!   destructor, flush or unwinding runs, as when the machine or the OOM killer stops a job;
//! - injected read errors ([`inject_read_error`]), so tests can show that an I/O error while
//!   loading (EIO, ESTALE on NFS) fails the load instead of passing for corruption.
//!
//! Without the hooks, [`crash_point`] is an empty inline function and [`read_file`] is
//! `std::fs::read`.

use std::path::Path;

/// Names the point of the write at which the writer SIGKILLs itself. Only with the
/// `test-hooks` feature; never set it in production.
#[cfg(any(test, feature = "test-hooks"))]
pub const TEST_CRASH_AT_ENV: &str = "DDP_CHECKPOINT_TEST_CRASH_AT";

/// The points, in the order a save passes them:
///
/// - `before-files`: the temporary directory exists, empty;
/// - `after-<file>` (e.g. `after-model.safetensors`): that file is written and fsynced;
/// - `before-rename`: every file and the manifest are written;
/// - `after-rename`: the checkpoint has its final name, `latest` still names the previous one;
/// - `before-latest`: the new `latest` is written to a temporary file, not yet renamed;
/// - `after-latest`: `latest` names the new checkpoint;
/// - `during-prune`: an old checkpoint was renamed away for removal, not yet removed.
///
/// One more point, `replacing`, is passed only when a step that has a checkpoint is saved
/// again (between `before-rename` and `after-rename`): the old checkpoint is moved aside, the
/// new one not yet renamed into place.
#[cfg(any(test, feature = "test-hooks"))]
pub const CRASH_POINTS: &[&str] = &[
    "before-files",
    "after-model.safetensors",
    "after-optimizer.bin",
    "after-training_state.json",
    "after-param_ids.json",
    "before-rename",
    "after-rename",
    "before-latest",
    "after-latest",
    "during-prune",
];

/// SIGKILLs this process if [`TEST_CRASH_AT_ENV`] names `point`.
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) fn crash_point(point: &str) {
    if std::env::var_os(TEST_CRASH_AT_ENV).is_some_and(|v| v == point) {
        tracing::warn!(
            point,
            "{TEST_CRASH_AT_ENV} is set: killing this process (test-only)"
        );
        // SAFETY: plain syscall signalling our own process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Without the `test-hooks` feature: nothing.
#[cfg(not(any(test, feature = "test-hooks")))]
#[inline(always)]
pub(crate) fn crash_point(_point: &str) {}

/// Paths whose reads fail, with the errno they fail with.
#[cfg(any(test, feature = "test-hooks"))]
static READ_FAULTS: std::sync::Mutex<Vec<(std::path::PathBuf, i32)>> =
    std::sync::Mutex::new(Vec::new());

/// Makes every checkpoint read of the file `path` fail with OS error `errno` (e.g.
/// `libc::EIO`) until [`clear_read_error`]. Only with the `test-hooks` feature.
#[cfg(any(test, feature = "test-hooks"))]
pub fn inject_read_error(path: impl Into<std::path::PathBuf>, errno: i32) {
    let path = path.into();
    let mut faults = READ_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    faults.retain(|(p, _)| *p != path);
    faults.push((path, errno));
}

/// Undoes [`inject_read_error`] for `path`.
#[cfg(any(test, feature = "test-hooks"))]
pub fn clear_read_error(path: impl AsRef<Path>) {
    let mut faults = READ_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    faults.retain(|(p, _)| p != path.as_ref());
}

/// Reads a checkpoint file: `std::fs::read`, or an injected error.
pub(crate) fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    #[cfg(any(test, feature = "test-hooks"))]
    {
        let faults = READ_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, errno)) = faults.iter().find(|(p, _)| p == path) {
            return Err(std::io::Error::from_raw_os_error(*errno));
        }
    }
    std::fs::read(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CHECKPOINT_FILES;

    #[test]
    fn there_is_a_point_after_each_file_in_the_order_they_are_written() {
        let after: Vec<&str> = CRASH_POINTS
            .iter()
            .filter_map(|p| p.strip_prefix("after-"))
            .filter(|p| !["rename", "latest"].contains(p))
            .collect();
        assert_eq!(after, CHECKPOINT_FILES);
    }
}
