//! Loading the checkpoint a run resumes from into the learner: a mid-epoch checkpoint
//! (rank 0's step files, with the loader's position), an epoch end from rank 0's files
//! (broadcast, so no rank but rank 0 reads the directory) or from burn-train's own
//! checkpointer (every rank reads). Apart from `resume.rs`, which decides what to load.

use super::{DdpStrategy, model_device};
use crate::checkpoint::{KINDS, STEPS_DIR, decode, fetch_from_rank0, file_path, step_files};
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use crate::mid_epoch::{LoaderPosition, ResumePoint};
use burn_train::{
    Learner, LearnerModelRecord, LearnerOptimizerRecord, LearnerSchedulerRecord, TrainingComponents,
};
use ddp_core::comm::panic_message;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

impl DdpStrategy {
    /// Loads rank 0's checkpoint inside epoch `point.epochs_done + 1` into `learner`, and
    /// returns where the training loader was when it was taken.
    pub(super) fn load_mid_epoch<LC: DdpComponents>(
        &self,
        learner: &mut Learner<LC>,
        point: ResumePoint,
    ) -> Result<LoaderPosition> {
        let pg = &self.pg;
        let Some(dir) = &self.checkpoints else {
            return Err(DdpTrainError::Settings(
                "resuming inside an epoch needs with_checkpoints(dir), where rank 0's \
                 mid-epoch checkpoints are"
                    .into(),
            ));
        };
        let (epoch, step) = (point.epochs_done + 1, point.steps_done);
        let paths = step_files(&dir.join("checkpoint").join(STEPS_DIR), epoch, step);
        let what = format!("the checkpoint of epoch {epoch}, step {step}");
        let files = fetch_from_rank0(pg, &paths, &what)?;
        let [model, optim, scheduler, position]: [Vec<u8>; 4] =
            files.try_into().map_err(|files: Vec<Vec<u8>>| {
                DdpTrainError::Resume(format!("{what}: {} files instead of 4", files.len()))
            })?;
        let position = LoaderPosition::decode(&position, &paths[3])?;
        if (position.epoch, position.step) != (epoch, step) {
            return Err(DdpTrainError::Resume(format!(
                "{}: says epoch {}, step {}",
                paths[3].display(),
                position.epoch,
                position.step
            )));
        }
        if position.world != pg.world_size() {
            return Err(DdpTrainError::Resume(format!(
                "{what} was taken with {} ranks, this run has {}: resume a mid-epoch \
                 checkpoint with the same world size, or from the last epoch end \
                 (ddp_train::resume_epoch)",
                position.world,
                pg.world_size()
            )));
        }
        self.load_records(learner, [model, optim, scheduler], &paths)?;
        tracing::info!(
            rank = pg.rank(),
            epoch,
            step,
            "resumed inside epoch {epoch}, after step {step}, from rank 0's checkpoint"
        );
        Ok(position)
    }

    /// Loads the checkpoint of `epoch`'s end into `learner`: rank 0's files with
    /// [`with_checkpoints`](Self::with_checkpoints), else burn-train's checkpointer.
    pub(super) fn load_epoch_end<LC: DdpComponents>(
        &self,
        components: &TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        epoch: usize,
    ) -> Result<()> {
        let pg = &self.pg;
        match &self.checkpoints {
            Some(dir) => {
                let dir = dir.join("checkpoint");
                let paths: Vec<PathBuf> = KINDS.iter().map(|k| file_path(&dir, k, epoch)).collect();
                let files = fetch_from_rank0(pg, &paths, &format!("checkpoint {epoch}"))?;
                let files: [Vec<u8>; 3] = files.try_into().map_err(|files: Vec<Vec<u8>>| {
                    DdpTrainError::Resume(format!(
                        "checkpoint {epoch}: {} files instead of {}",
                        files.len(),
                        KINDS.len()
                    ))
                })?;
                self.load_records(learner, files, &paths)?;
                tracing::info!(rank = pg.rank(), epoch, "resumed from rank 0's checkpoint");
            }
            None => {
                // The same on every rank (the source was compared above).
                let Some(checkpointer) = &components.checkpointer else {
                    return Err(DdpTrainError::Settings(format!(
                        "resuming after epoch {epoch} needs a checkpoint to load, but neither \
                         DdpStrategy::with_checkpoints(dir) nor burn-train's \
                         with_file_checkpointer is set (epoch {} would start from untrained \
                         weights): add with_checkpoints(dir) with the training directory, or \
                         start over without a resume point",
                        epoch + 1
                    )));
                };
                // burn-train's own checkpointer: every rank reads the files (shared directory).
                // It panics on a missing or cut-short file (burn writes in place, so a kill
                // mid-write leaves one): an error here fails every rank instead, and says how
                // to get past it rather than crash on every restart.
                let device = model_device(&learner.model());
                let loaded = catch_unwind(AssertUnwindSafe(|| {
                    checkpointer.load_checkpoint(learner.clone(), &device, epoch)
                }));
                *learner = loaded.map_err(|panic| {
                    DdpTrainError::Resume(format!(
                        "burn-train's checkpointer could not load the checkpoint of epoch \
                         {epoch} ({}): checkpoint/model-{epoch}, optim-{epoch} or \
                         scheduler-{epoch} in the training directory is missing or cut short \
                         (burn writes them in place; a kill mid-write cuts one). Delete those \
                         three files of epoch {epoch} to resume from the epoch before, or use \
                         DdpStrategy::with_checkpoints(dir), which writes atomically",
                        panic_message(panic.as_ref())
                    ))
                })?;
            }
        }
        Ok(())
    }

    /// Decodes a checkpoint's model, optimizer and scheduler records (`paths` in that order,
    /// for errors) into `learner`.
    fn load_records<LC: DdpComponents>(
        &self,
        learner: &mut Learner<LC>,
        [model, optim, scheduler]: [Vec<u8>; 3],
        paths: &[PathBuf],
    ) -> Result<()> {
        let device = &model_device(&learner.model());
        learner.load_model(decode::<LC::Backend, LearnerModelRecord<LC>>(
            model, device, &paths[0],
        )?);
        learner.load_optim(decode::<LC::Backend, LearnerOptimizerRecord<LC>>(
            optim, device, &paths[1],
        )?);
        learner.load_scheduler(decode::<LC::Backend, LearnerSchedulerRecord<LC>>(
            scheduler, device, &paths[2],
        )?);
        Ok(())
    }
}
