//! **Test-only hooks**, compiled only into this crate's unit tests and into builds with the
//! `test-hooks` cargo feature (enabled by the test crates as a dev-dependency feature, never
//! by default), so release binaries carry neither the environment lookup nor the fault table:
//!
//! - named points of a checkpoint write where the writer can be made to SIGKILL its own
//!   process, so tests can show that a crash at each phase loses nothing. Set
//!   [`TEST_CRASH_AT_ENV`] to one of [`CRASH_POINTS`]. The kill is a real SIGKILL: no
//!   destructor, flush or unwinding runs, as when the machine or the OOM killer stops a job;
//! - injected read errors ([`inject_read_error`]), so tests can show that an I/O error while
//!   loading (EIO, ESTALE on NFS) fails the load instead of passing for corruption;
//! - injected write errors ([`inject_write_error`]), so tests can show what a failed write
//!   (ENOSPC) leaves behind.
//!
//! Without the hooks, [`crash_point`] is an empty inline function, [`read_file`] is
//! `std::fs::read` and [`write_fault`] is `None`.

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

/// Paths whose reads or writes fail, with the errno they fail with.
#[cfg(any(test, feature = "test-hooks"))]
type Faults = std::sync::Mutex<Vec<(std::path::PathBuf, i32)>>;
#[cfg(any(test, feature = "test-hooks"))]
static READ_FAULTS: Faults = std::sync::Mutex::new(Vec::new());
#[cfg(any(test, feature = "test-hooks"))]
static WRITE_FAULTS: Faults = std::sync::Mutex::new(Vec::new());

#[cfg(any(test, feature = "test-hooks"))]
fn set_fault(faults: &Faults, path: std::path::PathBuf, errno: Option<i32>) {
    let mut faults = faults.lock().unwrap_or_else(|p| p.into_inner());
    faults.retain(|(p, _)| *p != path);
    if let Some(errno) = errno {
        faults.push((path, errno));
    }
}

#[cfg(any(test, feature = "test-hooks"))]
fn fault(faults: &Faults, path: &Path) -> Option<std::io::Error> {
    let faults = faults.lock().unwrap_or_else(|p| p.into_inner());
    faults
        .iter()
        .find(|(p, _)| p == path)
        .map(|(_, errno)| std::io::Error::from_raw_os_error(*errno))
}

/// Makes every checkpoint read of the file `path` fail with OS error `errno` (e.g.
/// `libc::EIO`) until [`clear_read_error`]. Only with the `test-hooks` feature.
#[cfg(any(test, feature = "test-hooks"))]
pub fn inject_read_error(path: impl Into<std::path::PathBuf>, errno: i32) {
    set_fault(&READ_FAULTS, path.into(), Some(errno));
}

/// Undoes [`inject_read_error`] for `path`.
#[cfg(any(test, feature = "test-hooks"))]
pub fn clear_read_error(path: impl AsRef<Path>) {
    set_fault(&READ_FAULTS, path.as_ref().to_path_buf(), None);
}

/// Makes every checkpoint write of the file `path` fail with OS error `errno` (e.g.
/// `libc::ENOSPC`) until [`clear_write_error`]. For `latest`, replaced atomically, `path` is
/// `<dir>/latest` and the write of its temporary file fails, as on a full disk. Only with the
/// `test-hooks` feature.
#[cfg(any(test, feature = "test-hooks"))]
pub fn inject_write_error(path: impl Into<std::path::PathBuf>, errno: i32) {
    set_fault(&WRITE_FAULTS, path.into(), Some(errno));
}

/// Undoes [`inject_write_error`] for `path`.
#[cfg(any(test, feature = "test-hooks"))]
pub fn clear_write_error(path: impl AsRef<Path>) {
    set_fault(&WRITE_FAULTS, path.as_ref().to_path_buf(), None);
}

/// Reads a checkpoint file: `std::fs::read`, or an injected error.
pub(crate) fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    #[cfg(any(test, feature = "test-hooks"))]
    if let Some(e) = fault(&READ_FAULTS, path) {
        return Err(e);
    }
    std::fs::read(path)
}

/// The error injected for writes of `path`, if any ([`inject_write_error`]).
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) fn write_fault(path: &Path) -> Option<std::io::Error> {
    fault(&WRITE_FAULTS, path)
}

/// Without the `test-hooks` feature: no write fails on purpose.
#[cfg(not(any(test, feature = "test-hooks")))]
#[inline(always)]
pub(crate) fn write_fault(_path: &Path) -> Option<std::io::Error> {
    None
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
