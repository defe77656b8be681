//! `--shard full`: the same training with fully sharded parameters
//! (`ddp_core::fsdp::FullyShardedDataParallel`, one unit per transformer layer): between steps
//! each rank holds `1/world` of the parameters, gradients and Adam state.
//!
//! It writes no checkpoints: FSDP's optimizer state lives in flat per-unit chunks, which the
//! checkpointers do not read or write yet (the run says so when it starts).

use crate::args::Args;
use crate::data::{scored_loss, token_accuracy, train_loader};
use anyhow::{Context, Result};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::tensor::ElementConversion;
use ddp_core::TapBackend;
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::launch::WorkerContext;
use ddp_core::progress::EpochProgress;
use ddp_examples::models::TinyGpt;

/// Trains with every unit sharded, then reports the token accuracy of the whole model.
pub fn train_fully_sharded<B: TapBackend>(
    ctx: WorkerContext,
    args: &Args,
    device: B::Device,
) -> Result<()> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    let pg = ctx.into_process_group();
    B::seed(&device, args.seed);
    let shape = args.gpt_shape();
    let model = TinyGpt::<B>::new(shape, &device);
    let params = burn::module::Module::num_params(&model);
    let mut loader = train_loader::<B>(args, rank, world, &device)?;
    let units = FsdpConfig::new().with_units(shape.fsdp_units());
    let mut fsdp = FullyShardedDataParallel::new(model, pg.clone(), units)
        .context("sharding the model (--shard full)")?;
    let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
    if rank == 0 {
        eprintln!(
            "transformer: {params} parameters, {} layers, {world} rank(s), batch {} per rank, \
             shard full ({} units, {:.2} MiB of parameters per rank between steps); no \
             checkpoints are written with --shard full",
            args.layers,
            args.batch_size,
            fsdp.units().len(),
            fsdp.parameter_bytes() as f64 / (1024.0 * 1024.0)
        );
    }
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let start = std::time::Instant::now();
    for epoch in 0..args.epochs {
        loader.set_epoch(epoch as u64);
        let mut progress = EpochProgress::new(&pg, epoch, args.epochs, loader.remaining());
        for batch in loader.iter() {
            let batch = batch?;
            let [n, _] = batch.inputs.dims();
            let logits = fsdp.forward(|m| m.forward(batch.inputs))?;
            let loss = scored_loss(&loss_fn, args, logits, batch.targets);
            let loss_value: f32 = loss.clone().into_scalar().elem();
            let grads = fsdp.backward(loss)?;
            fsdp.optimizer_step(&mut adam, args.lr, grads)?;
            progress.step(loss_value, n)?;
        }
        progress.finish();
    }
    let model = fsdp.full_module()?;
    let (accuracy, total) = token_accuracy(args, &model, &pg, &device)?;
    if rank == 0 {
        println!(
            "transformer: token accuracy {:.2}% on {total} reversed digits after {} epochs ({:.1}s of training on {world} rank(s), fully sharded)",
            accuracy * 100.0,
            args.epochs,
            start.elapsed().as_secs_f64(),
        );
    }
    Ok(())
}
