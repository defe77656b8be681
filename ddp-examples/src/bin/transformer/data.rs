//! The data the transformer trains and is evaluated on, and its loss: shared by the DDP loop
//! (`main.rs`) and the fully sharded one (`fsdp.rs`).

use crate::args::Args;
use anyhow::{Context, Result};
use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{ElementConversion, Int, Tensor};
use ddp_core::TapBackend;
use ddp_core::comm::ProcessGroup;
use ddp_core::data::{
    DistributedDataLoader, DistributedDataLoaderBuilder, DistributedSamplerConfig,
};
use ddp_examples::eval::{all_reduce_accuracy, shard};
use ddp_examples::models::TinyGpt;
use ddp_examples::reverse::{
    ReverseBatch, ReverseBatcher, ReverseDataset, VOCAB, scored_positions, sequence,
};
use std::time::Duration;

/// This rank's shard of the training sequences, reshuffled per epoch.
pub(crate) fn train_loader<B: TapBackend>(
    args: &Args,
    rank: usize,
    world: usize,
    device: &B::Device,
) -> Result<DistributedDataLoader<B, Vec<i64>, ReverseBatch<B>>> {
    let train_set = ReverseDataset {
        seed: args.seed,
        digits: args.seq_len,
        offset: 0,
        count: args.train_size,
    };
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(args.seed);
    DistributedDataLoaderBuilder::new(ReverseBatcher)
        .batch_size(args.batch_size)
        .set_device(device.clone())
        .build(train_set, sampler)
        .context("building the data loader")
}

/// The cross-entropy of the reversed half of each sequence (the scored positions).
pub(crate) fn scored_loss<B: TapBackend>(
    loss_fn: &CrossEntropyLoss<B>,
    args: &Args,
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [n, _, _] = logits.dims();
    let scored = scored_positions(args.seq_len);
    let logits = logits
        .slice([0..n, scored.clone(), 0..VOCAB])
        .reshape([n * args.seq_len, VOCAB]);
    let targets = targets.slice([0..n, scored]).reshape([n * args.seq_len]);
    loss_fn.forward(logits, targets)
}

/// Token accuracy on the held-out sequences, each on exactly one rank, summed over the ranks:
/// (accuracy, digits scored).
pub(crate) fn token_accuracy<B: TapBackend>(
    args: &Args,
    model: &TinyGpt<B>,
    pg: &ProcessGroup,
    device: &B::Device,
) -> Result<(f64, usize)> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let scored = scored_positions(args.seq_len);
    let test_ids = shard(args.test_size, rank, world);
    let mut correct = 0usize;
    for chunk in test_ids.chunks(128) {
        let items = chunk
            .iter()
            .map(|&i| sequence(args.seed, (args.train_size + i) as u64, args.seq_len))
            .collect();
        let batch = burn::data::dataloader::batcher::Batcher::<B, _, _>::batch(
            &ReverseBatcher,
            items,
            device,
        );
        let n = chunk.len();
        let predicted = model.forward(batch.inputs).argmax(2).squeeze_dim::<2>(2);
        let predicted = predicted.slice([0..n, scored.clone()]);
        let targets = batch.targets.slice([0..n, scored.clone()]);
        let hits: i64 = predicted.equal(targets).int().sum().into_scalar().elem();
        correct += hits as usize;
    }
    all_reduce_accuracy(pg, correct, test_ids.len() * args.seq_len)
        .context("summing the token accuracy over the ranks")
}

/// Rank 0's result line (after the program's name): the token `accuracy` on `total` digits
/// after the run's epochs and `training` on `world` ranks; `how` ends the parenthesis (how the
/// run trained).
pub(crate) fn accuracy_report(
    args: &Args,
    (accuracy, total): (f64, usize),
    training: Duration,
    world: usize,
    how: &str,
) -> String {
    format!(
        "token accuracy {:.2}% on {total} reversed digits after {} epochs ({:.1}s of training on {world} rank(s){how})",
        accuracy * 100.0,
        args.epochs,
        training.as_secs_f64(),
    )
}
