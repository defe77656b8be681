//! Where a resumed epoch's training steps start: the training loader's iterator moved to (or
//! checked at) the position a mid-epoch checkpoint recorded. Apart from loading the
//! checkpoint (`load.rs`) because it runs on the epoch's own iterator, at the epoch's start.

use crate::error::{DdpTrainError, Result};
use crate::loader::next_batch;
use crate::mid_epoch::LoaderPosition;

/// Moves a fresh epoch's iterator to where a mid-epoch checkpoint left it and returns the
/// steps already taken (0 without one). A loader that starts there itself (a
/// [`DistributedLoader`](crate::DistributedLoader) given the same
/// [`ResumePoint`](crate::ResumePoint)) is checked; any other has the taken batches pulled and dropped.
pub(super) fn skip_to<O>(
    iter: &mut dyn burn::data::dataloader::DataLoaderIterator<O>,
    epoch: usize,
    resume_at: Option<LoaderPosition>,
) -> Result<usize> {
    let start = iter.progress().items_processed;
    let Some(position) = resume_at else {
        if start != 0 {
            return Err(DdpTrainError::Resume(format!(
                "epoch {epoch}: the training loader starts at item {start}, inside the epoch, \
                 but the strategy resumes at its start: give DdpStrategy::with_resume the \
                 ResumePoint the loader got"
            )));
        }
        return Ok(0);
    };
    if start == 0 {
        for pulled in 0..position.step {
            if next_batch(iter).map_err(|f| f.in_epoch(epoch))?.is_none() {
                return Err(DdpTrainError::Resume(format!(
                    "epoch {epoch}: the training loader ended after {pulled} batches, but the \
                     checkpoint was taken after step {}",
                    position.step
                )));
            }
        }
    }
    let at = iter.progress().items_processed;
    if at != position.items {
        return Err(DdpTrainError::Resume(format!(
            "epoch {epoch}: after step {} the training loader is at item {at}, but it was at \
             item {} when the checkpoint was taken: resume with the same data set, batch size \
             and world size",
            position.step, position.items
        )));
    }
    Ok(position.step)
}
