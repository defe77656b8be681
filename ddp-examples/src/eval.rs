//! Accuracy over a test set sharded across ranks: each rank scores every `world`-th item (no
//! padding, so nothing is counted twice) and the counts are all-reduced.

use anyhow::Result;
use ddp_core::{ProcessGroup, ReduceOp};

/// Items `rank, rank + world, ...` of `0..len`.
pub fn shard(len: usize, rank: usize, world: usize) -> Vec<usize> {
    (rank..len).step_by(world.max(1)).collect()
}

/// Sums `(correct, total)` over ranks and returns the accuracy, the same on every rank.
pub fn all_reduce_accuracy(
    pg: &ProcessGroup,
    correct: usize,
    total: usize,
) -> Result<(f64, usize)> {
    let mut v = [correct as i64, total as i64];
    pg.all_reduce(&mut v, ReduceOp::Sum)?;
    Ok((v[0] as f64 / v[1].max(1) as f64, v[1] as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_item_once() {
        let mut all: Vec<usize> = (0..3).flat_map(|r| shard(10, r, 3)).collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
