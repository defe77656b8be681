//! Which run wrote a checkpoint: every manifest (both formats) records a run id, so that the
//! other-ranks check ([`elsewhere`](super::elsewhere)) can tell an older run's checkpoints,
//! left in another host's own directory by a fresh start, from this run's.
//!
//! - A run's id is drawn (128 random bits from the OS, hex) by the first save into a directory
//!   holding no checkpoint below its step: a new run, whether after `--fresh` (`rewind_to(0)`,
//!   then step 0 saved again: the old step 0 is replaced, not continued), on an empty
//!   directory, or on a host that never held one. Every later save takes the id of the newest
//!   checkpoint below its step, the one the run continues: a resume, or a rewind, keeps the
//!   run's id. So the id is recorded in rank 0's directory by the run's own checkpoints, and
//!   needs no file of its own.
//! - A fresh start (`record_fresh_start`) marks the runs whose checkpoints the *other* ranks'
//!   directories then hold as superseded, merged with every rank's earlier record, in every
//!   rank's directory ([`SUPERSEDED_RUNS_FILE`]): rank 0 may be another host at the next
//!   load. The runs rank 0's own directory still holds (the new run's initial checkpoint) are
//!   never marked. The check passes over superseded runs' checkpoints with a warning, and
//!   refuses to resume one (rank 0 back on a host that still holds the older run). Only an
//!   explicit fresh start does this: a newer checkpoint of another run that nobody started
//!   over from (rank 0 is a host holding an older run after an elastic restart) still stops
//!   the load, as does one without a run id (written before ids existed).

use super::super::error::{CheckpointError, StorageError};
use super::super::manifest::{ReadFailure, read_file};
use super::durable::{rename, sync_dir, write_synced};
use super::naming::{TMP_PREFIX, list_checkpoints};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

/// The file in every rank's directory listing the runs a fresh start superseded (JSON).
pub const SUPERSEDED_RUNS_FILE: &str = "superseded-runs.json";

/// A new run's id: 128 bits from the OS's random source, as 32 lowercase hex digits.
pub(crate) fn draw_run_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The one field of either manifest format this module reads.
#[derive(Deserialize)]
struct RunIdProbe {
    #[serde(default)]
    run_id: Option<String>,
}

/// The run id in manifest `manifest_file` of the checkpoint directory `checkpoint`: `Ok(None)`
/// when the manifest has none (written before run ids) or does not parse.
///
/// # Errors
/// [`ReadFailure::Invalid`] when the manifest is missing (an incomplete checkpoint),
/// [`ReadFailure::Io`] on any other I/O error.
pub(crate) fn run_id_of(
    checkpoint: &Path,
    manifest_file: &str,
) -> Result<Option<String>, ReadFailure> {
    let bytes = read_file(checkpoint, manifest_file)?;
    Ok(serde_json::from_slice::<RunIdProbe>(&bytes)
        .ok()
        .and_then(|p| p.run_id)
        .filter(|id| !id.is_empty()))
}

/// Rank 0, saving checkpoint `step` into `dir`: the run id it records. The id of the newest
/// checkpoint below `step` with a readable manifest (the checkpoint the run continues), or a
/// new one when there is none or it has no id (see the [module docs](self)). A checkpoint of
/// `step` itself is being replaced, not continued: `--fresh` rewinds to step 0 and saves step
/// 0 again, and that new run must not keep the old run's id.
///
/// # Errors
/// [`CheckpointError::ReadCheckpoint`] when a manifest cannot be read for another reason than
/// its absence: a new id would make the run's own checkpoints look like another run's.
pub(crate) fn run_id_to_save(
    dir: &Path,
    step: u64,
    manifest_file: &str,
) -> Result<String, CheckpointError> {
    let mut all = list_checkpoints(dir)?;
    all.retain(|(s, _)| *s < step);
    all.sort_by(|a, b| b.cmp(a)); // newest first
    for (_, name) in all {
        match run_id_of(&dir.join(&name), manifest_file) {
            Ok(Some(id)) => return Ok(id),
            Ok(None) => break,
            Err(ReadFailure::Invalid(_) | ReadFailure::Incompatible(_)) => continue,
            Err(io) => return Err(io.into_error(&name, dir)),
        }
    }
    let id = draw_run_id();
    tracing::info!(dir = %dir.display(), run_id = %id, "a new run starts in {}: run id {id}", dir.display());
    Ok(id)
}

/// The run ids of the complete checkpoints in `dir` (manifests that read), for a fresh start.
/// Unreadable ones are left out with a warning: not marking a run only keeps the check as
/// strict as before.
pub(crate) fn run_ids_in(dir: &Path, manifest_file: &str) -> BTreeSet<String> {
    let names = match list_checkpoints(dir) {
        Ok(names) => names,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the checkpoint directory for the fresh start's record of older runs");
            return BTreeSet::new();
        }
    };
    let mut ids = BTreeSet::new();
    for (_, name) in names {
        match run_id_of(&dir.join(&name), manifest_file) {
            Ok(Some(id)) => {
                ids.insert(id);
            }
            Ok(None) | Err(ReadFailure::Invalid(_) | ReadFailure::Incompatible(_)) => {}
            Err(e) => {
                let e = e.into_error(&name, dir);
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read the run id of checkpoint {name}");
            }
        }
    }
    ids
}

/// The contents of [`SUPERSEDED_RUNS_FILE`].
#[derive(Debug, Default, Serialize, Deserialize)]
struct SupersededRuns {
    /// Runs a fresh start in this directory superseded.
    #[serde(default)]
    run_ids: BTreeSet<String>,
}

/// The runs a fresh start in `dir` superseded (none when the file is missing).
///
/// # Errors
/// [`StorageError::Read`]; [`CheckpointError::Json`] when the file does not parse.
pub(crate) fn read_superseded(dir: &Path) -> Result<BTreeSet<String>, CheckpointError> {
    let path = dir.join(SUPERSEDED_RUNS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(serde_json::from_slice::<SupersededRuns>(&bytes)
            .map_err(CheckpointError::json(format!("parsing {}", path.display())))?
            .run_ids),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(source) => Err(StorageError::Read { path, source }.into()),
    }
}

/// Replaces the record of superseded runs in `dir` with `run_ids` atomically (a temporary
/// file named after `rank`, fsynced, renamed, the directory fsynced): ranks sharing the
/// directory write the same set, each through its own temporary file.
///
/// # Errors
/// [`StorageError`]'s of the write, rename or fsync.
pub(crate) fn write_superseded(
    dir: &Path,
    run_ids: &BTreeSet<String>,
    rank: usize,
) -> Result<(), CheckpointError> {
    let bytes = serde_json::to_vec_pretty(&SupersededRuns {
        run_ids: run_ids.clone(),
    })
    .map_err(CheckpointError::json("serialising the superseded runs"))?;
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{SUPERSEDED_RUNS_FILE}-{rank}-{}",
        std::process::id()
    ));
    write_synced(&tmp, &bytes)?;
    rename(&tmp, &dir.join(SUPERSEDED_RUNS_FILE))?;
    Ok(sync_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_32_hex_digits_and_differ() {
        let (a, b) = (draw_run_id(), draw_run_id());
        assert_eq!(a.len(), 32, "{a}");
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn superseded_runs_are_replaced_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(read_superseded(dir.path()).expect("none").is_empty());
        write_superseded(dir.path(), &["a".to_string()].into(), 0).expect("write a");
        let both = ["a".to_string(), "b".to_string()].into();
        write_superseded(dir.path(), &both, 1).expect("write a, b");
        assert_eq!(read_superseded(dir.path()).expect("read"), both);
    }
}
