//! Checkpoints inside an epoch, every `n` optimizer steps
//! ([`DdpStrategy::with_checkpoint_every_n_steps`](crate::DdpStrategy::with_checkpoint_every_n_steps),
//! PyTorch Lightning's `every_n_train_steps`), and the [`ResumePoint`] a restarted run
//! continues from.
//!
//! A mid-epoch checkpoint is four files in `dir/checkpoint/steps/`:
//! `{model,optim,scheduler}-<epoch>-<step>.mpk` (burn-train's records, full precision) and
//! `position-<epoch>-<step>.txt` (where the data loader was), each written atomically, the
//! position last: a checkpoint counts once all four exist (a re-save of the same step removes
//! the old position first). Rank 0 alone writes them, and removes the previous one's files
//! once the new one is complete.

use crate::checkpoint::{
    AtomicFileCheckpointer, FailureSlot, POSITION, STEPS_DIR, read_on_rank0_and_share,
    step_file_path, step_files,
};
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use burn::record::Record;
use burn::tensor::backend::Backend;
use burn_train::checkpoint::{AsyncCheckpointer, CheckpointingAction, CheckpointingStrategy};
use burn_train::metric::store::EventStoreClient;
use burn_train::{Interrupter, Learner, LearningCheckpointer};
use ddp_core::checkpoint::storage::{ensure_dir, write_file_atomically};
use ddp_core::comm::ProcessGroup;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;

/// Where a restarted run continues: after `epochs_done` complete epochs and `steps_done`
/// training steps of the next one. The same on every rank ([`resume_point`]).
///
/// Give it to [`DdpStrategy::with_resume`](crate::DdpStrategy::with_resume) (which loads the
/// checkpoint and tells burn-train the epoch) and to
/// [`DistributedLoader::with_resume`](crate::DistributedLoader::with_resume) (which starts
/// the sampler at that epoch and position, without loading the skipped batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResumePoint {
    /// Epochs completed (trained and validated); burn-train's `checkpoint(epoch)` number.
    pub epochs_done: usize,
    /// Training steps (batches) of epoch `epochs_done + 1` already taken; 0 at an epoch end.
    pub steps_done: usize,
}

impl ResumePoint {
    /// Whether this point is inside an epoch (a step checkpoint) rather than at an epoch end.
    pub fn is_mid_epoch(&self) -> bool {
        self.steps_done > 0
    }
}

/// What fixes a training loader's order of samples, besides the epoch: recorded in a
/// mid-epoch checkpoint and compared on resume (ddp-data's `SamplerState` would refuse a
/// mismatch, but a resume rebuilds that state from the current sampler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataOrder {
    /// Samples the sampler deals out (the data set, or the slice of it the loader covers).
    pub(crate) dataset_len: usize,
    pub(crate) seed: u64,
    pub(crate) shuffle: bool,
    pub(crate) drop_last: bool,
}

/// Where the loader was when a step checkpoint was taken, checked on resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoaderPosition {
    pub(crate) epoch: usize,
    pub(crate) step: usize,
    /// The world size: the position means nothing to another one.
    pub(crate) world: usize,
    /// The loader's progress (`items_processed`, over all ranks) after `step`.
    pub(crate) items: usize,
    /// What fixed the data order (a [`DistributedLoader`](crate::DistributedLoader)'s);
    /// `None` for another loader, or in a position file written before it was recorded.
    pub(crate) order: Option<DataOrder>,
}

impl LoaderPosition {
    fn encode(&self) -> String {
        let mut text = format!(
            "epoch={}\nstep={}\nworld={}\nitems={}\n",
            self.epoch, self.step, self.world, self.items
        );
        if let Some(order) = &self.order {
            text.push_str(&format!(
                "dataset_len={}\nseed={}\nshuffle={}\ndrop_last={}\n",
                order.dataset_len, order.seed, order.shuffle, order.drop_last
            ));
        }
        text
    }

    pub(crate) fn decode(bytes: &[u8], what: &Path) -> Result<Self> {
        let bad = |reason: String| DdpTrainError::Checkpoint {
            path: what.to_path_buf(),
            reason,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
        let line = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(str::trim)
        };
        fn parse<T: std::str::FromStr>(
            value: Option<&str>,
            name: &str,
            bad: &dyn Fn(String) -> DdpTrainError,
        ) -> Result<T>
        where
            T::Err: std::fmt::Display,
        {
            value
                .ok_or_else(|| bad(format!("no `{name}=` line")))?
                .parse()
                .map_err(|e| bad(format!("`{name}`: {e}")))
        }
        let field = |name: &str| parse::<usize>(line(name), name, &bad);
        // Files written before the data order was recorded have none of its lines.
        let order = match line("dataset_len") {
            None => None,
            Some(len) => Some(DataOrder {
                dataset_len: parse(Some(len), "dataset_len", &bad)?,
                seed: parse(line("seed"), "seed", &bad)?,
                shuffle: parse(line("shuffle"), "shuffle", &bad)?,
                drop_last: parse(line("drop_last"), "drop_last", &bad)?,
            }),
        };
        Ok(LoaderPosition {
            epoch: field("epoch")?,
            step: field("step")?,
            world: field("world")?,
            items: field("items")?,
            order,
        })
    }
}

/// The latest complete step checkpoint `(epoch, step)` in this process's `dir`.
pub(crate) fn latest_step_checkpoint(dir: &Path) -> Result<Option<(usize, usize)>> {
    let steps_dir = dir.join("checkpoint").join(STEPS_DIR);
    let entries = match std::fs::read_dir(&steps_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DdpTrainError::Io {
                path: steps_dir,
                source,
            });
        }
    };
    let mut latest = None;
    for entry in entries {
        let entry = entry.map_err(|source| DdpTrainError::Io {
            path: steps_dir.clone(),
            source,
        })?;
        let Some(point) = parse_position_name(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        // An I/O error (EIO, ESTALE) is an error, not an incomplete point: resuming from an
        // older one would silently redo steps, and its next save would delete this one.
        let mut complete = true;
        for file in step_files(&steps_dir, point.0, point.1) {
            complete &= is_file(&file)?;
        }
        if complete && latest < Some(point) {
            latest = Some(point);
        }
    }
    Ok(latest)
}

/// Whether `path` is a file; a missing one is not, any other error is returned.
fn is_file(path: &Path) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.is_file()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DdpTrainError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// `position-<epoch>-<step>.txt` -> `(epoch, step)`.
fn parse_position_name(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("position-")?.strip_suffix(".txt")?;
    let (epoch, step) = rest.split_once('-')?;
    Some((epoch.parse().ok()?, step.parse().ok()?))
}

/// The latest of rank 0's checkpoints (an epoch end or a step inside a later epoch) in `dir`,
/// on every rank; `None` for a fresh start. Only rank 0 reads `dir`: the ranks need no
/// shared filesystem.
///
/// # Collective
/// Every rank of `pg` calls it.
///
/// # Errors
/// Rank 0 cannot read its directory (the other ranks then get [`DdpTrainError::Resume`]); a
/// failed broadcast.
pub fn resume_point(pg: &ProcessGroup, dir: impl AsRef<Path>) -> Result<Option<ResumePoint>> {
    // [status (0: none, 1: found), epochs_done, steps_done]
    let found = read_on_rank0_and_share(pg, "point to resume", || {
        let end = crate::latest_checkpoint(dir.as_ref())?;
        let step = latest_step_checkpoint(dir.as_ref())?;
        let epochs_done = end.unwrap_or(0);
        let point = match step {
            // A step of a later epoch than the last complete one is newer.
            Some((epoch, step)) if epoch > epochs_done => Some(ResumePoint {
                epochs_done: epoch - 1,
                steps_done: step,
            }),
            _ => end.map(|epochs_done| ResumePoint {
                epochs_done,
                steps_done: 0,
            }),
        };
        Ok(point.map_or([0; 3], |p| [1, p.epochs_done as i64, p.steps_done as i64]))
    })?;
    match found {
        [1, epochs_done, steps_done] => Ok(Some(ResumePoint {
            epochs_done: epochs_done as usize,
            steps_done: steps_done as usize,
        })),
        _ => Ok(None),
    }
}

/// One kind of file of a step checkpoint, written on a thread of its own (burn-train's
/// checkpointer takes only these).
fn step_writer<R: Record<B> + 'static, B: Backend>(
    dir: &Path,
    kind: &'static str,
    step: usize,
    failure: &FailureSlot,
) -> AsyncCheckpointer<R, B> {
    AsyncCheckpointer::new(AtomicFileCheckpointer::for_step(
        dir.to_path_buf(),
        kind,
        step,
        failure.clone(),
    ))
    .with_interrupter(Interrupter::new())
}

/// Always saves: a step checkpoint is taken whenever it is asked for.
struct SaveAlways;

impl CheckpointingStrategy for SaveAlways {
    fn checkpointing(&mut self, _epoch: usize, _: &EventStoreClient) -> Vec<CheckpointingAction> {
        vec![CheckpointingAction::Save]
    }
}

/// Rank 0's writer of step checkpoints into `dir/checkpoint/steps`.
#[derive(Debug)]
pub(crate) struct StepCheckpointer {
    steps_dir: PathBuf,
}

impl StepCheckpointer {
    pub(crate) fn new(checkpoint_dir: &Path) -> Self {
        StepCheckpointer {
            steps_dir: checkpoint_dir.join(STEPS_DIR),
        }
    }

    /// Writes the learner's model, optimizer and scheduler, then the loader's position, and
    /// returns once all are on disk; then removes every other step checkpoint's files.
    pub(crate) fn save<LC: DdpComponents>(
        &mut self,
        learner: &Learner<LC>,
        store: &EventStoreClient,
        position: LoaderPosition,
    ) -> Result<()> {
        let (epoch, step) = (position.epoch, position.step);
        ensure_dir(&self.steps_dir).map_err(|e| DdpTrainError::Checkpoint {
            path: self.steps_dir.clone(),
            reason: format!("creating the directory: {e}"),
        })?;
        // Saving a step whose checkpoint is already here (a run resumed from an earlier point
        // takes the same steps again) replaces its files one at a time: its position goes
        // first, so a crash in between leaves an incomplete checkpoint, which no resume takes,
        // never a complete-looking mix of old and new files (the directory is fsynced, so
        // the removal reaches the disk before any record is replaced).
        let path = step_file_path(&self.steps_dir, POSITION, epoch, step);
        let removed = match std::fs::remove_file(&path) {
            Ok(()) => std::fs::File::open(&self.steps_dir)
                .and_then(|dir| dir.sync_all())
                .map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        };
        match removed {
            Ok(true) => tracing::debug!(
                path = %path.display(),
                "replacing an earlier checkpoint of this step"
            ),
            Ok(false) => {}
            Err(e) => {
                return Err(DdpTrainError::Checkpoint {
                    path,
                    reason: format!(
                        "removing the earlier checkpoint of this step before writing it anew: \
                         {e} (remove that step's files by hand)"
                    ),
                });
            }
        }
        let failure = FailureSlot::default();
        {
            // burn-train's checkpointer is the only way to the optimizer's and scheduler's
            // records; a throwaway interrupter turns its panics on errors into a stop (the
            // reason is in `failure`). Dropping it waits for the writes.
            let dir = &self.steps_dir;
            let mut checkpointer = LearningCheckpointer::<LC>::new(
                step_writer(dir, "model", step, &failure),
                step_writer(dir, "optim", step, &failure),
                step_writer(dir, "scheduler", step, &failure),
                Box::new(SaveAlways),
            );
            checkpointer.checkpoint(learner, epoch, store);
        }
        if let Some(e) = failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            return Err(e);
        }
        write_file_atomically(&path, |f| f.write_all(position.encode().as_bytes()))
            .map_err(DdpTrainError::storage("saving the loader position"))?;
        tracing::info!(
            epoch,
            step,
            items = position.items,
            "mid-epoch checkpoint written"
        );
        self.remove_others(epoch, step);
        Ok(())
    }

    /// Removes every file of `steps/` but those of `(epoch, step)`: earlier step checkpoints,
    /// and parts of one a crash cut short. Position files first, so a crash here never leaves
    /// a position naming missing records. Best effort: leftovers cost disk space only.
    fn remove_others(&self, epoch: usize, step: usize) {
        let keep = step_files(&self.steps_dir, epoch, step);
        let Ok(entries) = std::fs::read_dir(&self.steps_dir) else {
            return;
        };
        let mut stale: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| !keep.contains(p))
            .collect();
        stale.sort_by_key(|p| !p.to_string_lossy().contains(POSITION));
        for path in stale {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not remove an old mid-epoch checkpoint file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_step_checkpoint_with_all_four_files_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let steps = dir.path().join("checkpoint").join(STEPS_DIR);
        std::fs::create_dir_all(&steps).expect("dir");
        for path in step_files(&steps, 2, 20) {
            std::fs::write(path, b"whole").expect("write");
        }
        // A later one cut short: its position was never written.
        for path in &step_files(&steps, 2, 40)[..3] {
            std::fs::write(path, b"whole").expect("write");
        }
        assert_eq!(
            latest_step_checkpoint(dir.path()).expect("read"),
            Some((2, 20))
        );
    }

    #[test]
    fn a_step_file_that_cannot_be_read_is_an_error_not_an_older_point() {
        let dir = tempfile::tempdir().expect("tempdir");
        let steps = dir.path().join("checkpoint").join(STEPS_DIR);
        std::fs::create_dir_all(&steps).expect("dir");
        for step in [20, 40] {
            for path in step_files(&steps, 2, step) {
                std::fs::write(path, b"whole").expect("write");
            }
        }
        // One file of the newer point cannot be looked at (a link to itself: ELOOP, as EIO or
        // ESTALE would be): resuming from step 20 would redo steps and its next save would
        // delete step 40.
        let broken = step_files(&steps, 2, 40)[0].clone();
        std::fs::remove_file(&broken).expect("remove");
        std::os::unix::fs::symlink(&broken, &broken).expect("symlink");
        let error = latest_step_checkpoint(dir.path()).expect_err("an I/O error");
        assert!(
            error.to_string().contains(&*broken.to_string_lossy()),
            "{error}"
        );
    }

    #[test]
    fn a_position_round_trips_and_a_damaged_one_is_an_error() {
        let position = LoaderPosition {
            epoch: 3,
            step: 20,
            world: 2,
            items: 640,
            order: Some(DataOrder {
                dataset_len: 256,
                seed: 42,
                shuffle: true,
                drop_last: false,
            }),
        };
        let path = Path::new("position-3-20.txt");
        let decoded = LoaderPosition::decode(position.encode().as_bytes(), path).expect("decode");
        assert_eq!(decoded, position);
        // A file written before the data order was recorded still reads, without one.
        let old = LoaderPosition::decode(b"epoch=3\nstep=20\nworld=2\nitems=640\n", path)
            .expect("an old position file");
        assert_eq!(
            old,
            LoaderPosition {
                order: None,
                ..position
            }
        );
        let error = LoaderPosition::decode(
            b"epoch=3\nstep=20\nworld=2\nitems=640\ndataset_len=256\nseed=42\n",
            path,
        )
        .expect_err("half an order");
        assert!(error.to_string().contains("`shuffle=`"), "{error}");
        let error = LoaderPosition::decode(b"epoch=3\nstep=x\n", path).expect_err("damaged");
        assert!(error.to_string().contains("`step`"), "{error}");
    }
}
