//! Evaluation over a test set sharded across ranks without padding: each rank scores its
//! [`ExactShard`] (every item on exactly one rank) and the counts are all-reduced with
//! [`EvalTotals`], so the accuracy is over exactly the test set.

use anyhow::{Context, Result};
use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use ddp_core::{comm::ProcessGroup, data::ExactShard, metrics::EvalTotals};
use std::time::{Duration, Instant};

use crate::digits::{DigitBatcher, DigitItem};

/// Items `rank, rank + world, ...` of `0..len` (this rank's [`ExactShard`]).
pub fn shard(len: usize, rank: usize, world: usize) -> Vec<usize> {
    match ExactShard::new(len, world, rank) {
        Ok(shard) => shard.indices().collect(),
        Err(_) => Vec::new(),
    }
}

/// Sums `(correct, total)` over ranks and returns the accuracy and the total, the same on every
/// rank.
pub fn all_reduce_accuracy(
    pg: &ProcessGroup,
    correct: usize,
    total: usize,
) -> Result<(f64, usize)> {
    let mut totals = EvalTotals::default();
    totals.add(correct as u64, total as u64, 0.0);
    let global = totals.all_reduce(pg)?;
    Ok((global.accuracy().unwrap_or(0.0), global.count as usize))
}

/// Scores `classify` (images `[n, 64]` to logits `[n, 10]`) on this rank's shard of `test`, in
/// batches of `batch_size`, and returns the totals over every rank: correct predictions, images
/// counted (exactly `test.len()`) and the summed cross-entropy.
pub fn evaluate_digits<B: Backend>(
    pg: &ProcessGroup,
    test: &[DigitItem],
    batch_size: usize,
    device: &B::Device,
    classify: impl Fn(Tensor<B, 2>) -> Tensor<B, 2>,
) -> Result<EvalTotals> {
    let shard =
        ExactShard::new(test.len(), pg.world_size(), pg.rank()).context("sharding the test set")?;
    let indices: Vec<usize> = shard.indices().collect();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut totals = EvalTotals::default();
    for chunk in indices.chunks(batch_size.max(1)) {
        let items = chunk.iter().map(|&i| test[i].clone()).collect();
        let batch = Batcher::<B, _, _>::batch(&DigitBatcher, items, device);
        let logits = classify(batch.images);
        let mean_loss: f64 = loss_fn
            .forward(logits.clone(), batch.targets.clone())
            .into_scalar()
            .elem();
        let hits: i64 = logits
            .argmax(1)
            .squeeze::<1>()
            .equal(batch.targets)
            .int()
            .sum()
            .into_scalar()
            .elem();
        let n = chunk.len() as u64;
        totals.add(hits as u64, n, mean_loss * n as f64);
    }
    Ok(totals.all_reduce(pg)?)
}

/// Scores `classify` on the test set like [`evaluate_digits`] (batches of 256) and, on rank 0,
/// prints `{name}: ` and the [`test_report`] (the training time counted from `start`).
///
/// # Collective
/// Every rank calls it.
///
/// # Errors
/// [`evaluate_digits`]'s.
pub fn report_digits<B: Backend>(
    name: &str,
    pg: &ProcessGroup,
    test: &[DigitItem],
    device: &B::Device,
    epochs: usize,
    start: Instant,
    classify: impl Fn(Tensor<B, 2>) -> Tensor<B, 2>,
) -> Result<()> {
    let totals = evaluate_digits::<B>(pg, test, 256, device, classify)?;
    if pg.rank() == 0 {
        let report = test_report(
            &totals,
            test.len(),
            epochs,
            start.elapsed(),
            pg.world_size(),
        );
        println!("{name}: {report}");
    }
    Ok(())
}

/// Rank 0's line on the test set for the digits examples (after the program's name): the
/// accuracy and mean loss of `totals` over `test_images` images, after `epochs` epochs and
/// `training` of training on `world` ranks.
pub fn test_report(
    totals: &EvalTotals,
    test_images: usize,
    epochs: usize,
    training: Duration,
    world: usize,
) -> String {
    format!(
        "test accuracy {:.2}% on {} images (each counted once, {test_images} test images), mean loss {:.4}, after {epochs} epochs ({:.1}s of training on {world} rank(s))",
        totals.accuracy().unwrap_or(0.0) * 100.0,
        totals.count,
        totals.mean_loss().unwrap_or(f64::NAN),
        training.as_secs_f64()
    )
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
