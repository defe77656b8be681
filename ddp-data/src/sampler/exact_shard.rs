//! [`ExactShard`]: each index of a dataset on exactly one rank, for evaluation.
//!
//! [`DistributedSampler`](crate::DistributedSampler) pads the last shard with repeated indices
//! so that every rank runs the same number of training steps; averaged over ranks, a metric on
//! that padded set counts some samples twice (pytorch/pytorch#25162). Evaluation does not need
//! equal shards: it needs every sample once. `ExactShard` gives rank `r` of `n` the indices
//! `r, r + n, r + 2n, ...` below the dataset's length, in order: no padding, no duplicates,
//! shard sizes that differ by at most one. Sum per-rank counts with an all-reduce afterwards
//! (ddp-core's `EvalTotals`).

use crate::DataError;

/// Rank `rank`'s share of `0..dataset_len` when each index goes to exactly one rank.
///
/// ```
/// use ddp_data::ExactShard;
///
/// let shard = ExactShard::new(10, 3, 1)?;
/// assert_eq!(shard.indices().collect::<Vec<_>>(), vec![1, 4, 7]);
/// assert_eq!(shard.len(), 3);
/// # Ok::<(), ddp_data::DataError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactShard {
    dataset_len: usize,
    num_replicas: usize,
    rank: usize,
}

impl ExactShard {
    /// The shard of `rank` out of `num_replicas` over a dataset of `dataset_len` items. An empty
    /// dataset is allowed (every shard is empty), as is a world larger than the dataset (the
    /// last ranks get nothing).
    ///
    /// # Errors
    ///
    /// [`DataError::ZeroReplicas`] or [`DataError::RankOutOfRange`].
    pub fn new(dataset_len: usize, num_replicas: usize, rank: usize) -> Result<Self, DataError> {
        if num_replicas == 0 {
            return Err(DataError::ZeroReplicas);
        }
        if rank >= num_replicas {
            return Err(DataError::RankOutOfRange { rank, num_replicas });
        }
        Ok(ExactShard {
            dataset_len,
            num_replicas,
            rank,
        })
    }

    /// The dataset indices of this shard, ascending.
    pub fn indices(&self) -> std::iter::StepBy<std::ops::Range<usize>> {
        (self.rank.min(self.dataset_len)..self.dataset_len).step_by(self.num_replicas)
    }

    /// How many indices this shard has: `ceil((len - rank) / n)`, so shards differ by at most
    /// one.
    pub fn len(&self) -> usize {
        self.dataset_len
            .saturating_sub(self.rank)
            .div_ceil(self.num_replicas)
    }

    /// Whether this shard has no index (a dataset smaller than the world).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dataset length all shards together cover.
    pub fn dataset_len(&self) -> usize {
        self.dataset_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_is_on_exactly_one_rank() {
        for world in 1..=4 {
            for len in 0..=23 {
                let mut seen = vec![0usize; len];
                let mut sizes = Vec::new();
                for rank in 0..world {
                    let shard = ExactShard::new(len, world, rank).unwrap();
                    let indices: Vec<usize> = shard.indices().collect();
                    assert_eq!(indices.len(), shard.len(), "len {len} world {world}");
                    sizes.push(shard.len());
                    for i in indices {
                        seen[i] += 1;
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "len {len} world {world}: counts {seen:?}"
                );
                let (min, max) = (sizes.iter().min(), sizes.iter().max());
                assert!(max.unwrap() - min.unwrap() <= 1, "sizes {sizes:?}");
            }
        }
    }

    #[test]
    fn bad_world_or_rank_is_an_error() {
        assert_eq!(ExactShard::new(5, 0, 0), Err(DataError::ZeroReplicas));
        assert_eq!(
            ExactShard::new(5, 2, 2),
            Err(DataError::RankOutOfRange {
                rank: 2,
                num_replicas: 2
            })
        );
    }

    #[test]
    fn world_larger_than_dataset_leaves_last_ranks_empty() {
        let shard = ExactShard::new(2, 4, 3).unwrap();
        assert!(shard.is_empty());
        assert_eq!(shard.indices().count(), 0);
    }
}
