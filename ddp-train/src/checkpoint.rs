//! burn-train checkpoints that need no shared filesystem and survive a crash mid-write.
//!
//! burn-train's `FileCheckpointer` writes each file in place (a kill mid-write leaves a cut
//! file under the final name) and every rank reads the files back to resume (the directory
//! must be shared). [`DdpStrategy::with_checkpoints`](crate::DdpStrategy::with_checkpoints)
//! replaces both halves: rank 0 alone writes, each file to a temporary name, fsynced, renamed
//! into place and the directory fsynced, so a file under its final name is always complete;
//! on resume rank 0 reads the three files and broadcasts their bytes, and every rank decodes
//! the same records. Only rank 0 ever touches the directory. Both halves are ddp-core's
//! checkpoint storage layer ([`write_file_atomically`], [`read_on_rank0`]), the one under
//! `FullCheckpointer` and `ShardedCheckpointer` too.
//!
//! The files keep burn-train's layout (`checkpoint/{model,optim,scheduler}-<epoch>.mpk`, named
//! MessagePack at full precision, so resuming is bitwise), which
//! [`latest_checkpoint`](crate::latest_checkpoint) reads.

use crate::error::{DdpTrainError, Result};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::backend::Backend;
use burn_train::checkpoint::{Checkpointer, CheckpointerError};
use ddp_core::checkpoint::storage::{ensure_dir, read_on_rank0, write_file_atomically};
use ddp_core::checkpoint::{DirLock, lock_dir};
use ddp_core::comm::ProcessGroup;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The encoding of every checkpoint file: full precision, so a resumed run is bitwise the
/// uninterrupted one (burn's `CompactRecorder` halves the floats).
pub(crate) type CheckpointRecorder = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// The extension of checkpoint files (that of burn's `NamedMpkFileRecorder`).
const EXTENSION: &str = "mpk";

/// The three kinds of file a burn-train checkpoint consists of, in the order they are sent.
pub(crate) const KINDS: [&str; 3] = ["model", "optim", "scheduler"];

/// `dir/checkpoint/<kind>-<epoch>.mpk`.
pub(crate) fn file_path(checkpoint_dir: &Path, kind: &str, epoch: usize) -> PathBuf {
    checkpoint_dir.join(format!("{kind}-{epoch}.{EXTENSION}"))
}

/// The subdirectory of `dir/checkpoint` holding mid-epoch checkpoints.
pub(crate) const STEPS_DIR: &str = "steps";
pub(crate) const POSITION: &str = "position";

/// `steps/<kind>-<epoch>-<step>.mpk`, or `.txt` for the position.
pub(crate) fn step_file_path(steps_dir: &Path, kind: &str, epoch: usize, step: usize) -> PathBuf {
    let extension = if kind == POSITION { "txt" } else { "mpk" };
    steps_dir.join(format!("{kind}-{epoch}-{step}.{extension}"))
}

/// The four files of step checkpoint `(epoch, step)`: [`KINDS`], then the position.
pub(crate) fn step_files(steps_dir: &Path, epoch: usize, step: usize) -> Vec<PathBuf> {
    KINDS
        .iter()
        .chain(&[POSITION])
        .map(|kind| step_file_path(steps_dir, kind, epoch, step))
        .collect()
}

/// Takes the lock of the checkpoint directory `dir` (created if missing) for rank 0: two jobs
/// writing one directory would delete each other's files and resume each other's epochs (see
/// [`ddp_core::checkpoint::lock_dir`]).
///
/// # Errors
/// Another job holds the lock (named: host, pid, start); the directory cannot be created or
/// locked.
pub(crate) fn lock_checkpoint_dir(dir: &Path) -> Result<DirLock> {
    let storage = DdpTrainError::storage("locking the checkpoint directory");
    ensure_dir(dir)
        .and_then(|()| lock_dir(dir))
        .map_err(|e| storage(e.into()))
}

/// The subdirectory of `dir/checkpoint` where unfinished epoch-end sets are set aside.
pub(crate) const UNFINISHED_DIR: &str = "unfinished";

/// Moves the epoch-end files of every epoch after `after` (the epoch this run starts from)
/// that lacks one of its three files into [`UNFINISHED_DIR`]: an interrupted attempt left
/// them, and this run writes that epoch's files again one by one (on threads of their own), so
/// a kill between two of its writes would otherwise complete a set from two attempts (the
/// model of this run with the optimizer of the last), which on a GPU differ. Nothing is
/// deleted: a set-aside file keeps its name, with the time it was moved appended. Complete
/// later epochs stay (a run deliberately resumed from an earlier epoch), and are said to be
/// overwritten as it gets there. Rank 0 only (holding the directory's lock unless the caller
/// took it). A file that cannot be moved is a warning.
///
/// # Errors
/// The directory exists but cannot be read.
pub(crate) fn set_aside_unfinished_epochs(checkpoint_dir: &Path, after: usize) -> Result<()> {
    let aside = checkpoint_dir.join(UNFINISHED_DIR);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for (epoch, kinds) in crate::resume::epoch_files(checkpoint_dir)?.range(after + 1..) {
        if *kinds == crate::resume::ALL_KINDS {
            tracing::warn!(
                epoch,
                dir = %checkpoint_dir.display(),
                "a later epoch's checkpoint than the one this run starts from: this run \
                 overwrites it when it gets there"
            );
            continue;
        }
        for (bit, kind) in KINDS.iter().enumerate() {
            if kinds & (1 << bit) == 0 {
                continue;
            }
            let path = file_path(checkpoint_dir, kind, *epoch);
            let name = format!("{kind}-{epoch}.{EXTENSION}.{stamp}");
            let moved = ensure_dir(&aside)
                .map_err(std::io::Error::other)
                .and_then(|()| std::fs::rename(&path, aside.join(&name)));
            match moved {
                Ok(()) => tracing::warn!(
                    path = %path.display(),
                    to = %aside.join(&name).display(),
                    "set aside a file of an unfinished checkpoint of an earlier attempt"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "could not set aside a file of an unfinished checkpoint"
                ),
            }
        }
    }
    Ok(())
}

/// The first checkpoint write that failed, shared between the writer threads and the strategy
/// (burn's asynchronous checkpointer only stops training on an error; this keeps the reason).
pub(crate) type FailureSlot = Arc<Mutex<Option<DdpTrainError>>>;

/// Ends the run alike on every rank once rank 0's writes have finished: `failed` is rank 0's
/// failed write (the others pass `None`), and every rank returns an error with its reason.
/// Without this a failed last write, or one that stopped training through the interrupter,
/// failed rank 0 alone while the others reported success.
///
/// # Collective
/// Every rank calls it at the same point.
///
/// # Errors
/// Rank 0's failure (on rank 0 itself, the error as it was); a failed broadcast.
pub(crate) fn rank0_failure_on_every_rank(
    pg: &ProcessGroup,
    failed: Option<DdpTrainError>,
) -> Result<()> {
    if pg.world_size() == 1 {
        return failed.map_or(Ok(()), Err);
    }
    // Rank 0's reason (never empty: it starts with a marker), or nothing when it succeeded.
    let reason = match (&failed, pg.rank()) {
        (Some(e), 0) => format!("!{e}").into_bytes(),
        _ => Vec::new(),
    };
    let reason = pg.broadcast_bytes(reason, 0).map_err(DdpTrainError::comm(
        "receiving the outcome of rank 0's checkpoint writes",
    ))?;
    let Some(reason) = reason.strip_prefix(b"!") else {
        return Ok(());
    };
    Err(failed.unwrap_or_else(|| {
        DdpTrainError::Failed(format!(
            "rank 0 could not write a checkpoint: {}",
            String::from_utf8_lossy(reason)
        ))
    }))
}

/// One kind of file (model, optimizer or scheduler) of rank 0's checkpoints, written
/// atomically. Used through burn's `AsyncCheckpointer`, so writes overlap the next epoch.
pub(crate) struct AtomicFileCheckpointer {
    dir: PathBuf,
    kind: &'static str,
    /// For a mid-epoch checkpoint, the step it is taken after (the file names carry it).
    step: Option<usize>,
    failure: FailureSlot,
}

impl AtomicFileCheckpointer {
    /// Epoch-end files, `dir/<kind>-<epoch>.mpk`.
    pub(crate) fn new(dir: PathBuf, kind: &'static str, failure: FailureSlot) -> Self {
        AtomicFileCheckpointer {
            dir,
            kind,
            step: None,
            failure,
        }
    }

    /// Mid-epoch files, `dir/<kind>-<epoch>-<step>.mpk`.
    pub(crate) fn for_step(
        dir: PathBuf,
        kind: &'static str,
        step: usize,
        failure: FailureSlot,
    ) -> Self {
        AtomicFileCheckpointer {
            dir,
            kind,
            step: Some(step),
            failure,
        }
    }

    fn path(&self, epoch: usize) -> PathBuf {
        match self.step {
            Some(step) => step_file_path(&self.dir, self.kind, epoch, step),
            None => file_path(&self.dir, self.kind, epoch),
        }
    }

    fn record_failure(&self, error: DdpTrainError) {
        let text = error.to_string();
        let mut slot = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(error);
        }
        tracing::error!(error = %text, "writing a checkpoint failed");
    }
}

impl<R: Record<B>, B: Backend> Checkpointer<R, B> for AtomicFileCheckpointer {
    fn save(&self, epoch: usize, record: R) -> Result<(), CheckpointerError> {
        let path = self.path(epoch);
        let bytes =
            Recorder::<B>::record(&CheckpointRecorder::default(), record, ()).map_err(|e| {
                self.record_failure(DdpTrainError::Checkpoint {
                    path: path.clone(),
                    reason: format!("encoding the {} record: {e}", self.kind),
                });
                CheckpointerError::Unknown(e.to_string())
            })?;
        ensure_dir(&self.dir).map_err(|e| {
            self.record_failure(DdpTrainError::Checkpoint {
                path: path.clone(),
                reason: format!("creating its directory: {e}"),
            });
            CheckpointerError::Unknown(e.to_string())
        })?;
        write_file_atomically(&path, |f| f.write_all(&bytes)).map_err(|e| {
            let message = e.to_string();
            self.record_failure(DdpTrainError::storage(format!(
                "saving the {} record",
                self.kind
            ))(e));
            CheckpointerError::Unknown(message)
        })?;
        tracing::debug!(path = %path.display(), bytes = bytes.len(), "checkpoint file written");
        Ok(())
    }

    fn delete(&self, epoch: usize) -> Result<(), CheckpointerError> {
        let path = self.path(epoch);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                // An old checkpoint left behind costs disk space, not correctness.
                tracing::warn!(path = %path.display(), error = %e, "could not delete an old checkpoint file");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Never used: [`DdpStrategy`](crate::DdpStrategy) restores through
    /// [`fetch_from_rank0`], so that only rank 0 reads files.
    fn restore(&self, epoch: usize, _device: &B::Device) -> Result<R, CheckpointerError> {
        Err(CheckpointerError::Unknown(format!(
            "{} checkpoint {epoch}: restored by DdpStrategy from rank 0's bytes, not here",
            self.kind
        )))
    }
}

/// The bytes of the files `paths` (a checkpoint's), read by rank 0 and broadcast
/// ([`read_on_rank0`]), so the other ranks need not see its directory. `what` names the
/// checkpoint in errors.
///
/// # Collective
/// Every rank calls it with the same number of paths.
///
/// # Errors
/// On rank 0, a file it cannot read; on the others, that rank 0 could not (with its reason);
/// a failed broadcast.
pub(crate) fn fetch_from_rank0(
    pg: &ProcessGroup,
    paths: &[PathBuf],
    what: &str,
) -> Result<Vec<Vec<u8>>> {
    read_on_rank0(pg, paths).map_err(DdpTrainError::storage(format!("resuming from {what}")))
}

/// Decodes one checkpoint file's bytes.
pub(crate) fn decode<B: Backend, R: Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
    what: &Path,
) -> Result<R> {
    Recorder::<B>::load(&CheckpointRecorder::default(), bytes, device).map_err(|e| {
        DdpTrainError::Checkpoint {
            path: what.to_path_buf(),
            reason: format!("decoding: {e}"),
        }
    })
}

/// The epoch to resume from, the same on every rank: the latest complete epoch-end checkpoint
/// in rank 0's `dir` (see [`latest_checkpoint`](crate::latest_checkpoint)), broadcast. It
/// ignores mid-epoch checkpoints: [`resume_point`](crate::resume_point) includes them. Only rank 0
/// reads `dir`, so the ranks need no shared filesystem; pass the result to
/// `SupervisedTraining::checkpoint` and
/// [`DistributedLoader::with_start_epoch`](crate::DistributedLoader::with_start_epoch).
///
/// # Collective
/// Every rank of `pg` calls it.
///
/// # Errors
/// Rank 0 cannot read its directory (the other ranks then get [`DdpTrainError::Resume`]); a
/// failed broadcast.
pub fn resume_epoch(pg: &ProcessGroup, dir: impl AsRef<Path>) -> Result<Option<usize>> {
    // 0: no checkpoint, else the epoch + 1.
    let [found] = read_on_rank0_and_share(pg, "epoch to resume", || {
        Ok([crate::latest_checkpoint(dir.as_ref())?.map_or(0, |e| e as i64 + 1)])
    })?;
    match found {
        0 => Ok(None),
        n => Ok(Some(n as usize - 1)),
    }
}

/// What rank 0 finds in its checkpoint directory (`read`: non-negative numbers), on every
/// rank, so that the ranks need no shared filesystem. Rank 0 returns `read`'s error; the other
/// ranks then get [`DdpTrainError::Resume`] in its place.
///
/// # Collective
/// Every rank of `pg` calls it; only rank 0 runs `read`.
///
/// # Errors
/// As above; a failed broadcast (receiving the `what` from rank 0).
pub(crate) fn read_on_rank0_and_share<const N: usize>(
    pg: &ProcessGroup,
    what: &str,
    read: impl FnOnce() -> Result<[i64; N]>,
) -> Result<[i64; N]> {
    // -1 first: rank 0 failed.
    let mut found = [-1i64; N];
    let mut failure = None;
    if pg.rank() == 0 {
        match read() {
            Ok(numbers) => found = numbers,
            Err(e) => failure = Some(e),
        }
    }
    if pg.world_size() > 1 {
        pg.broadcast(&mut found, 0)
            .map_err(DdpTrainError::comm(format!(
                "receiving the {what} from rank 0"
            )))?;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if found.first() == Some(&-1) {
        return Err(DdpTrainError::Resume(
            "rank 0 could not read its checkpoint directory (its log says why)".into(),
        ));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddp_core::checkpoint::storage::remove_temporary_files;

    #[test]
    fn leftover_temporaries_are_not_checkpoints_and_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ckpt = dir.path().join("checkpoint");
        std::fs::create_dir_all(&ckpt).expect("dir");
        for kind in KINDS {
            std::fs::write(file_path(&ckpt, kind, 1), b"whole").expect("write");
            // Epoch 2 was being written when the process died.
            std::fs::write(ckpt.join(format!(".tmp-{kind}-2.mpk-1234")), b"cut sh").expect("write");
        }
        assert_eq!(crate::latest_checkpoint(dir.path()).expect("read"), Some(1));
        assert_eq!(remove_temporary_files(&ckpt), 3);
        assert_eq!(std::fs::read_dir(&ckpt).expect("listing").count(), 3);
        assert_eq!(crate::latest_checkpoint(dir.path()).expect("read"), Some(1));
    }

    /// Of epoch 2's files only the model and optimizer exist (an attempt killed between its
    /// writes): a run resuming from epoch 1 sets them aside (nothing is deleted), keeps epoch
    /// 1's and the complete epoch 3, and a run starting after epoch 3 leaves epoch 2 alone.
    #[test]
    fn an_unfinished_later_epoch_is_set_aside_before_a_run_writes_it_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = [
            "model-1.mpk",
            "optim-1.mpk",
            "scheduler-1.mpk",
            "model-2.mpk",
            "optim-2.mpk",
            "model-3.mpk",
            "optim-3.mpk",
            "scheduler-3.mpk",
            "model-5.mpk",
            "notes.txt",
        ];
        for name in files {
            std::fs::write(dir.path().join(name), name).expect("write");
        }
        let names = |dir: &Path| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            names
        };
        let aside = dir.path().join(UNFINISHED_DIR);
        set_aside_unfinished_epochs(dir.path(), 4).expect("after epoch 4");
        assert!(!names(dir.path()).contains(&"model-5.mpk".to_string()));
        assert!(names(dir.path()).contains(&"optim-2.mpk".to_string()));
        set_aside_unfinished_epochs(dir.path(), 1).expect("after epoch 1");
        let mut expected: Vec<String> = files
            .iter()
            .filter(|n| !n.ends_with("-2.mpk") && !n.ends_with("-5.mpk"))
            .map(|n| n.to_string())
            .chain([UNFINISHED_DIR.to_string()])
            .collect();
        expected.sort();
        assert_eq!(names(dir.path()), expected);
        let set_aside: Vec<String> = names(&aside)
            .iter()
            .map(|n| n.split(".mpk").next().unwrap_or_default().to_string())
            .collect();
        assert_eq!(set_aside, ["model-2", "model-5", "optim-2"]);
        for name in names(&aside) {
            let original = name.split(".mpk").next().unwrap_or_default();
            let text = std::fs::read_to_string(aside.join(&name)).expect("a set-aside file");
            assert_eq!(text, format!("{original}.mpk"), "{name} keeps its bytes");
        }
        set_aside_unfinished_epochs(&dir.path().join("missing"), 0).expect("no directory");
    }
}
