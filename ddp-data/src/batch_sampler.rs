//! [`BatchSampler`]: groups a [`DistributedSampler`]'s indices into batches.

use std::ops::Range;

use crate::{DataError, DistributedSampler, SamplerState};

/// Number of batches `samples` indices make: `ceil(samples / batch_size)`,
/// or `floor(samples / batch_size)` with `drop_last` (PyTorch's
/// `BatchSampler.__len__`). A batch size of 0 (rejected by
/// [`BatchSampler::new`]) gives 0.
pub(crate) fn num_batches(samples: usize, batch_size: usize, drop_last: bool) -> usize {
    if batch_size == 0 {
        0
    } else if drop_last {
        samples / batch_size
    } else {
        samples.div_ceil(batch_size)
    }
}

/// The position ranges of consecutive batches covering `start..end`, each
/// `batch_size` long except a shorter last one, which `drop_last` omits.
/// A batch size of 0 gives no batches.
pub(crate) fn batch_ranges(
    start: usize,
    end: usize,
    batch_size: usize,
    drop_last: bool,
) -> impl ExactSizeIterator<Item = Range<usize>> {
    let count = num_batches(end.saturating_sub(start), batch_size, drop_last);
    (0..count).map(move |k| {
        let first = start + k * batch_size;
        first..first.saturating_add(batch_size).min(end)
    })
}

/// Groups one rank's indices into batches of `batch_size`, like PyTorch's
/// `BatchSampler(DistributedSampler(..), batch_size, drop_last)`.
///
/// `drop_last` here is the *batch* setting (drop a short final batch); the
/// sampler has its own `drop_last` (drop the dataset tail that does not
/// split evenly between ranks).
///
/// Batches start at the sampler's position, so after a restore the first
/// batch begins with the first unconsumed index.
#[derive(Debug, Clone)]
pub struct BatchSampler {
    sampler: DistributedSampler,
    batch_size: usize,
    drop_last: bool,
}

impl BatchSampler {
    /// Wraps `sampler`.
    ///
    /// # Errors
    ///
    /// [`DataError::ZeroBatchSize`] if `batch_size` is 0.
    pub fn new(
        sampler: DistributedSampler,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Self, DataError> {
        if batch_size == 0 {
            return Err(DataError::ZeroBatchSize);
        }
        Ok(Self {
            sampler,
            batch_size,
            drop_last,
        })
    }

    /// The wrapped sampler.
    pub fn sampler(&self) -> &DistributedSampler {
        &self.sampler
    }

    /// The wrapped sampler, mutably (e.g. to [`advance`](DistributedSampler::advance) it).
    pub fn sampler_mut(&mut self) -> &mut DistributedSampler {
        &mut self.sampler
    }

    /// Unwraps the sampler.
    pub fn into_sampler(self) -> DistributedSampler {
        self.sampler
    }

    /// Indices per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Whether a short final batch is dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Batches in a whole epoch of this rank.
    pub fn len(&self) -> usize {
        num_batches(self.sampler.num_samples(), self.batch_size, self.drop_last)
    }

    /// Whether an epoch has no batches (e.g. `drop_last` with fewer samples
    /// than `batch_size`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batches from `position` to the end of the epoch.
    pub fn len_from(&self, position: usize) -> usize {
        num_batches(
            self.sampler.num_samples().saturating_sub(position),
            self.batch_size,
            self.drop_last,
        )
    }

    /// Batches from the sampler's position to the end of the epoch.
    pub fn remaining(&self) -> usize {
        self.len_from(self.sampler.position())
    }

    /// Moves to `epoch` (see [`DistributedSampler::set_epoch`]).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.sampler.set_epoch(epoch);
    }

    /// The sampler's resumable state.
    pub fn state(&self) -> SamplerState {
        self.sampler.state()
    }

    /// Restores the sampler's state (see [`DistributedSampler::load_state`]).
    ///
    /// # Errors
    ///
    /// As [`DistributedSampler::load_state`].
    pub fn load_state(&mut self, state: &SamplerState) -> Result<(), DataError> {
        self.sampler.load_state(state)
    }

    /// Position ranges (in this rank's list) of the batches from `position`
    /// to the end of the epoch.
    pub fn ranges_from(&self, position: usize) -> impl ExactSizeIterator<Item = Range<usize>> {
        batch_ranges(
            position,
            self.sampler.num_samples(),
            self.batch_size,
            self.drop_last,
        )
    }

    /// The dataset indices at `positions` of this rank's list.
    pub fn indices_in(&self, positions: Range<usize>) -> Vec<usize> {
        positions.filter_map(|p| self.sampler.index_at(p)).collect()
    }

    /// The batches of dataset indices from the sampler's position to the end
    /// of the epoch. Does not move the position.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Vec<usize>> + '_ {
        self.ranges_from(self.sampler.position())
            .map(|range| self.indices_in(range))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DistributedSamplerConfig;

    fn batches(len: usize, batch_size: usize, drop_last: bool) -> BatchSampler {
        let sampler = DistributedSamplerConfig::new(1, 0)
            .with_shuffle(false)
            .init(len)
            .unwrap();
        BatchSampler::new(sampler, batch_size, drop_last).unwrap()
    }

    #[test]
    fn num_batches_rounds_up_unless_drop_last() {
        assert_eq!(num_batches(10, 3, false), 4);
        assert_eq!(num_batches(10, 3, true), 3);
        assert_eq!(num_batches(9, 3, false), 3);
        assert_eq!(num_batches(2, 3, true), 0);
        assert_eq!(num_batches(0, 3, false), 0);
        assert_eq!(num_batches(5, 0, false), 0);
    }

    #[test]
    fn batch_ranges_keep_a_short_last_batch_unless_drop_last() {
        let keep: Vec<_> = batch_ranges(2, 9, 3, false).collect();
        assert_eq!(keep, vec![2..5, 5..8, 8..9]);
        let drop: Vec<_> = batch_ranges(2, 9, 3, true).collect();
        assert_eq!(drop, vec![2..5, 5..8]);
        assert_eq!(batch_ranges(9, 9, 3, false).len(), 0);
        let huge: Vec<_> = batch_ranges(0, 5, usize::MAX, false).collect();
        assert_eq!(huge, vec![0..5]);
    }

    #[test]
    fn iter_groups_the_sampler_indices() {
        let b = batches(7, 3, false);
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]
        );
        assert_eq!(b.len(), 3);
        let b = batches(7, 3, true);
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            vec![vec![0, 1, 2], vec![3, 4, 5]]
        );
    }

    #[test]
    fn iter_starts_at_the_sampler_position() {
        let mut b = batches(7, 3, false);
        b.sampler_mut().advance(3).unwrap();
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![vec![3, 4, 5], vec![6]]);
        assert_eq!(b.remaining(), 2);
        assert_eq!(b.len(), 3, "len counts the whole epoch");
    }

    #[test]
    fn zero_batch_size_is_rejected() {
        let sampler = DistributedSamplerConfig::new(1, 0).init(5).unwrap();
        assert_eq!(
            BatchSampler::new(sampler, 0, false).unwrap_err(),
            DataError::ZeroBatchSize
        );
    }

    #[test]
    fn batch_sampler_is_empty_when_drop_last_leaves_nothing() {
        assert!(batches(2, 3, true).is_empty());
        assert!(!batches(2, 3, false).is_empty());
    }
}
