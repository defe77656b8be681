//! Handwritten digit classification with DDP: the README's main job.
//!
//! ```text
//! cargo run --release -p ddp-examples --bin digits -- --nproc-per-node 2
//! ```
//! The program launches itself once per rank, trains an MLP on a fixed 80/20 split of the UCI
//! digits with a DistributedSampler, evaluates on the test set sharded across ranks, and (rank 0)
//! prints the accuracy.

use anyhow::{Context, Result};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use clap::Parser;
use ddp_core::TapBackend;
use ddp_core::checkpoint::FullCheckpointer;
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    data::{DistributedDataLoaderBuilder, DistributedSamplerConfig},
    launch::{LaunchArgs, WorkerContext},
};
use ddp_examples::backend::{BackendKind, CollectivesArg, TrainOn, run};
use ddp_examples::digits::{DigitBatcher, DigitDataset, load_digits, split};
use ddp_examples::eval::report_digits;
use ddp_examples::models::DigitsMlp;
use ddp_examples::resume::{StartFrom, StartPoint, checkpoint_config, resume_or_start};
use ddp_examples::training::{EpochLoop, digits_step};
use std::process::ExitCode;

#[derive(Parser, Debug, Clone)]
#[command(about = "Train a digit classifier on several processes with ddp-burn")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Passes over the training set.
    #[arg(long, default_value_t = 15)]
    epochs: usize,
    /// Batch size per rank (the global batch is this times the world size).
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 0.005)]
    lr: f64,
    /// Seed of the split, the shuffle and the initial weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Width of the first hidden layer.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Data loader worker threads per rank.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Where checkpoints go.
    #[arg(long, default_value = "runs/digits")]
    checkpoint_dir: String,
    /// Ignore existing checkpoints and start over (on the launch's first attempt only:
    /// --max-restarts restarts resume this run's checkpoints).
    #[arg(long)]
    fresh: bool,
    /// Which burn backend to train on.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// Which collectives reduce the gradient buckets (NCCL needs `--backend cuda`).
    #[arg(long, value_enum, default_value_t = CollectivesArg::Auto)]
    collectives: CollectivesArg,
}

/// The settings whose change makes an old checkpoint suspicious (hashed into each checkpoint).
#[derive(serde::Serialize)]
struct RunConfig {
    batch_size: usize,
    lr: f64,
    seed: u64,
    hidden: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    run("digits", &args.launch, args.backend, Digits(&args))
}

/// This program's training function, for [`run`] to call on the chosen backend.
struct Digits<'a>(&'a Args);

impl TrainOn for Digits<'_> {
    fn train<B: TapBackend>(self, ctx: WorkerContext, device: B::Device) -> Result<()> {
        train::<B>(ctx, self.0, device)
    }
}

fn train<B: TapBackend>(ctx: WorkerContext, args: &Args, device: B::Device) -> Result<()> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    // --fresh starts the launch over; a --max-restarts restart resumes what it wrote.
    let start_from = StartFrom::new(args.fresh, &ctx)?;
    let pg = ctx.into_process_group();
    B::seed(&device, args.seed);
    let (train_items, test_items) = split(load_digits()?, args.seed, 0.8);
    if rank == 0 {
        eprintln!(
            "digits: {} train / {} test images, {world} rank(s), batch {} per rank",
            train_items.len(),
            test_items.len(),
            args.batch_size
        );
    }

    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(args.seed);
    let mut loader = DistributedDataLoaderBuilder::new(DigitBatcher)
        .batch_size(args.batch_size)
        .num_workers(args.workers)
        .set_device(device.clone())
        .build(DigitDataset(train_items), sampler)
        .context("building the data loader")?;

    let mut model = DigitsMlp::<B>::new(args.hidden, &device);
    let mut optim = AdamConfig::new().init::<B, DigitsMlp<B>>();
    let run_config = RunConfig {
        batch_size: args.batch_size,
        lr: args.lr,
        seed: args.seed,
        hidden: args.hidden,
    };
    let checkpoints = FullCheckpointer::new(
        checkpoint_config(&args.checkpoint_dir, &run_config)?,
        pg.clone(),
    )?;
    // Resume by default; load before wrapping in DDP (the restored module carries the saved
    // parameter ids, which the optimizer state is keyed by).
    let StartPoint {
        epoch: start_epoch,
        step,
        ..
    } = resume_or_start(
        "digits",
        &checkpoints,
        start_from,
        &device,
        &mut model,
        &mut optim,
        &mut loader,
        args.epochs,
    )?;
    let mut ddp = DistributedDataParallel::new(
        model,
        pg.clone(),
        DdpConfig::new().with_collectives(args.collectives.into()),
    )?;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    let mut training = EpochLoop::new(&pg, args.epochs, step);
    let mut last_saved = None;
    for epoch in start_epoch..args.epochs {
        let state = training.run(&mut loader, epoch, |batch| {
            digits_step(
                &mut ddp,
                &mut optim,
                args.lr,
                &loss_fn,
                batch,
                DigitsMlp::forward,
            )
        })?;
        last_saved = Some(checkpoints.save(ddp.module(), &optim, &state)?.path);
    }

    // Evaluation: each rank scores its exact shard of the test set (no padding), so the
    // all-reduced counts cover every test image exactly once.
    let model = ddp.module().clone();
    report_digits::<B>(
        "digits",
        &pg,
        &test_items,
        &device,
        args.epochs,
        training.started,
        |images| model.forward(images),
    )?;
    if rank == 0 {
        println!("digits: {}", training.clock.summary());
        match last_saved.or_else(|| {
            let latest = checkpoints.latest().ok().flatten()?;
            Some(std::path::Path::new(&args.checkpoint_dir).join(latest))
        }) {
            Some(path) => println!("digits: checkpoint: {}", path.display()),
            None => println!("digits: no checkpoint written"),
        }
    }
    Ok(())
}

/// burn's CPU backends allocate their activations and gradients afresh every step; mimalloc
/// serves them fastest, also with several threads per rank, where glibc, even with the
/// thresholds DDP raises, is slower (docs/guide/benchmarks.md, "CPU step time").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
