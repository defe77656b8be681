//! **Test-only hook**: named points of a checkpoint write where the writer can be made to
//! SIGKILL its own process, so tests can show that a crash at each phase loses nothing.
//!
//! Set [`TEST_CRASH_AT_ENV`] to one of [`CRASH_POINTS`]; unset (always, in production) the hook
//! is one environment lookup per point of a save. The kill is a real SIGKILL: no destructor,
//! flush or unwinding runs, as when the machine or the OOM killer stops a job.

/// Names the point of the write at which the writer SIGKILLs itself. Never set it in
/// production.
pub const TEST_CRASH_AT_ENV: &str = "DDP_CHECKPOINT_TEST_CRASH_AT";

/// The points, in the order a save passes them:
///
/// - `before-files`: the temporary directory exists, empty;
/// - `after-<file>` (e.g. `after-model.safetensors`): that file is written and fsynced;
/// - `before-rename`: every file and the manifest are written;
/// - `after-rename`: the checkpoint has its final name, `latest` still names the previous one;
/// - `before-latest`: the new `latest` is written to a temporary file, not yet renamed;
/// - `after-latest`: `latest` names the new checkpoint (the save is committed);
/// - `during-prune`: an old checkpoint was renamed away for removal, not yet removed.
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
