//! Where a resumed epoch's training steps start: the training loader's iterator moved to (or
//! checked at) the position a mid-epoch checkpoint recorded. Apart from loading the
//! checkpoint (`load.rs`) because it runs on the epoch's own iterator, at the epoch's start.

use crate::error::{DdpTrainError, Result};
use crate::loader::{LoaderInfo, loader_info, next_batch};
use crate::mid_epoch::{DataOrder, LoaderPosition};

/// Moves a fresh epoch's iterator to where a mid-epoch checkpoint left it and returns the
/// steps already taken (0 without one). A loader that starts there itself (a
/// [`DistributedLoader`](crate::DistributedLoader) given the same
/// [`ResumePoint`](crate::ResumePoint)) is checked; any other has the taken batches pulled and dropped.
pub(super) fn skip_to<O>(
    iter: &mut dyn burn::data::dataloader::DataLoaderIterator<O>,
    epoch: usize,
    resume_at: Option<LoaderPosition>,
) -> Result<usize> {
    // The item count alone does not tell a loader shuffling for another epoch (or another
    // data set) from the right one: a DistributedLoader says which it is.
    let info = loader_info(&*iter);
    if let Some(info) = info {
        check_sampler_epoch(epoch, info)?;
    }
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
    if let Some(info) = info {
        check_order(epoch, &position, info.order)?;
    }
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

/// burn-train's `epoch` (from 1) is the sampler's `epoch - 1`, as in an uninterrupted run: a
/// loader not told where a run resumes would train it on another epoch's order.
fn check_sampler_epoch(epoch: usize, info: LoaderInfo) -> Result<()> {
    let expected = epoch.saturating_sub(1) as u64;
    if info.sampler_epoch == expected {
        return Ok(());
    }
    Err(DdpTrainError::Resume(format!(
        "epoch {epoch}: the training loader shuffles for sampler epoch {}, but an \
         uninterrupted run shuffles epoch {epoch} for sampler epoch {expected}: give \
         DistributedLoader::with_resume the ResumePoint the strategy got (or \
         with_start_epoch({expected}) when resuming at an epoch's start)",
        info.sampler_epoch
    )))
}

/// The loader's data order is the one the checkpoint's loader had (ddp-data's sampler state
/// would refuse another, but a resume rebuilds that state from the current sampler).
fn check_order(epoch: usize, position: &LoaderPosition, now: DataOrder) -> Result<()> {
    let Some(saved) = position.order else {
        tracing::warn!(
            epoch,
            step = position.step,
            "the mid-epoch checkpoint does not record its data order (written by an older \
             ddp-train, or by a run whose loader was not a DistributedLoader): the data set \
             length, seed, shuffle and drop_last are not checked"
        );
        return Ok(());
    };
    let differs: [(&str, String, String); 4] = [
        (
            "data set length",
            saved.dataset_len.to_string(),
            now.dataset_len.to_string(),
        ),
        ("sampler seed", saved.seed.to_string(), now.seed.to_string()),
        (
            "shuffle",
            saved.shuffle.to_string(),
            now.shuffle.to_string(),
        ),
        (
            "drop_last",
            saved.drop_last.to_string(),
            now.drop_last.to_string(),
        ),
    ];
    let differs: Vec<String> = differs
        .into_iter()
        .filter(|(_, saved, now)| saved != now)
        .map(|(name, saved, now)| format!("{name} {saved} at the checkpoint, {now} now"))
        .collect();
    if differs.is_empty() {
        return Ok(());
    }
    Err(DdpTrainError::Resume(format!(
        "epoch {epoch}, step {}: the training loader's data order is not the checkpoint's ({}): \
         resume a mid-epoch checkpoint with the same data set and sampler settings, or from the \
         last epoch end (ddp_train::resume_epoch)",
        position.step,
        differs.join("; ")
    )))
}
