//! `--shard full`: the same training with fully sharded parameters
//! (`ddp_core::fsdp::FullyShardedDataParallel`, one unit per transformer layer): between steps
//! each rank holds `1/world` of the parameters, gradients and Adam state.
//!
//! Checkpoints are sharded (each rank writes its part, `FullyShardedDataParallel::
//! save_checkpoint`) into `<checkpoint-dir>/sharded`, after every epoch, and a run resumes from
//! the latest at any number of ranks.

use crate::args::{Args, RunConfig};
use crate::data::{accuracy_report, scored_loss, token_accuracy, train_loader};
use anyhow::{Context, Result};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::tensor::ElementConversion;
use ddp_core::TapBackend;
use ddp_core::checkpoint::LoadOutcome;
use ddp_core::checkpoint::sharded::ShardedCheckpointer;
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::launcher::WorkerContext;
use ddp_examples::models::TinyGpt;
use ddp_examples::resume::{StartFrom, checkpoint_config};
use ddp_examples::training::EpochLoop;

/// Trains with every unit sharded, then reports the token accuracy of the whole model.
pub fn train_fully_sharded<B: TapBackend>(
    ctx: WorkerContext,
    args: &Args,
    device: B::Device,
) -> Result<()> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    let start_from = StartFrom::new(args.fresh, &ctx)?;
    let pg = ctx.into_process_group();
    B::seed(&device, args.seed);
    let shape = args.gpt_shape();
    let model = TinyGpt::<B>::new(shape, &device);
    let params = burn::module::Module::num_params(&model);
    let mut loader = train_loader::<B>(args, rank, world, &device)?;
    let units = FsdpConfig::new()
        .with_units(shape.fsdp_units())
        .with_collectives(args.collectives.into());
    let mut fsdp = FullyShardedDataParallel::new(model, pg.clone(), units)
        .context("sharding the model (--shard full)")?;
    let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
    if rank == 0 {
        eprintln!(
            "transformer: {params} parameters, {} layers, {world} rank(s), batch {} per rank, \
             shard full ({} units, {:.2} MiB of parameters per rank between steps)",
            args.layers,
            args.batch_size,
            fsdp.units().len(),
            fsdp.parameter_bytes() as f64 / (1024.0 * 1024.0)
        );
    }
    let dir = std::path::Path::new(&args.checkpoint_dir).join("sharded");
    // Rank 0 locks the directory in `new` (one job per directory) before --fresh removes
    // anything: another job's checkpoints are never touched.
    let checkpoints =
        ShardedCheckpointer::new(checkpoint_config(&dir, &RunConfig::of(args))?, pg.clone())?;
    let start_over = start_from.starting_over("transformer", rank == 0, |launch| {
        checkpoints.fresh_start_recorded(launch)
    })?;
    let fresh = start_over.is_some();
    if fresh {
        if rank == 0 {
            eprintln!(
                "transformer: --fresh: starting over (removing the sharded checkpoints in {})",
                dir.display()
            );
        }
        // Every checkpoint above step 0 (the runs here save from step 1 on); checkpoints
        // set aside as invalid stay, as always.
        checkpoints
            .rewind_to(0)
            .context("removing the older run's checkpoints for --fresh")?;
    }
    if let Some(launch) = &start_over {
        // Only now: a restart before this point starts over again instead of resuming.
        checkpoints
            .record_fresh_start(launch.as_deref().unwrap_or_default())
            .context("recording the fresh start")?;
    }
    let (start_epoch, step) = if fresh {
        (0, 0)
    } else {
        match fsdp.load_checkpoint(&checkpoints, &mut adam)? {
            LoadOutcome::Resumed(resumed) => {
                resumed.restore_loader(&mut loader)?;
                if rank == 0 {
                    eprintln!(
                        "transformer: resuming from {} (saved by {} rank(s)): {}, step {}",
                        resumed.info.path.display(),
                        resumed.info.saved_world_size,
                        ddp_examples::resume::epochs_done(
                            resumed.state.epoch as usize,
                            args.epochs
                        ),
                        resumed.state.global_step
                    );
                }
                (resumed.state.epoch as usize, resumed.state.global_step)
            }
            fresh => {
                if rank == 0 {
                    eprintln!("transformer: {fresh}");
                }
                (0, 0)
            }
        }
    };
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut training = EpochLoop::new(&pg, args.epochs, step);
    let mut last_saved = None;
    for epoch in start_epoch..args.epochs {
        let state = training.run(&mut loader, epoch, |batch| {
            let [n, _] = batch.inputs.dims();
            let logits = fsdp.forward(|m| m.forward(batch.inputs))?;
            let loss = scored_loss(&loss_fn, args, logits, batch.targets);
            let loss_value: f32 = loss.clone().into_scalar().elem();
            let grads = fsdp.backward(loss)?;
            fsdp.optimizer_step(&mut adam, args.lr, grads)?;
            Ok((loss_value, n))
        })?;
        last_saved = Some(fsdp.save_checkpoint(&checkpoints, &adam, &state)?.path);
    }
    let model = fsdp.full_module()?;
    let accuracy = token_accuracy(args, &model, &pg, &device)?;
    if rank == 0 {
        let how = ", fully sharded";
        let report = accuracy_report(args, accuracy, training.started.elapsed(), world, how);
        println!("transformer: {report}");
        println!("transformer: {}", training.clock.summary());
    }
    if let (0, Some(path)) = (rank, last_saved) {
        println!("transformer: checkpoint: {}", path.display());
    }
    Ok(())
}
