//! The sampler itself: one rank's share of every epoch.

use std::fmt;
use std::sync::Arc;

use super::DistributedSamplerConfig;
use super::indices::{index_at_from, num_samples_from, rank_indices};
use super::permutation::epoch_order;
use super::state::{SamplerState, resume_point};
use crate::DataError;

/// Splits a dataset between `num_replicas` processes with the semantics of
/// PyTorch's `torch.utils.data.DistributedSampler`.
///
/// Every epoch:
///
/// 1. The order is the identity `0..len`, or with `shuffle` the permutation
///    for `seed + epoch` described in [`permutation`](super::permutation)
///    (ChaCha8 + Fisher–Yates, identical on every platform).
/// 2. Without `drop_last` the order is padded by repeating it from its start
///    until its length is a multiple of `num_replicas`; with `drop_last` it is
///    truncated to the largest such multiple.
/// 3. Rank `r` takes positions `r, r + num_replicas, r + 2 * num_replicas, ...`.
///
/// Each rank yields [`num_samples`](Self::num_samples) indices per epoch.
/// Call [`set_epoch`](Self::set_epoch) before each epoch, as in PyTorch. Without
/// it every [`iter`](Self::iter) repeats the same order, and once the caller
/// has [`advance`](Self::advance)d to the end of the epoch, `iter` yields
/// nothing until the next `set_epoch`.
///
/// The sampler also tracks a *position*: how many of this epoch's indices
/// the caller has consumed. [`iter`](Self::iter) starts there, the caller
/// moves it with [`advance`](Self::advance), and [`state`](Self::state) /
/// [`load_state`](Self::load_state) save and restore it. The
/// [`DistributedDataLoader`](crate::DistributedDataLoader) manages the
/// position itself.
///
/// After loading a [`SamplerState::resharded_for`] state saved on another
/// world size, the rest of that epoch is dealt out from the first entry of
/// the order not consumed yet (see [`offset`](Self::offset)); the next epoch
/// is PyTorch's layout again.
#[derive(Clone)]
pub struct DistributedSampler {
    config: DistributedSamplerConfig,
    dataset_len: usize,
    epoch: u64,
    position: usize,
    /// [`SamplerState::offset`] of the current epoch (0 unless resharded).
    offset: usize,
    order: Arc<[usize]>,
}

/// The constructor lives with what it builds: the config is plain settings and does not
/// depend on the sampler (burn's `Config::init` pattern).
impl DistributedSamplerConfig {
    /// Builds the sampler for a dataset of `dataset_len` items, at epoch 0.
    ///
    /// # Errors
    ///
    /// See [`validate`](DistributedSamplerConfig::validate).
    pub fn init(&self, dataset_len: usize) -> Result<DistributedSampler, DataError> {
        self.validate(dataset_len)?;
        Ok(DistributedSampler::from_valid_config(
            self.clone(),
            dataset_len,
        ))
    }
}

impl DistributedSampler {
    /// Builds the sampler; `config` must have passed
    /// [`DistributedSamplerConfig::validate`] for `dataset_len`.
    pub(crate) fn from_valid_config(config: DistributedSamplerConfig, dataset_len: usize) -> Self {
        let order = epoch_order(dataset_len, config.shuffle, config.seed, 0).into();
        let sampler = Self {
            config,
            dataset_len,
            epoch: 0,
            position: 0,
            offset: 0,
            order,
        };
        if sampler.num_samples() == 0 {
            tracing::warn!(
                dataset_len,
                num_replicas = sampler.num_replicas(),
                "drop_last with fewer items than ranks: every rank gets 0 samples per epoch"
            );
        }
        sampler
    }

    /// The configuration the sampler was built from.
    pub fn config(&self) -> &DistributedSamplerConfig {
        &self.config
    }

    /// World size.
    pub fn num_replicas(&self) -> usize {
        self.config.num_replicas
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.config.rank
    }

    /// Length of the dataset being sampled.
    pub fn dataset_len(&self) -> usize {
        self.dataset_len
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Indices of this epoch already consumed by this rank.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Entries of this epoch's order consumed by a previous world size before
    /// this sampler's layout starts: 0, except for the rest of an epoch
    /// restored from a [`SamplerState::resharded_for`] state.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Indices each rank yields per epoch (PyTorch's `num_samples`; for a
    /// resharded epoch, counted from the start of its layout, see
    /// [`offset`](Self::offset)).
    pub fn num_samples(&self) -> usize {
        num_samples_from(
            self.dataset_len,
            self.offset,
            self.num_replicas(),
            self.config.drop_last,
        )
    }

    /// Indices all ranks yield together per epoch: `num_samples * num_replicas`.
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas()
    }

    /// Indices of this epoch this rank has not consumed yet.
    pub fn remaining(&self) -> usize {
        self.num_samples() - self.position
    }

    /// Moves to `epoch`, recomputing the order. Moving to a different epoch
    /// resets the position to 0; setting the current epoch again keeps it
    /// (so a restored mid-epoch position survives the usual
    /// `set_epoch(epoch)` at the top of the training loop).
    pub fn set_epoch(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        self.epoch = epoch;
        self.position = 0;
        self.offset = 0;
        self.order = epoch_order(
            self.dataset_len,
            self.config.shuffle,
            self.config.seed,
            epoch,
        )
        .into();
        tracing::debug!(epoch, rank = self.rank(), "sampler moved to a new epoch");
    }

    /// This epoch's order of the whole dataset before padding and striding;
    /// the same on every rank.
    pub fn epoch_order(&self) -> &[usize] {
        &self.order
    }

    /// All of this rank's indices for the current epoch, regardless of the
    /// position (what iterating PyTorch's sampler yields). For a resharded
    /// epoch, the indices of its layout from position 0 (see
    /// [`offset`](Self::offset)).
    pub fn indices(&self) -> Vec<usize> {
        if self.offset == 0 {
            rank_indices(
                &self.order,
                self.num_replicas(),
                self.rank(),
                self.config.drop_last,
            )
        } else {
            (0..self.num_samples())
                .map(|p| self.index_unchecked(p))
                .collect()
        }
    }

    /// The dataset index at `position` in this rank's list for the current
    /// epoch, or `None` past the end.
    pub fn index_at(&self, position: usize) -> Option<usize> {
        (position < self.num_samples()).then(|| self.index_unchecked(position))
    }

    /// [`indices::index_at_from`](super::indices::index_at_from) for a valid
    /// sampler, whose order is never empty (`init` rejects empty datasets).
    fn index_unchecked(&self, position: usize) -> usize {
        index_at_from(
            &self.order,
            self.offset,
            self.num_replicas(),
            self.rank(),
            position,
        )
        .unwrap_or_default()
    }

    /// The indices from the current position to the end of the epoch. Does
    /// not move the position; call [`advance`](Self::advance) for what was
    /// consumed.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        (self.position..self.num_samples()).map(|p| self.index_unchecked(p))
    }

    /// Marks `count` more indices as consumed.
    ///
    /// # Errors
    ///
    /// [`DataError::PositionOutOfRange`] if that goes past the end of the epoch.
    pub fn advance(&mut self, count: usize) -> Result<(), DataError> {
        self.set_position(self.position.saturating_add(count))
    }

    /// Sets how many indices of the current epoch have been consumed.
    ///
    /// # Errors
    ///
    /// [`DataError::PositionOutOfRange`] if `position > num_samples`.
    pub fn set_position(&mut self, position: usize) -> Result<(), DataError> {
        let num_samples = self.num_samples();
        if position > num_samples {
            return Err(DataError::PositionOutOfRange {
                position,
                num_samples,
            });
        }
        self.position = position;
        Ok(())
    }

    /// The resumable state: epoch, position and the settings that fix the order.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            epoch: self.epoch,
            position: self.position,
            seed: self.config.seed,
            num_replicas: self.num_replicas(),
            dataset_len: self.dataset_len,
            shuffle: self.config.shuffle,
            drop_last: self.config.drop_last,
            offset: self.offset,
        }
    }

    /// Restores a state saved by [`state`](Self::state) (on any rank), so the
    /// next index is the first one not consumed when it was saved.
    ///
    /// **World size changes** are translated by global sample count: the
    /// saved ranks together consumed the first `position * saved_world`
    /// entries of the padded epoch order, and this sampler continues right
    /// after them at position `position * saved_world / num_replicas`. When
    /// that is not a whole number the restore is rejected, because no exact
    /// continuation exists; states at an epoch's start or end always load.
    /// Note that the padding at the end of the epoch is the new world size's.
    /// To continue on another world size where that is refused, load
    /// [`state.resharded_for(num_replicas)`](SamplerState::resharded_for)
    /// instead, which lists what is then guaranteed.
    ///
    /// # Errors
    ///
    /// [`DataError::StateMismatch`] if the dataset length, `drop_last`,
    /// `shuffle` or (when shuffling) `seed` differ;
    /// [`DataError::WorldSizeChange`] as above;
    /// [`DataError::PositionOutOfRange`] / [`DataError::ZeroReplicas`] /
    /// [`DataError::OffsetOutOfRange`] for a corrupt state. On error the
    /// sampler is unchanged.
    pub fn load_state(&mut self, state: &SamplerState) -> Result<(), DataError> {
        let point = resume_point(state, &self.state())?;
        let position = point.position;
        if state.num_replicas != self.num_replicas() {
            tracing::info!(
                saved_world = state.num_replicas,
                world = self.num_replicas(),
                saved_position = state.position,
                position,
                epoch = state.epoch,
                "translated sampler state to a new world size"
            );
        }
        if point.offset != 0 {
            tracing::info!(
                world = self.num_replicas(),
                offset = point.offset,
                position,
                epoch = state.epoch,
                "continuing a resharded epoch"
            );
        }
        self.set_epoch(state.epoch);
        self.position = position;
        self.offset = point.offset;
        Ok(())
    }
}

impl fmt::Debug for DistributedSampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedSampler")
            .field("config", &self.config)
            .field("dataset_len", &self.dataset_len)
            .field("epoch", &self.epoch)
            .field("position", &self.position)
            .field("offset", &self.offset)
            .field("num_samples", &self.num_samples())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(len: usize, n: usize, rank: usize) -> DistributedSampler {
        DistributedSamplerConfig::new(n, rank).init(len).unwrap()
    }

    #[test]
    fn iter_starts_at_position_and_advance_moves_it() {
        let mut s = sampler(20, 2, 1);
        let all = s.indices();
        s.advance(4).unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), all[4..]);
        assert_eq!(s.remaining(), 6);
    }

    #[test]
    fn advance_past_epoch_end_is_an_error_and_keeps_position() {
        let mut s = sampler(20, 2, 0);
        s.advance(8).unwrap();
        assert_eq!(
            s.advance(3),
            Err(DataError::PositionOutOfRange {
                position: 11,
                num_samples: 10
            })
        );
        assert_eq!(s.position(), 8);
    }

    #[test]
    fn set_epoch_resets_position_only_for_a_new_epoch() {
        let mut s = sampler(20, 2, 0);
        s.advance(3).unwrap();
        s.set_epoch(0);
        assert_eq!(s.position(), 3);
        s.set_epoch(1);
        assert_eq!((s.epoch(), s.position()), (1, 0));
    }

    #[test]
    fn index_at_is_none_past_epoch_end() {
        let s = sampler(10, 3, 2);
        assert_eq!(s.index_at(3), Some(s.indices()[3]));
        assert_eq!(s.index_at(4), None);
    }

    #[test]
    fn load_state_restores_epoch_order_and_position() {
        let mut a = sampler(50, 4, 3);
        a.set_epoch(5);
        a.advance(7).unwrap();
        let mut b = sampler(50, 4, 3);
        b.load_state(&a.state()).unwrap();
        assert_eq!(b.iter().collect::<Vec<_>>(), a.iter().collect::<Vec<_>>());
        assert_eq!(b.state(), a.state());
    }

    #[test]
    fn failed_load_state_leaves_sampler_unchanged() {
        let mut s = sampler(50, 4, 3);
        let before = s.state();
        let mut bad = before.clone();
        bad.dataset_len = 51;
        bad.epoch = 9;
        assert!(s.load_state(&bad).is_err());
        assert_eq!(s.state(), before);
    }

    #[test]
    fn debug_output_omits_the_order() {
        let text = format!("{:?}", sampler(1000, 1, 0));
        assert!(
            text.contains("num_samples: 1000") && text.len() < 400,
            "{text}"
        );
    }
}
