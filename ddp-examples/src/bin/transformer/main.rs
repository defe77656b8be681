//! A small decoder-only transformer learning to reverse digit sequences, with DDP: the heavier
//! example, and the one that shows layer boundaries (`--boundaries`).
//!
//! ```text
//! cargo run --release -p ddp-examples --bin transformer -- --nproc-per-node 2
//! ```

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::AdamConfig;
use burn::tensor::{ElementConversion, FloatDType, Int, Tensor};
use clap::{Parser, ValueEnum};
use ddp_core::TapBackend;
use ddp_core::amp::{GradScaler, GradScalerConfig, GradScalerState, autocast};
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, TrainingState};
use ddp_core::hooks::PowerSgdConfig;
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    comm::ProcessGroup,
    data::{DistributedDataLoader, DistributedDataLoaderBuilder, DistributedSamplerConfig},
    launch::{LaunchArgs, WorkerContext},
    progress::EpochProgress,
    zero::{ZeroRedundancyOptimizer, ZeroStage},
};
use ddp_examples::backend::{BackendKind, CollectivesArg, TrainOn, run};
use ddp_examples::eval::{all_reduce_accuracy, shard};
use ddp_examples::models::{GptShape, TinyGpt};
use ddp_examples::resume::{StartFrom, StartPoint, resume_or_start};
use ddp_examples::reverse::{
    ReverseBatch, ReverseBatcher, ReverseDataset, VOCAB, scored_positions, sequence,
};
use optim::TrainingOptimizer;
use std::process::ExitCode;

mod fsdp;
mod optim;

/// glibc gives freed buffers above 32 MiB back to the kernel, so burn's CPU backend would
/// page-fault its large activations and gradients in again every step; mimalloc keeps them
/// (README, "CPU step time").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Train a small transformer to reverse sequences on several processes with ddp-burn"
)]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Passes over the training set.
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// Batch size per rank.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 0.002)]
    lr: f64,
    /// Seed of the data, the shuffle and the initial weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Digits per sequence.
    #[arg(long, default_value_t = 6)]
    seq_len: usize,
    /// Training sequences.
    #[arg(long, default_value_t = 2048)]
    train_size: usize,
    /// Test sequences.
    #[arg(long, default_value_t = 512)]
    test_size: usize,
    /// Width of the residual stream (256 with 4 layers: 3.2M parameters).
    #[arg(long, default_value_t = 256)]
    d_model: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Mark a layer boundary before each layer, so gradients leave during backward.
    #[arg(long)]
    boundaries: bool,
    /// Turn DDP's automatic overlap off (`DdpConfig::automatic_overlap`, on by default: taps
    /// anchored at depths learned on the first step, so gradients leave during backward with
    /// no marks in the model); taps then fire at the end of backward unless `--boundaries`.
    #[arg(long)]
    no_automatic_overlap: bool,
    /// Shard the training state across the ranks with `ZeroRedundancyOptimizer`: `zero1`
    /// Adam's state (ZeRO stage 1), `zero2` Adam's state and the averaged gradients (stage 2).
    /// `full` shards the parameters too (`ddp_core::fsdp`, one unit per layer; it writes no
    /// checkpoints).
    #[arg(long, value_enum, value_name = "WHAT")]
    shard: Option<Shard>,
    /// Same as `--shard zero1` (the older spelling).
    #[arg(long, conflicts_with = "shard")]
    zero: bool,
    /// Write a Chrome trace of the first steps here (rank 0).
    #[arg(long)]
    timeline: Option<String>,
    /// Average gradients with the PowerSGD communication hook of this rank (for slow links;
    /// exact averaging for the first 10 steps).
    #[arg(long, value_name = "RANK")]
    powersgd: Option<usize>,
    /// Where checkpoints go.
    #[arg(long, default_value = "runs/transformer")]
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
    /// Run the model's forward and backward in this dtype, the f32 parameters staying the
    /// master weights, with dynamic loss scaling (`ddp_core::amp`).
    #[arg(long, value_enum, value_name = "DTYPE")]
    mixed_precision: Option<MixedPrecision>,
    /// The loss scale of a fresh `--mixed-precision` run (a resumed run continues with the
    /// checkpoint's).
    #[arg(long, default_value_t = 65536.0)]
    loss_scale: f32,
    /// Finite steps in a row after which the loss scale doubles.
    #[arg(long, default_value_t = 2000)]
    loss_scale_growth_interval: u64,
}

impl Args {
    /// The model's shape.
    fn gpt_shape(&self) -> GptShape {
        GptShape {
            vocab: VOCAB,
            max_len: 2 * self.seq_len + 2,
            d_model: self.d_model,
            heads: self.heads,
            layers: self.layers,
            boundaries: self.boundaries,
        }
    }

    /// `--shard`, or `zero1` for `--zero`.
    fn shard(&self) -> Option<Shard> {
        self.shard.or(self.zero.then_some(Shard::Zero1))
    }

    /// Refuses combinations that cannot run, before any worker starts.
    fn check(&self) -> Result<()> {
        match self.shard() {
            Some(Shard::Full) => {
                let unsupported = [
                    (self.powersgd.is_some(), "--powersgd"),
                    (self.boundaries, "--boundaries"),
                    (self.mixed_precision.is_some(), "--mixed-precision"),
                    (self.timeline.is_some(), "--timeline"),
                    (
                        self.collectives == CollectivesArg::Nccl,
                        "--collectives nccl",
                    ),
                ];
                match unsupported.iter().find(|(set, _)| *set) {
                    Some((_, flag)) => bail!(
                        "--shard full (fully sharded parameters) trains without DDP, so {flag} \
                         (a DDP feature) does not apply: drop it, or use --shard zero1|zero2"
                    ),
                    None => Ok(()),
                }
            }
            Some(Shard::Zero2) if self.powersgd.is_some() => bail!(
                "--shard zero2 averages the gradients itself (a reduce-scatter in the optimizer \
                 step), so it cannot be combined with --powersgd, which replaces DDP's \
                 averaging: use --shard zero1 with --powersgd"
            ),
            Some(Shard::Zero2) if self.collectives == CollectivesArg::Nccl => bail!(
                "--shard zero2 needs DDP's communication hooks, which --collectives nccl does \
                 not run: use --collectives host, or --shard zero1"
            ),
            _ => Ok(()),
        }
    }
}

/// `--shard zero1|zero2|full`: how much of the training state is sharded across the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Shard {
    /// Adam's state (ZeRO stage 1).
    Zero1,
    /// Adam's state and the averaged gradients (ZeRO stage 2).
    Zero2,
    /// Parameters too (fully sharded, `ddp_core::fsdp`): each rank keeps `1/world` of every
    /// layer between steps. No checkpoints.
    Full,
}

impl Shard {
    fn name(shard: Option<Self>) -> &'static str {
        match shard {
            None => "off",
            Some(Shard::Zero1) => "zero1",
            Some(Shard::Zero2) => "zero2",
            Some(Shard::Full) => "full",
        }
    }
}

/// What the transformer keeps in a checkpoint's user payload (`TrainingState::user`).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Extra {
    /// The loss scaler's state under `--mixed-precision`, so a resumed run keeps its scale.
    scaler: Option<GradScalerState>,
}

/// `--mixed-precision bf16|f16`: the dtype of the autocast forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MixedPrecision {
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half: 11 bits of mantissa, overflows above 65504 (loss scaling backs off).
    F16,
}

impl MixedPrecision {
    fn dtype(self) -> FloatDType {
        match self {
            MixedPrecision::Bf16 => FloatDType::BF16,
            MixedPrecision::F16 => FloatDType::F16,
        }
    }
}

/// The settings whose change makes an old checkpoint suspicious (hashed into each checkpoint).
#[derive(serde::Serialize)]
struct RunConfig {
    batch_size: usize,
    lr: f64,
    seed: u64,
    seq_len: usize,
    train_size: usize,
    d_model: usize,
    layers: usize,
    heads: usize,
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
        let zero = |stage, pg: &ProcessGroup| {
            ZeroRedundancyOptimizer::new(adam(), pg.clone()).with_stage(stage)
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
    let start_from = StartFrom::new(args.fresh, &ctx);
    let pg = ctx.into_process_group();
    B::seed(&device, args.seed);
    let mut model = TinyGpt::<B>::new(args.gpt_shape(), &device);
    let mut loader = train_loader::<B>(args, rank, world, &device)?;

    let mut optim = make_optim(&pg);
    let run_config = RunConfig {
        batch_size: args.batch_size,
        lr: args.lr,
        seed: args.seed,
        seq_len: args.seq_len,
        train_size: args.train_size,
        d_model: args.d_model,
        layers: args.layers,
        heads: args.heads,
    };
    let checkpoints = FullCheckpointer::new(
        CheckpointConfig::new(&args.checkpoint_dir)
            .with_keep_last(3)
            .with_run_config(&run_config)?,
        pg.clone(),
    )?;
    let StartPoint {
        epoch: start_epoch,
        mut step,
        state: resumed,
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
    let start = std::time::Instant::now();
    let mut overlap = Vec::new();
    let mut last_saved = None;
    for epoch in start_epoch..args.epochs {
        loader.set_epoch(epoch as u64); // keeps a restored mid-epoch position
        let mut progress = EpochProgress::new(&pg, epoch, args.epochs, loader.remaining());
        for batch in loader.iter() {
            let batch = batch?;
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
            step += 1;
            progress.step(loss_value, n)?;
        }
        progress.finish();
        let extra = Extra {
            scaler: scaler.is_enabled().then(|| scaler.state()),
        };
        let state = TrainingState::new(epoch as u64 + 1, step)
            .with_sampler(loader.state())
            .with_user(&extra)?;
        last_saved = Some(optim.save(&checkpoints, ddp.module(), &state)?.path);
    }

    let (accuracy, total) = token_accuracy(args, ddp.module(), &pg, &device)?;
    overlap.sort_by(|a, b| a.total_cmp(b));
    if rank == 0 {
        println!(
            "transformer: token accuracy {:.2}% on {total} reversed digits after {} epochs ({:.1}s of training on {world} rank(s); median all-reduce overlap with backward {:.0}%)",
            accuracy * 100.0,
            args.epochs,
            start.elapsed().as_secs_f64(),
            overlap.get(overlap.len() / 2).copied().unwrap_or(0.0) * 100.0
        );
    }
    let state_bytes = optim.state_bytes()?;
    if rank == 0 {
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

/// This rank's shard of the training sequences, reshuffled per epoch.
fn train_loader<B: TapBackend>(
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
fn scored_loss<B: TapBackend>(
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
fn token_accuracy<B: TapBackend>(
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
