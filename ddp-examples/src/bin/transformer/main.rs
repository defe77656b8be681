//! A small decoder-only transformer learning to reverse digit sequences, with DDP: the heavier
//! example, and the one that shows layer boundaries (`--boundaries`).
//!
//! ```text
//! cargo run --release -p ddp-examples --bin transformer -- --nproc-per-node 2
//! ```

use anyhow::{Context, Result};
use args::{Args, MixedPrecision, RunConfig, Shard};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::tensor::{ElementConversion, FloatDType};
use clap::Parser;
use data::{accuracy_report, scored_loss, token_accuracy, train_loader};
use ddp_core::TapBackend;
use ddp_core::amp::{GradScaler, GradScalerConfig, GradScalerState, autocast};
use ddp_core::checkpoint::{FullCheckpointer, TrainingState};
use ddp_core::hooks::PowerSgdConfig;
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    comm::ProcessGroup,
    launch::WorkerContext,
    zero::{ZeroConfig, ZeroStage},
};
use ddp_examples::backend::{TrainOn, run};
use ddp_examples::models::TinyGpt;
use ddp_examples::resume::{StartFrom, StartPoint, checkpoint_config, resume_or_start};
use ddp_examples::training::EpochLoop;
use optim::TrainingOptimizer;
use std::process::ExitCode;

mod args;
mod data;
mod fsdp;
mod optim;

/// burn's CPU backends allocate their activations and gradients afresh every step; mimalloc
/// serves them fastest, also with several threads per rank, where glibc, even with the
/// thresholds DDP raises, is slower (docs/guide/benchmarks.md, "CPU step time").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What the transformer keeps in a checkpoint's user payload (`TrainingState::user`).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Extra {
    /// The loss scaler's state under `--mixed-precision`, so a resumed run keeps its scale.
    scaler: Option<GradScalerState>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.check() {
        eprintln!("transformer: {e}");
        return ExitCode::from(2);
    }
    run(
        "transformer",
        &args.launch,
        args.backend,
        Transformer(&args),
    )
}

/// This program's training function, for [`run`] to call on the chosen backend.
struct Transformer<'a>(&'a Args);

impl TrainOn for Transformer<'_> {
    fn train<B: TapBackend>(self, ctx: WorkerContext, device: B::Device) -> Result<()> {
        let adam = || AdamConfig::new().init::<B, TinyGpt<B>>();
        // Stage 2's collectives on the communicator `--collectives` names (on a GPU with NCCL,
        // or on the stand-in, the device path).
        let collectives = self.0.collectives.into();
        let zero = |stage, pg: &ProcessGroup| {
            ZeroConfig::new()
                .with_stage(stage)
                .with_collectives(Some(collectives))
                .init_on_group(adam(), pg.clone())
        };
        match self.0.shard() {
            None => train::<B, _>(ctx, self.0, device, |_| adam()),
            Some(Shard::Zero1) => train::<B, _>(ctx, self.0, device, |pg| zero(ZeroStage::One, pg)),
            Some(Shard::Zero2) => train::<B, _>(ctx, self.0, device, |pg| zero(ZeroStage::Two, pg)),
            Some(Shard::Full) => fsdp::train_fully_sharded::<B>(ctx, self.0, device),
        }
    }
}

fn train<B: TapBackend, O: TrainingOptimizer<TinyGpt<B>, B>>(
    ctx: WorkerContext,
    args: &Args,
    device: B::Device,
    make_optim: impl FnOnce(&ProcessGroup) -> O,
) -> Result<()> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    // --fresh starts the launch over; a --max-restarts restart resumes what it wrote.
    let start_from = StartFrom::new(args.fresh, &ctx)?;
    let pg = ctx.into_process_group();
    B::seed(&device, args.seed);
    let mut model = TinyGpt::<B>::new(args.gpt_shape(), &device);
    let mut loader = train_loader::<B>(args, rank, world, &device)?;

    let mut optim = make_optim(&pg);
    let checkpoints = FullCheckpointer::new(
        checkpoint_config(&args.checkpoint_dir, &RunConfig::of(args))?,
        pg.clone(),
    )?;
    let StartPoint {
        epoch: start_epoch,
        step,
        state: mut resumed,
    } = resume_or_start(
        "transformer",
        &checkpoints,
        start_from,
        &device,
        &mut model,
        &mut optim,
        &mut loader,
        args.epochs,
    )?;
    let config = DdpConfig::new()
        .with_timeline_path(args.timeline.clone())
        .with_automatic_overlap(!args.no_automatic_overlap)
        .with_collectives(args.collectives.into());
    let mut ddp = DistributedDataParallel::new(model, pg.clone(), config)?;
    if let Some(r) = args.powersgd {
        ddp.register_comm_hook(PowerSgdConfig::new().with_rank(r).init()?)?;
        // This rank's step count, error feedback and Q memory: the resume continues bit for bit.
        if let Some(hook_state) = resumed.as_mut().and_then(|s| s.comm_hook_state.take()) {
            ddp.load_comm_hook_state(hook_state)?;
        }
    }
    optim.attach(&mut ddp)?;
    if rank == 0 {
        let params: usize = ddp.module().num_params();
        eprintln!(
            "transformer: {params} parameters, {} layers, {world} rank(s), batch {} per rank, boundaries {}, automatic overlap {}, shard {}",
            args.layers,
            args.batch_size,
            if args.boundaries { "on" } else { "off" },
            if args.no_automatic_overlap {
                "off"
            } else {
                "on"
            },
            Shard::name(args.shard())
        );
    }
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    // Disabled without --mixed-precision: scale() and step() are then the plain loss and step.
    let mut scaler = GradScalerConfig::new()
        .with_enabled(args.mixed_precision.is_some())
        .with_init_scale(args.loss_scale)
        .with_growth_interval(args.loss_scale_growth_interval)
        .init(pg.clone())?;
    restore_scaler(&mut scaler, resumed.as_ref(), rank)?;
    let half = args.mixed_precision.map(MixedPrecision::dtype);
    let mut skipped = 0usize;
    let mut training = EpochLoop::new(&pg, args.epochs, step);
    let mut overlap = Vec::new();
    let mut last_saved = None;
    for epoch in start_epoch..args.epochs {
        let state = training.run(&mut loader, epoch, |batch| {
            let [n, _] = batch.inputs.dims();
            let logits = ddp.forward(|m| match half {
                // The loss stays f32, as under PyTorch's autocast.
                Some(dtype) => autocast(m.clone(), dtype)
                    .forward(batch.inputs)
                    .cast(FloatDType::F32),
                None => m.forward(batch.inputs),
            })?;
            let loss = scored_loss(&loss_fn, args, logits, batch.targets);
            let loss_value: f32 = loss.clone().into_scalar().elem();
            let grads = ddp.backward(scaler.scale(loss))?;
            if !scaler.step(&mut ddp, &mut optim, args.lr, grads)?.stepped {
                skipped += 1; // inf/NaN on some rank: every rank skipped it
            }
            if let Some(s) = ddp.last_step_stats() {
                overlap.push(s.overlap_fraction());
            }
            Ok((loss_value, n))
        })?;
        let extra = Extra {
            scaler: scaler.is_enabled().then(|| scaler.state()),
        };
        let state = state
            .with_user(&extra)?
            .with_comm_hook_state(ddp.comm_hook_state()?);
        last_saved = Some(optim.save(&checkpoints, ddp.module(), &state)?.path);
    }

    let accuracy = token_accuracy(args, ddp.module(), &pg, &device)?;
    overlap.sort_by(|a, b| a.total_cmp(b));
    // A run resumed from a finished checkpoint takes no step: it has no overlap to report.
    let overlap = match overlap.get(overlap.len() / 2) {
        Some(median) => format!(
            "median all-reduce overlap with backward {:.0}%",
            median * 100.0
        ),
        None => "no training step in this run".to_string(),
    };
    if rank == 0 {
        let how = format!("; {overlap}");
        let report = accuracy_report(args, accuracy, training.started.elapsed(), world, &how);
        println!("transformer: {report}");
    }
    let state_bytes = optim.state_bytes()?;
    if rank == 0 {
        println!("transformer: {}", training.clock.summary());
        println!("transformer: optimizer state on rank 0: {state_bytes} bytes");
    }
    if let (0, Some(mp)) = (rank, args.mixed_precision) {
        println!(
            "transformer: mixed precision {mp:?}: {skipped} step(s) skipped for inf/NaN (every rank alike), loss scale now {}",
            scaler.scale_factor()
        );
    }
    if let (0, Some(path)) = (rank, last_saved) {
        println!("transformer: checkpoint: {}", path.display());
    }
    Ok(())
}

/// Continues with the loss scale of the resumed checkpoint (same on every rank: the scale is
/// agreed on), so a resumed mixed-precision run does not back off from the initial scale again.
/// A checkpoint without one (trained in f32, or older) leaves the scaler as configured.
fn restore_scaler(
    scaler: &mut GradScaler,
    resumed: Option<&TrainingState>,
    rank: usize,
) -> Result<()> {
    let Some(state) = resumed else {
        return Ok(());
    };
    let extra: Extra = state
        .user()
        .context("reading the checkpoint's user payload")?
        .unwrap_or_default();
    if let (true, Some(saved)) = (scaler.is_enabled(), extra.scaler) {
        scaler
            .load_state(saved)
            .context("restoring the loss scaler's state from the checkpoint")?;
        if rank == 0 {
            eprintln!(
                "transformer: loss scale {} restored from the checkpoint ({} finite steps toward the next growth)",
                saved.scale, saved.growth_tracker
            );
        }
    }
    Ok(())
}
