//! The resumable state of a sampler (and of the loader built on it).

use serde::{Deserialize, Serialize};

use super::indices::num_samples_per_rank;
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
/// checkpoint.
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
}

impl SamplerState {
    /// Samples per rank and epoch under the saved settings.
    pub fn num_samples(&self) -> usize {
        if self.num_replicas == 0 {
            return 0;
        }
        num_samples_per_rank(self.dataset_len, self.num_replicas, self.drop_last)
    }

    /// Samples consumed in `epoch` by all ranks together:
    /// `position * num_replicas` (saturating).
    pub fn global_consumed(&self) -> usize {
        self.position.saturating_mul(self.num_replicas)
    }

    /// Whether every sample of `epoch` has been consumed.
    pub fn is_epoch_complete(&self) -> bool {
        self.position >= self.num_samples()
    }
}

/// Checks `saved` against the settings of `current` (whose `epoch` and
/// `position` are ignored) and returns the position to continue from under
/// `current.num_replicas`.
///
/// * Different `dataset_len`, `drop_last`, `shuffle`, or `seed` (when
///   shuffling) is rejected with [`DataError::StateMismatch`].
/// * The same world size continues at the saved position.
/// * A different world size is translated by global sample count: the old
///   ranks together consumed the first `G = position * old_world` entries of
///   the padded epoch order, so the new ranks continue at
///   `G / new_world`. That is exact only if `G` is a multiple of the new world
///   size and within the new epoch; otherwise the state is rejected with
///   [`DataError::WorldSizeChange`]. A state at the start or the end of an
///   epoch always translates (to the start or end).
pub fn resume_position(saved: &SamplerState, current: &SamplerState) -> Result<usize, DataError> {
    check_same("dataset_len", saved.dataset_len, current.dataset_len)?;
    check_same("drop_last", saved.drop_last, current.drop_last)?;
    check_same("shuffle", saved.shuffle, current.shuffle)?;
    if current.shuffle {
        check_same("seed", saved.seed, current.seed)?;
    }
    if saved.num_replicas == 0 {
        return Err(DataError::ZeroReplicas);
    }
    let old_samples = saved.num_samples();
    if saved.position > old_samples {
        return Err(DataError::PositionOutOfRange {
            position: saved.position,
            num_samples: old_samples,
        });
    }
    if saved.num_replicas == current.num_replicas {
        return Ok(saved.position);
    }

    let new_world = current.num_replicas;
    let new_samples = current.num_samples();
    if saved.position == 0 {
        return Ok(0);
    }
    if saved.position == old_samples {
        return Ok(new_samples);
    }
    let global = saved.global_consumed();
    if global.is_multiple_of(new_world) && global / new_world <= new_samples {
        Ok(global / new_world)
    } else {
        Err(DataError::WorldSizeChange {
            saved: saved.num_replicas,
            current: new_world,
            epoch: saved.epoch,
            global_consumed: global,
        })
    }
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
