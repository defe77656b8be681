//! Evaluation metrics summed over ranks: each rank scores its shard of the test set
//! ([`ExactShard`](crate::data::ExactShard): every sample on exactly one rank), then one all-reduce
//! adds the per-rank sums, so the accuracy and mean loss are those of the whole set, the same
//! on every rank.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ddp_core::{data::ExactShard, init_from_env, metrics::EvalTotals};
//! let pg = init_from_env()?;
//! let test_len = 360;
//! let shard = ExactShard::new(test_len, pg.world_size(), pg.rank()).expect("valid rank");
//! let mut totals = EvalTotals::default();
//! for _index in shard.indices() {
//!     // score the sample: correct or not, and its loss
//!     totals.add(1, 1, 0.25);
//! }
//! let global = totals.all_reduce(&pg)?;
//! assert_eq!(global.count, test_len as u64); // every test sample counted once
//! println!("accuracy {:?}, mean loss {:?}", global.accuracy(), global.mean_loss());
//! # Ok(()) }
//! ```

use ddp_comm::{CommError, ProcessGroup, ReduceOp};

/// Sums of an evaluation: how many samples were scored, how many were right, and their total
/// loss. Add batches with [`add`](Self::add), then [`all_reduce`](Self::all_reduce) once.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EvalTotals {
    /// Correct predictions.
    pub correct: u64,
    /// Samples scored.
    pub count: u64,
    /// Sum of the per-sample losses (not their mean: means of shards of different sizes do not
    /// average to the global mean).
    pub loss_sum: f64,
}

impl EvalTotals {
    /// Adds a batch: `correct` right out of `count`, with per-sample losses summing to
    /// `loss_sum` (for a batch-mean loss, pass `mean * count`).
    pub fn add(&mut self, correct: u64, count: u64, loss_sum: f64) {
        self.correct += correct;
        self.count += count;
        self.loss_sum += loss_sum;
    }

    /// The totals over every rank of `pg`, the same on every rank: one all-reduce (sum) of the
    /// three numbers as f64, exact for counts below 2^53.
    ///
    /// # Collective
    /// Every rank of `pg` calls it, in the same order as its other collectives.
    ///
    /// # Errors
    /// The all-reduce's error (a peer failed, stalled, or called a different collective).
    pub fn all_reduce(&self, pg: &ProcessGroup) -> Result<EvalTotals, CommError> {
        let mut sums = [self.correct as f64, self.count as f64, self.loss_sum];
        all_reduce_sums(pg, &mut sums)?;
        Ok(EvalTotals {
            correct: sums[0] as u64,
            count: sums[1] as u64,
            loss_sum: sums[2],
        })
    }

    /// `correct / count`, or `None` when nothing was scored.
    pub fn accuracy(&self) -> Option<f64> {
        (self.count > 0).then(|| self.correct as f64 / self.count as f64)
    }

    /// `loss_sum / count`, or `None` when nothing was scored.
    pub fn mean_loss(&self) -> Option<f64> {
        (self.count > 0).then(|| self.loss_sum / self.count as f64)
    }
}

/// Sums `values` element-wise over the ranks of `pg`, in place (any metric made of sums:
/// per-class counts, confusion matrices). Every rank passes the same number of values.
///
/// # Errors
/// The all-reduce's error; a length that differs between ranks is reported as a mismatch.
pub fn all_reduce_sums(pg: &ProcessGroup, values: &mut [f64]) -> Result<(), CommError> {
    pg.all_reduce(values, ReduceOp::Sum)
}

/// The mean of `value` over the ranks of `pg`, weighting each rank by `weight` (its number of
/// samples): `sum(value * weight) / sum(weight)`, or `None` when the weights sum to zero.
///
/// # Errors
/// The all-reduce's error.
pub fn all_reduce_weighted_mean(
    pg: &ProcessGroup,
    value: f64,
    weight: f64,
) -> Result<Option<f64>, CommError> {
    let mut sums = [value * weight, weight];
    all_reduce_sums(pg, &mut sums)?;
    Ok((sums[1] != 0.0).then(|| sums[0] / sums[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up_and_divide() {
        let mut t = EvalTotals::default();
        assert_eq!(t.accuracy(), None);
        t.add(3, 4, 2.0);
        t.add(1, 4, 6.0);
        assert_eq!(t.accuracy(), Some(0.5));
        assert_eq!(t.mean_loss(), Some(1.0));
    }
}
