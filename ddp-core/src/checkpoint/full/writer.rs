//! Writing checkpoints atomically (rank 0 only).
//!
//! 1. Every file (every rank's communication-hook state file too) goes into
//!    `<dir>/.tmp-<name>-<pid>/` and is fsynced; the manifest (sizes and
//!    sha256 of the others) is written last; then the temporary directory is fsynced.
//! 2. It is renamed to `<dir>/<name>` and `<dir>` is fsynced: the checkpoint now exists whole.
//!    A checkpoint already there (the same step saved again) is first moved aside to
//!    `.replaced-<name>-<pid>`, and removed once the new one has its name and `<dir>` is fsynced
//!    (also when step 3 then fails: the newest valid checkpoint is resumed whatever `latest`
//!    says, and a leftover copy would block the next save of the step).
//! 3. `<dir>/latest` is replaced atomically (temporary file, fsync, rename, fsync `<dir>`).
//! 4. Only then are checkpoints beyond keep-last-K removed (each renamed away first, so a
//!    crash never leaves a half-deleted checkpoint under a checkpoint name).
//!
//! Before all this, a save below a newer valid checkpoint is refused
//! ([`check_not_backwards`]): `latest` never moves backwards. Steps 3 and 4 and that check are
//! the [storage layer's](super::super::storage::directory), shared with sharded checkpoints.
//!
//! A crash at any point leaves the previous checkpoint and the previous `latest` intact;
//! leftovers (`.tmp-*`, `.trash-*`) are removed by [`clean_temporaries`] at the next start,
//! which also puts back a `.replaced-*` checkpoint whose name nothing took.
//!
//! [`check_not_backwards`]: super::super::storage::directory::check_not_backwards
//! [`clean_temporaries`]: super::super::storage::install::clean_temporaries

use super::super::crash_point::crash_point;
use super::super::error::CheckpointError;
use super::super::manifest::{
    FORMAT_VERSION, FileEntry, MANIFEST_FILE, MODEL_FILE, Manifest, OPTIMIZER_FILE, PARAM_IDS_FILE,
    STATE_FILE,
};
use super::super::state::{FRAMEWORK_VERSION, StateFile};
use super::super::storage::directory::point_latest_at_committed;
use super::super::storage::durable::{ensure_dir, fresh_dir, sync_dir, write_synced};
use super::super::storage::install::install_checkpoint;
use super::super::storage::naming::TMP_PREFIX;
use std::path::{Path, PathBuf};

/// Writes checkpoint `name` in `dir` (the encoded `model`, `optimizer` state and `param_ids`,
/// the `state` file and every rank's communication-hook state file in `hook_states`, by file
/// name) and points `latest` at it, its manifest naming run `run_id`; returns the checkpoint's
/// path and its manifest. An existing checkpoint of the same name is replaced.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_checkpoint(
    dir: &Path,
    name: &str,
    global_step: u64,
    run_id: String,
    model: Vec<u8>,
    optimizer: Vec<u8>,
    state: &StateFile,
    param_ids: Vec<u8>,
    hook_states: Vec<(String, Vec<u8>)>,
) -> Result<(PathBuf, Manifest), CheckpointError> {
    let state = serde_json::to_vec_pretty(state)
        .map_err(CheckpointError::json(format!("serialising {STATE_FILE}")))?;
    let mut files = vec![
        (MODEL_FILE.to_string(), model),
        (OPTIMIZER_FILE.to_string(), optimizer),
        (STATE_FILE.to_string(), state),
        (PARAM_IDS_FILE.to_string(), param_ids),
    ];
    files.extend(hook_states);
    ensure_dir(dir)?;
    let pid = std::process::id();
    let tmp = dir.join(format!("{TMP_PREFIX}{name}-{pid}"));
    fresh_dir(&tmp)?;
    let manifest = match fill_temporary(&tmp, name, global_step, run_id, &files) {
        Ok(manifest) => manifest,
        Err(e) => {
            // Best effort: the next start removes it anyway.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };

    crash_point("before-rename");
    let installed = match install_checkpoint(dir, &tmp, name) {
        Ok(installed) => installed,
        Err(e) => {
            // Best effort (the next start removes it): gone already if the rename happened.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e.into());
        }
    };
    crash_point("after-rename");
    // On failure `installed` is dropped, which removes the copy it replaced: the new
    // checkpoint is durable, and the search resumes it whatever `latest` says.
    point_latest_at_committed(dir, name)?;
    crash_point("after-latest");
    Ok((installed.remove_replaced(), manifest))
}

/// Writes `files` and then the manifest into the temporary directory `tmp`, fsyncing each file
/// and finally the directory.
fn fill_temporary(
    tmp: &Path,
    name: &str,
    global_step: u64,
    run_id: String,
    files: &[(String, Vec<u8>)],
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
        run_id: Some(run_id),
        files: entries,
    };
    let manifest_bytes = serde_json::to_vec_pretty(&manifest)
        .map_err(CheckpointError::json("serialising the manifest"))?;
    write_synced(&tmp.join(MANIFEST_FILE), &manifest_bytes)?;
    sync_dir(tmp)?;
    Ok(manifest)
}
