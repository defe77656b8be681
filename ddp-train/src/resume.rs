//! Finding where to resume: burn-train's file checkpointer writes `checkpoint/model-<epoch>.*`,
//! `optim-<epoch>.*` and `scheduler-<epoch>.*` under the training directory, but leaves it to
//! the caller to know which epoch to pass to `SupervisedTraining::checkpoint`.

use crate::error::{DdpTrainError, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// The last epoch for which `dir/checkpoint` holds all three of burn-train's files (model,
/// optimizer, scheduler), or `None` when there is none (a fresh start). Epoch ends only:
/// [`resume_point`](crate::resume_point) also finds the mid-epoch checkpoints of
/// [`DdpStrategy::with_checkpoint_every_n_steps`](crate::DdpStrategy::with_checkpoint_every_n_steps).
///
/// After a restart (for example the launcher's `--max-restarts` after a rank was killed), pass
/// it to `SupervisedTraining::checkpoint(epoch)` and to
/// [`DistributedLoader::with_start_epoch`](crate::DistributedLoader::with_start_epoch), so the
/// run continues with the next epoch's shuffle. It reads the directory of the calling process
/// only: with ranks on several machines, call [`resume_epoch`](crate::resume_epoch) instead
/// (rank 0 reads, every rank gets its answer).
///
/// With [`DdpStrategy::with_checkpoints`](crate::DdpStrategy::with_checkpoints) every file is
/// written atomically, so an epoch counts once its three files exist. burn-train's own
/// `with_file_checkpointer` writes in place: an epoch whose files were cut short by a kill is
/// only skipped here if one of the three is missing.
///
/// # Errors
/// [`DdpTrainError::Io`] when the directory exists but cannot be read.
pub fn latest_checkpoint(dir: impl AsRef<Path>) -> Result<Option<usize>> {
    Ok(epoch_files(&dir.as_ref().join("checkpoint"))?
        .into_iter()
        .rev()
        .find(|&(_, kinds)| kinds == ALL_KINDS)
        .map(|(epoch, _)| epoch))
}

/// The bits of [`epoch_files`] when all three files exist.
pub(crate) const ALL_KINDS: u8 = 7;

/// Which of an epoch's three files (model, optim, scheduler: bits 0, 1, 2) `checkpoint_dir`
/// holds, per epoch; empty when it does not exist. Temporary files of unfinished atomic writes
/// (dot names) do not count.
///
/// # Errors
/// [`DdpTrainError::Io`] when the directory exists but cannot be read.
pub(crate) fn epoch_files(checkpoint_dir: &Path) -> Result<BTreeMap<usize, u8>> {
    let path = checkpoint_dir;
    let io = |source| DdpTrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => return Err(io(source)),
    };
    let mut found: BTreeMap<usize, u8> = BTreeMap::new();
    for entry in entries {
        let name = entry
            .map_err(io)?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.starts_with('.') {
            continue; // a temporary file of an unfinished atomic write
        }
        let stem = name.split('.').next().unwrap_or_default();
        let Some((kind, epoch)) = stem.rsplit_once('-') else {
            continue;
        };
        let bit = match kind {
            "model" => 1,
            "optim" => 2,
            "scheduler" => 4,
            _ => continue,
        };
        if let Ok(epoch) = epoch.parse::<usize>() {
            *found.entry(epoch).or_default() |= bit;
        }
    }
    Ok(found)
}
