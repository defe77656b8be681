//! The resumable state of a sampler (and of the loader built on it).
//!
//! # Resuming on another world size
//!
//! The epoch's order (the permutation of `seed + epoch`, or the identity) does
//! not depend on the world size, and ranks consume it in lockstep, so a state
//! saved mid-epoch means: the first [`global_consumed`](SamplerState::global_consumed)
//! entries `G` of the order have been consumed, by all ranks together. (They
//! are distinct samples: a rank only reaches padding in its last sample of the
//! epoch.) There are two ways to continue on `M` ranks:
//!
//! * [`DistributedSampler::load_state`](crate::DistributedSampler::load_state)
//!   translates exactly or refuses: if `G` is a multiple of `M` the ranks
//!   continue at position `G / M` of PyTorch's layout for `M` ranks, otherwise
//!   the state is rejected with [`DataError::WorldSizeChange`].
//! * [`SamplerState::resharded_for`]`(M)` always gives a state for `M` ranks
//!   that continues with exactly the entries `G..` of the order, dealt
//!   round-robin: rank `r`'s `k`-th next sample is `order[(G + r + k * M) % len]`,
//!   `ceil((len - G) / M)` samples per rank (`floor` with `drop_last`). The
//!   guarantees are listed on that method. When `G` is a multiple of `M` it is
//!   the same continuation as the exact translation.
//!
//! A resharded state records `G mod M` as its [`offset`](SamplerState::offset)
//! (0 otherwise, and then it serializes exactly as before the field existed);
//! from the next epoch on the sampler is a plain world-`M` sampler again.

use serde::{Deserialize, Serialize};

use super::indices::num_samples_from;
use crate::DataError;

/// Where a sampler is in its run: the epoch and how many of this rank's
/// samples of that epoch have been consumed, plus the settings that fix the
/// order, so a mismatched restore is caught instead of silently reshuffling.
///
/// The state does not contain the rank: all ranks consume their (equally
/// long) index lists in lockstep, so rank 0's state can be saved once and
/// loaded by every rank.
///
/// Serialize it with any serde format (e.g. JSON) next to the model
/// checkpoint. To continue a mid-epoch state on a different world size, see
/// [`resharded_for`](Self::resharded_for).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SamplerState {
    /// The epoch the position refers to.
    pub epoch: u64,
    /// Samples of `epoch` this rank has consumed (`0..=num_samples`).
    pub position: usize,
    /// Base seed of the shuffle.
    pub seed: u64,
    /// World size the state was saved with.
    pub num_replicas: usize,
    /// Dataset length the state was saved with.
    pub dataset_len: usize,
    /// Whether the order was shuffled.
    pub shuffle: bool,
    /// Whether the tail was dropped instead of padded.
    pub drop_last: bool,
    /// Entries of the epoch order consumed by an earlier world size before
    /// this world size's ranks started dealing it out (always
    /// `< num_replicas`). Only [`resharded_for`](Self::resharded_for) makes
    /// it nonzero (and so does loading the end of an epoch on a world size
    /// with no samples per rank, see there), and [`set_epoch`](crate::DistributedSampler::set_epoch) to
    /// a new epoch resets it. Absent in states saved before it existed,
    /// which therefore load unchanged (as 0). Always written: formats without
    /// field names (bincode, MessagePack as arrays) cannot tell a skipped
    /// field from the next value.
    #[serde(default)]
    pub offset: usize,
}

impl SamplerState {
    /// Samples per rank in `epoch` under the saved settings (counting from
    /// the start of this world size's layout, see [`offset`](Self::offset)).
    pub fn num_samples(&self) -> usize {
        num_samples_from(
            self.dataset_len,
            self.offset,
            self.num_replicas,
            self.drop_last,
        )
    }

    /// Samples consumed in `epoch` by all ranks together:
    /// `offset + position * num_replicas` (saturating). Before the end of the
    /// epoch these are exactly the first `global_consumed()` entries of the
    /// epoch order.
    pub fn global_consumed(&self) -> usize {
        self.offset
            .saturating_add(self.position.saturating_mul(self.num_replicas))
    }

    /// Whether every sample of `epoch` has been consumed.
    pub fn is_epoch_complete(&self) -> bool {
        self.position >= self.num_samples()
    }

    /// This state, re-expressed for `num_replicas` ranks so that they
    /// continue the epoch with exactly the samples not consumed yet, even
    /// where [`load_state`](crate::DistributedSampler::load_state) would
    /// refuse the world-size change. Load the result on every new rank (it
    /// does not depend on the rank).
    ///
    /// With `G = global_consumed()` and `M = num_replicas`, and `order` the
    /// epoch's order (the shuffle of `seed + epoch`, the same for every world
    /// size; it is not reshuffled at the switch):
    ///
    /// * **Seen before the switch**: `order[..G]`, each once.
    /// * **Seen after the switch**: rank `r`'s `k`-th next sample is
    ///   `order[(G + r + k * M) % len]`; every rank gets the same number,
    ///   `ceil((len - G) / M)`, or `floor((len - G) / M)` with `drop_last`.
    /// * **Without `drop_last`**: every sample of the epoch is seen, and
    ///   exactly once except the padding: `ceil((len - G) / M) * M - (len - G)`
    ///   (at most `M - 1`) extra entries repeating the order from its start,
    ///   `order[0], order[1], ...`, as PyTorch pads.
    /// * **With `drop_last`**: no sample is seen twice; the last
    ///   `(len - G) % M` (at most `M - 1`) entries of the order are skipped
    ///   this epoch, as PyTorch drops the tail. The tail is the new world
    ///   size's: a sample the old world size would have dropped may be seen.
    /// * **A complete epoch** (`is_epoch_complete`, something consumed) stays
    ///   complete: the state is the end of that epoch for `M` ranks. (Where
    ///   `M` ranks have no samples, its offset is `dataset_len`, so that a
    ///   later reshard still reads it as the end, not as the start.)
    /// * **An epoch start** (nothing consumed: `global_consumed() == 0`) stays
    ///   the start, also when it counts as complete because the saved world
    ///   size had no samples per rank (`drop_last` with a dataset smaller than
    ///   that world): the `M` ranks then see their whole epoch.
    /// * **The next epoch** (`set_epoch(epoch + 1)`) is exactly that of a
    ///   fresh `M`-rank sampler.
    /// * **Same result as the exact translation** when `G` is a multiple of
    ///   `M` (then [`offset`](Self::offset) is 0 and the state is the one
    ///   `load_state` would produce); for `M == num_replicas` the state is
    ///   returned unchanged.
    ///
    /// The result may be resharded again (e.g. after saving it at `M` ranks
    /// mid-epoch); the guarantees compose, counting from the epoch start.
    ///
    /// ```
    /// use ddp_data::{DataError, DistributedSamplerConfig};
    ///
    /// // 3 ranks consumed 3 samples each of a 10-sample epoch: 9 of them.
    /// let mut old = DistributedSamplerConfig::new(3, 0).with_seed(1).init(10)?;
    /// old.advance(3)?;
    /// let saved = old.state();
    ///
    /// // 9 is odd, so 2 ranks cannot continue by position alone ...
    /// let mut new = DistributedSamplerConfig::new(2, 1).with_seed(1).init(10)?;
    /// assert!(matches!(new.load_state(&saved), Err(DataError::WorldSizeChange { .. })));
    /// // ... but they can continue with the one unseen sample, order[9]; rank 1
    /// // gets the padding, order[0] (seen before the switch).
    /// new.load_state(&saved.resharded_for(2)?)?;
    /// let order = new.epoch_order().to_vec();
    /// assert_eq!(new.iter().collect::<Vec<_>>(), [order[0]]);
    /// # Ok::<(), DataError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`DataError::ZeroReplicas`] if `num_replicas` (or the saved world
    /// size) is 0; [`DataError::PositionOutOfRange`] or
    /// [`DataError::OffsetOutOfRange`] for a corrupt state. Settings that
    /// differ from the sampler's are caught when the result is loaded.
    pub fn resharded_for(&self, num_replicas: usize) -> Result<SamplerState, DataError> {
        if num_replicas == 0 {
            return Err(DataError::ZeroReplicas);
        }
        validate(self)?;
        if num_replicas == self.num_replicas {
            return Ok(self.clone());
        }
        let mut resharded = SamplerState {
            num_replicas,
            offset: 0,
            position: 0,
            ..self.clone()
        };
        // Nothing consumed is the start of the epoch, even where the saved
        // world size had 0 samples per rank (`drop_last`, `dataset_len <
        // num_replicas`), which makes position 0 the end as well: the new
        // world size may have samples, and none of them was seen.
        if self.is_epoch_complete() && self.global_consumed() > 0 {
            resharded.position = resharded.num_samples();
            if resharded.position == 0 && self.dataset_len < num_replicas {
                // No samples per rank for `M` either: position 0 alone would read
                // as the start. Recording the whole order as consumed before the
                // switch (an offset of `dataset_len`, below `M` here) keeps it the
                // end, for a later `resharded_for` too.
                resharded.offset = self.dataset_len;
            }
        } else {
            // `G < dataset_len` here (see `validate`; or `G == 0`), so the new
            // ranks start inside the order (or at its start): global position
            // `G` is rank 0's position `G / M` of a layout shifted by `G % M`.
            let global = self.global_consumed();
            resharded.offset = global % num_replicas;
            resharded.position = global / num_replicas;
        }
        Ok(resharded)
    }
}

/// Checks that `state` is internally consistent: a nonzero world size, an
/// offset below it and a position inside the epoch. Then an incomplete
/// state's `global_consumed()` is below `dataset_len`.
fn validate(state: &SamplerState) -> Result<(), DataError> {
    if state.num_replicas == 0 {
        return Err(DataError::ZeroReplicas);
    }
    if state.offset >= state.num_replicas {
        return Err(DataError::OffsetOutOfRange {
            offset: state.offset,
            num_replicas: state.num_replicas,
        });
    }
    let num_samples = state.num_samples();
    if state.position > num_samples {
        return Err(DataError::PositionOutOfRange {
            position: state.position,
            num_samples,
        });
    }
    Ok(())
}

/// Where a restored sampler continues: the [`SamplerState::offset`] of its
/// layout and its position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResumePoint {
    pub(crate) offset: usize,
    pub(crate) position: usize,
}

/// Checks `saved` against the settings of `current` (whose `epoch`,
/// `position` and `offset` are ignored) and returns the position to continue
/// from under `current.num_replicas`.
///
/// * Different `dataset_len`, `drop_last`, `shuffle`, or `seed` (when
///   shuffling) is rejected with [`DataError::StateMismatch`].
/// * The same world size continues at the saved position.
/// * A different world size is translated by global sample count: the old
///   ranks together consumed the first `G = global_consumed()` entries of
///   the epoch order, so the new ranks continue at `G / new_world`. That is
///   exact only if `G` is a multiple of the new world size; otherwise the
///   state is rejected with [`DataError::WorldSizeChange`] (use
///   [`SamplerState::resharded_for`] to continue anyway). A state at the
///   start or the end of an epoch always translates (to the start or end; a
///   state with nothing consumed is the start, even when the saved world size
///   had no samples per rank).
#[cfg(test)]
pub(crate) fn resume_position(
    saved: &SamplerState,
    current: &SamplerState,
) -> Result<usize, DataError> {
    resume_point(saved, current).map(|point| point.position)
}

/// `resume_position` with the offset of the layout to continue in (nonzero
/// only for a resharded state loaded on the world size it was resharded for).
pub(crate) fn resume_point(
    saved: &SamplerState,
    current: &SamplerState,
) -> Result<ResumePoint, DataError> {
    check_same("dataset_len", saved.dataset_len, current.dataset_len)?;
    check_same("drop_last", saved.drop_last, current.drop_last)?;
    check_same("shuffle", saved.shuffle, current.shuffle)?;
    if current.shuffle {
        check_same("seed", saved.seed, current.seed)?;
    }
    validate(saved)?;
    if saved.num_replicas == current.num_replicas {
        return Ok(ResumePoint {
            offset: saved.offset,
            position: saved.position,
        });
    }
    let translated = saved.resharded_for(current.num_replicas)?;
    // The end of an epoch always translates; its offset is nonzero only where the new world
    // size has no samples per rank (see `resharded_for`).
    let at_end = saved.is_epoch_complete() && saved.global_consumed() > 0;
    if translated.offset != 0 && !at_end {
        return Err(DataError::WorldSizeChange {
            saved: saved.num_replicas,
            current: current.num_replicas,
            epoch: saved.epoch,
            global_consumed: saved.global_consumed(),
        });
    }
    Ok(ResumePoint {
        offset: translated.offset,
        position: translated.position,
    })
}

fn check_same<T: PartialEq + ToString>(
    field: &'static str,
    saved: T,
    current: T,
) -> Result<(), DataError> {
    if saved == current {
        Ok(())
    } else {
        Err(DataError::StateMismatch {
            field,
            saved: saved.to_string(),
            current: current.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(num_replicas: usize, position: usize) -> SamplerState {
        SamplerState {
            epoch: 2,
            position,
            seed: 7,
            num_replicas,
            dataset_len: 100,
            shuffle: true,
            drop_last: false,
            offset: 0,
        }
    }

    #[test]
    fn same_world_size_keeps_position() {
        assert_eq!(resume_position(&state(4, 13), &state(4, 0)), Ok(13));
    }

    #[test]
    fn world_size_change_translates_by_global_sample_count() {
        // 4 ranks x 6 samples = 24 global; 24 / 2 = 12, 24 / 3 = 8.
        assert_eq!(resume_position(&state(4, 6), &state(2, 0)), Ok(12));
        assert_eq!(resume_position(&state(4, 6), &state(3, 0)), Ok(8));
    }

    #[test]
    fn world_size_change_rejects_uneven_global_count() {
        // 3 ranks x 5 samples = 15 global, not a multiple of 2.
        let err = resume_position(&state(3, 5), &state(2, 0)).unwrap_err();
        assert_eq!(
            err,
            DataError::WorldSizeChange {
                saved: 3,
                current: 2,
                epoch: 2,
                global_consumed: 15
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("world size 3") && msg.contains("world size 2"),
            "{msg}"
        );
    }

    #[test]
    fn world_size_change_uses_the_new_world_padding() {
        // len 100 on 7 ranks: 15 per rank (105 total, 5 padded). 14 each =
        // 98 global; on 14 ranks (8 per rank, 112 total) that is position 7.
        assert_eq!(resume_position(&state(7, 14), &state(14, 0)), Ok(7));
    }

    #[test]
    fn epoch_boundaries_always_translate() {
        assert_eq!(resume_position(&state(3, 0), &state(8, 0)), Ok(0));
        // end of epoch: 34 per rank on 3 ranks; 13 per rank on 8 ranks.
        assert_eq!(resume_position(&state(3, 34), &state(8, 0)), Ok(13));
    }

    #[test]
    fn mismatched_settings_are_rejected_by_name() {
        let mut other = state(4, 0);
        other.dataset_len = 99;
        let err = resume_position(&state(4, 1), &other).unwrap_err();
        assert!(matches!(
            err,
            DataError::StateMismatch {
                field: "dataset_len",
                ..
            }
        ));
        assert!(err.to_string().contains("dataset_len = 100"), "{err}");

        let mut other = state(4, 0);
        other.seed = 8;
        assert!(matches!(
            resume_position(&state(4, 1), &other),
            Err(DataError::StateMismatch { field: "seed", .. })
        ));
        let mut other = state(4, 0);
        other.drop_last = true;
        assert!(matches!(
            resume_position(&state(4, 1), &other),
            Err(DataError::StateMismatch {
                field: "drop_last",
                ..
            })
        ));
    }

    #[test]
    fn seed_is_irrelevant_without_shuffle() {
        let mut saved = state(4, 3);
        saved.shuffle = false;
        let mut current = saved.clone();
        current.seed = 1234;
        assert_eq!(resume_position(&saved, &current), Ok(3));
    }

    #[test]
    fn position_past_epoch_end_is_rejected() {
        assert_eq!(
            resume_position(&state(4, 26), &state(4, 0)),
            Err(DataError::PositionOutOfRange {
                position: 26,
                num_samples: 25
            })
        );
    }

    #[test]
    fn zero_world_size_in_saved_state_is_rejected() {
        assert_eq!(
            resume_position(&state(0, 0), &state(4, 0)),
            Err(DataError::ZeroReplicas)
        );
    }
}
