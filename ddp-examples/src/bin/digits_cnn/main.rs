//! A small CNN on the 8x8 digits with `SyncBatchNorm`: batch norm statistics over the global
//! batch, so ranks with small batches train like one process with their union.
//!
//! ```text
//! cargo run --release -p ddp-examples --bin digits_cnn -- --nproc-per-node 2
//! cargo run --release -p ddp-examples --bin digits_cnn -- --nproc-per-node 2 --local-bn
//! ```
//! The program launches itself once per rank, trains on a fixed 80/20 split with a
//! DistributedSampler, evaluates each test image exactly once (sharded across ranks, counts
//! all-reduced) with the running statistics, and (rank 0) prints the accuracy.

use anyhow::{Context, Result};
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use clap::Parser;
use ddp_core::{
    DdpConfig, DistributedDataParallel, TapBackend,
    data::{DistributedDataLoaderBuilder, DistributedSamplerConfig},
    launch::{LaunchArgs, WorkerContext},
    nn::{SyncBatchNormBackend, SyncBatchNormGroup},
};
use ddp_examples::backend::{BackendKind, CollectivesArg, TrainOn, run};
use ddp_examples::digits::{DigitBatcher, DigitDataset, load_digits, split};
use ddp_examples::eval::report_digits;
use ddp_examples::models::DigitsCnn;
use ddp_examples::training::{EpochLoop, digits_step};
use std::process::ExitCode;

/// burn's CPU backends allocate their activations and gradients afresh every step; mimalloc
/// serves them fastest, also with several threads per rank, where glibc, even with the
/// thresholds DDP raises, is slower (docs/guide/benchmarks.md, "CPU step time").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone)]
#[command(about = "Train a digit CNN with SyncBatchNorm on several processes with ddp-burn")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Passes over the training set.
    #[arg(long, default_value_t = 6)]
    epochs: usize,
    /// Batch size per rank (small on purpose: SyncBatchNorm normalises over all ranks' batches).
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 0.003)]
    lr: f64,
    /// Seed of the split, the shuffle and the initial weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Feature maps of the first convolution.
    #[arg(long, default_value_t = 8)]
    channels: usize,
    /// Normalise with each rank's own batch (burn's BatchNorm behaviour) instead of the global
    /// batch, for comparison.
    #[arg(long)]
    local_bn: bool,
    /// Data loader worker threads per rank.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Seconds a worker may take to deliver a batch before this rank fails (with workers).
    #[arg(long, default_value_t = 60)]
    loader_timeout_secs: u64,
    /// Which burn backend to train on.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// Which collectives reduce the gradient buckets (NCCL needs `--backend cuda`).
    #[arg(long, value_enum, default_value_t = CollectivesArg::Auto)]
    collectives: CollectivesArg,
}

fn main() -> ExitCode {
    let args = Args::parse();
    run(
        "digits_cnn",
        &args.launch,
        args.backend,
        DigitsCnnJob(&args),
    )
}

/// This program's training function, for [`run`] to call on the chosen backend.
struct DigitsCnnJob<'a>(&'a Args);

impl TrainOn for DigitsCnnJob<'_> {
    fn train<B>(self, ctx: WorkerContext, device: B::Device) -> Result<()>
    where
        B: TapBackend + SyncBatchNormBackend,
        B::InnerBackend: SyncBatchNormBackend,
    {
        train::<B>(ctx, self.0, device)
    }
}

fn train<B>(ctx: WorkerContext, args: &Args, device: B::Device) -> Result<()>
where
    B: TapBackend + SyncBatchNormBackend,
    B::InnerBackend: SyncBatchNormBackend,
{
    let (rank, world) = (ctx.rank(), ctx.world_size());
    let pg = ctx.into_process_group();
    B::seed(&device, args.seed);
    let (train_items, test_items) = split(load_digits()?, args.seed, 0.8);
    // One statistics group for every batch norm layer (collective: all ranks create it).
    let group = if args.local_bn {
        None
    } else {
        Some(SyncBatchNormGroup::new(&pg).context("creating the SyncBatchNorm group")?)
    };
    if rank == 0 {
        eprintln!(
            "digits_cnn: {} train / {} test images, {world} rank(s), batch {} per rank, {} batch norm",
            train_items.len(),
            test_items.len(),
            args.batch_size,
            if group.is_some() {
                "synchronised"
            } else {
                "local"
            }
        );
    }

    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(args.seed);
    let mut loader = DistributedDataLoaderBuilder::new(DigitBatcher)
        .batch_size(args.batch_size)
        .num_workers(args.workers)
        .set_device(device.clone());
    if args.workers > 0 {
        // A stuck `get` fails this rank naming its batch, instead of hanging every peer.
        loader = loader.timeout(std::time::Duration::from_secs(args.loader_timeout_secs));
    }
    let mut loader = loader
        .build(DigitDataset(train_items), sampler)
        .context("building the data loader")?;

    let model = DigitsCnn::<B>::new(args.channels, group, &device);
    let mut optim = AdamConfig::new().init::<B, DigitsCnn<B>>();
    let mut ddp = DistributedDataParallel::new(
        model,
        pg.clone(),
        DdpConfig::new().with_collectives(args.collectives.into()),
    )?;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    let mut training = EpochLoop::new(&pg, args.epochs, 0);
    for epoch in 0..args.epochs {
        training.run(&mut loader, epoch, |batch| {
            digits_step(
                &mut ddp,
                &mut optim,
                args.lr,
                &loss_fn,
                batch,
                DigitsCnn::forward,
            )
        })?;
    }

    // Evaluation on the inner backend: batch norms use their running statistics and do not
    // communicate; each test image is scored on exactly one rank.
    let model = ddp.module().valid();
    report_digits::<B::InnerBackend>(
        "digits_cnn",
        &pg,
        &test_items,
        &device,
        args.epochs,
        training.started,
        |images| model.forward(images),
    )?;
    Ok(())
}
