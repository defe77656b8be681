//! Where a run resumes, the same on every rank: the strategy's [`ResumePoint`] or
//! burn-train's `checkpoint(epoch)`, checked against every other rank's (point and checkpoint
//! source) before anything is loaded, then loaded (`load.rs`). Apart because this is the one
//! collective decision a run takes before training.

use super::DdpStrategy;
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use crate::mid_epoch::{LoaderPosition, ResumePoint};
use burn_train::{Learner, TrainingComponents};

/// Where a resumed epoch end is loaded from. Compared across ranks: the sources run different
/// collectives (rank 0's files are broadcast, burn's are read by every rank), so ranks that
/// differ would hang in mismatched collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckpointSource {
    /// Nothing to load from.
    None = 0,
    /// [`DdpStrategy::with_checkpoints`]: rank 0's files, broadcast.
    Rank0Files = 1,
    /// burn-train's own checkpointer (`with_file_checkpointer`): every rank reads its files.
    Burn = 2,
}

impl CheckpointSource {
    /// The name in errors of the source an all-gathered code stands for.
    fn describe(code: i64) -> &'static str {
        match code {
            0 => "no checkpointer",
            1 => "with_checkpoints",
            2 => "burn-train's checkpointer",
            _ => "?",
        }
    }
}

impl DdpStrategy {
    /// Where the run resumes: the strategy's [`ResumePoint`] (see
    /// [`with_resume`](Self::with_resume)), else burn-train's `checkpoint(epoch)` (an epoch
    /// end); `None` for a fresh start.
    pub(super) fn resume_point(
        &self,
        burn_checkpoint: Option<usize>,
    ) -> Result<Option<ResumePoint>> {
        let Some(point) = self.resume else {
            return Ok(burn_checkpoint.map(|epochs_done| ResumePoint {
                epochs_done,
                steps_done: 0,
            }));
        };
        let expected = (point.epochs_done > 0).then_some(point.epochs_done);
        if burn_checkpoint.is_some() && burn_checkpoint != expected {
            return Err(DdpTrainError::Resume(format!(
                "DdpStrategy::with_resume says after {} epochs and {} steps, burn-train's \
                 checkpoint({}) says after epoch {}; give the same point to both (distributed() \
                 passes the strategy's to burn-train)",
                point.epochs_done,
                point.steps_done,
                burn_checkpoint.unwrap_or_default(),
                burn_checkpoint.unwrap_or_default()
            )));
        }
        Ok(Some(point).filter(|p| p.epochs_done > 0 || p.steps_done > 0))
    }

    /// Loads the checkpoint the run resumes from ([`resume_point`](Self::resume_point)), the
    /// same on every rank; inside an epoch, also returns where the loader was.
    pub(super) fn resume<LC: DdpComponents>(
        &self,
        components: &TrainingComponents<LC>,
        learner: &mut Learner<LC>,
    ) -> Result<Option<(ResumePoint, Option<LoaderPosition>)>> {
        let pg = &self.pg;
        let resume = self.resume_point(components.checkpoint)?;
        let source = match (&self.checkpoints, &components.checkpointer) {
            (Some(_), _) => CheckpointSource::Rank0Files,
            (None, Some(_)) => CheckpointSource::Burn,
            (None, None) => CheckpointSource::None,
        };
        if pg.world_size() > 1 {
            self.check_same_resume(resume, source)?;
        }
        let Some(point) = resume else {
            return Ok(None);
        };
        if point.is_mid_epoch() {
            let position = self.load_mid_epoch(learner, point)?;
            return Ok(Some((point, Some(position))));
        }
        self.load_epoch_end(components, learner, point.epochs_done)?;
        Ok(Some((point, None)))
    }

    /// Refuses, on every rank, ranks given different points to resume from, or, when
    /// resuming, different checkpoint sources (they would run different collectives).
    fn check_same_resume(
        &self,
        resume: Option<ResumePoint>,
        source: CheckpointSource,
    ) -> Result<()> {
        let pg = &self.pg;
        // A rank resuming elsewhere (or not at all) would train other weights, then hang or
        // fail at the first all-reduce; refuse it up front. [epochs, steps, source]
        let (epochs, steps) =
            resume.map_or((-1, 0), |p| (p.epochs_done as i64, p.steps_done as i64));
        let mine = [epochs, steps, source as i64];
        let mut all = vec![0i64; 3 * pg.world_size()];
        pg.all_gather(&mine, &mut all).map_err(DdpTrainError::comm(
            "comparing the points the ranks resume from",
        ))?;
        if all.chunks(3).any(|p| p[..2] != all[..2]) {
            let by_rank: Vec<String> = all
                .chunks(3)
                .map(|p| match p {
                    [-1, _, _] => "none".to_string(),
                    [epochs, 0, _] => format!("after epoch {epochs}"),
                    [epochs, steps, _] => format!("epoch {} after step {steps}", epochs + 1),
                    _ => "?".to_string(),
                })
                .collect();
            return Err(DdpTrainError::Resume(format!(
                "the ranks were given different points to resume from (by rank: [{}]); take \
                 them from ddp_train::resume_point (or resume_epoch), which gives every \
                 rank rank 0's",
                by_rank.join(", ")
            )));
        }
        // Only a resume loads: a fresh start with the setting on rank 0 alone is fine.
        if resume.is_some() && all.chunks(3).any(|p| p[2] != all[2]) {
            let by_rank: Vec<&str> = all
                .chunks(3)
                .map(|p| CheckpointSource::describe(p[2]))
                .collect();
            return Err(DdpTrainError::Settings(format!(
                "the ranks resume from different checkpointers (by rank: [{}]); give every \
                 rank the same: DdpStrategy::with_checkpoints(dir) on every rank (only rank \
                 0 reads its dir), or burn-train's with_file_checkpointer on every rank",
                by_rank.join(", ")
            )));
        }
        Ok(())
    }
}
