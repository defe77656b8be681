//! DDP step time against plain burn training on the transformer example's model, world size 1.
//!
//! ```text
//! cargo bench -p ddp-benches --bench transformer_step
//! cargo bench -p ddp-benches --features cuda --bench transformer_step -- --backend cuda --collectives nccl
//! cargo bench -p ddp-benches --features cuda --bench transformer_step -- --backend cuda \
//!     --d-model 768 --layers 12 --heads 12 --seq-len 127    # the 85M shape
//! cargo bench -p ddp-benches --features cuda,autotune --bench transformer_step -- \
//!     --backend cuda-fused                                   # burn's default CUDA backend
//! ```
//!
//! Backend variants: `--backend cuda` (unfused) or `cuda-fused` (burn-fusion, what burn's
//! default features give), each built with or without burn's `autotune` (feature `autotune`).
//! The first-step column is the cold start (kernel compilation, autotuning) when the kernel
//! cache (`DDP_KERNEL_CACHE`, see `ddp_core::kernel_cache`) is empty.
//!
//! Model: the `transformer` example's `TinyGpt` (by default d_model 256, 4 layers, 4 heads: 3.2M
//! parameters; `--d-model --layers --heads --seq-len --batch` set another shape) on its
//! sequence-reversal batches (by default 32 sequences of 13 tokens), Adam. Plain steps
//! (forward, backward, `GradientsParams::from_grads`, Adam) and DDP steps (the same through a
//! world-1 `DistributedDataParallel`) alternate step by step, each step starting at another
//! row; every step ends with `Backend::sync`, so GPU times include the work queued by the step.
//! Times are medians; a row's ratio to plain burn is the median of its per-step ratios, with a
//! 95% interval (an interval reaching 1.00 means no slowdown is measurable at that many steps). The goal on a GPU (issue 23): DDP at most 1.03x plain, with at
//! least 70% of all-reduce time hidden.
//!
//! A second DDP row runs the model with `layer_boundary` marks between its blocks, so buckets
//! launch during backward; each DDP row also shows the share of its all-reduce time that ran
//! while backward was still going (the timeline's overlap fraction, mean over the steps).
//! `--collectives nccl` forces the NCCL reduction at world size 1 (its launch and copy overhead);
//! with it (or `stand-in`, the engine on the CPU) a row of the same DDP with the local reduction
//! (taps and bookkeeping, no engine) shows what the engine itself costs per step.
//! `--sharded` adds a ZeRO-2 row and an FSDP row (their reduce-scatters and all-gathers on the
//! same collectives), alternating with the other rows.
//!
//! Two diagnostics for the GPU: each DDP row's `waited` column is the mean host time from the
//! end of backward until every bucket was reduced (`StepStats::sync_after_backward`), and the
//! row `plain burn, host sync before Adam` is plain burn waiting for the GPU between backward
//! and the optimizer. The NCCL reduction blocks the host there (cubecl does not expose its stream,
//! so the optimizer's kernels cannot be ordered after NCCL on the device); plain burn instead
//! queues the optimizer while the GPU is still running backward. If DDP's step is about that
//! row's, the cost is the lost overlap of host and GPU, not NCCL.

use anyhow::Result;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use clap::Parser;
use ddp_benches::shape::ShapeArgs;
use ddp_benches::{median, median_ratio, world_of_one};
use ddp_core::TapBackend;
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::zero::{ZeroConfig, ZeroRedundancyOptimizer, ZeroStage};
use ddp_core::{DdpConfig, DistributedDataParallel};
use ddp_examples::backend::{BackendKind, CollectivesArg};
use ddp_examples::models::{GptShape, TinyGpt};
use ddp_examples::reverse::{ReverseBatch, ReverseBatcher, VOCAB, scored_positions, sequence};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Measured steps per configuration (after one warm-up round).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[command(flatten)]
    shape: ShapeArgs,
    /// The burn backend (`cuda` needs `--features cuda` and a GPU).
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// Largest bucket in MiB (DDP's default 25 makes two buckets of this 12.8 MB model; smaller
    /// ones launch during backward with layer boundaries).
    #[arg(long, default_value_t = 25.0)]
    bucket_cap_mb: f64,
    /// Which collectives reduce the buckets (`nccl` forces NCCL at world size 1).
    #[arg(long, value_enum, default_value_t = CollectivesArg::Auto)]
    collectives: CollectivesArg,
    /// Turn DDP's automatic overlap off (its first-step probes and anchored taps), to see what
    /// it costs on the GPU: taps then fire at the end of backward unless the model has marks.
    #[arg(long)]
    no_automatic_overlap: bool,
    /// Also measure ZeRO stage 2 (DDP with `ZeroConfig` stage 2) and FSDP (one unit per
    /// layer), each over `--collectives`, next to plain burn and DDP (issue 43).
    #[arg(long)]
    sharded: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    ddp_examples::backend::check_available(args.backend)?;
    match args.backend {
        BackendKind::Flex => bench::<burn::backend::Autodiff<burn::backend::Flex>>(
            &args,
            Default::default(),
            "flex (CPU)",
        ),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => bench::<burn::backend::Autodiff<ddp_examples::backend::CudaUnfused>>(
            &args,
            gpu(BackendKind::Cuda)?,
            &format!("cuda (GPU 0, unfused, autotune {})", autotune()),
        ),
        #[cfg(feature = "cuda")]
        BackendKind::CudaFused => {
            bench::<burn::backend::Autodiff<ddp_examples::backend::CudaFused>>(
                &args,
                gpu(BackendKind::CudaFused)?,
                &format!("cuda (GPU 0, fused, autotune {})", autotune()),
            )
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda | BackendKind::CudaFused => {
            unreachable!("check_available refuses cuda without the feature")
        }
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => bench::<burn::backend::Autodiff<burn::backend::NdArray>>(
            &args,
            Default::default(),
            "ndarray (CPU)",
        ),
        #[cfg(not(feature = "ndarray"))]
        BackendKind::Ndarray => {
            unreachable!("check_available refuses ndarray without the feature")
        }
        #[cfg(feature = "tch")]
        BackendKind::Tch => bench::<burn::backend::Autodiff<burn::backend::LibTorch>>(
            &args,
            burn::backend::libtorch::LibTorchDevice::Cpu,
            "tch (LibTorch, CPU)",
        ),
        #[cfg(not(feature = "tch"))]
        BackendKind::Tch => unreachable!("check_available refuses tch without the feature"),
    }
}

/// GPU 0, with the kernel cache on (`DDP_KERNEL_CACHE` chooses it; a fresh directory measures
/// a cold start, as the GPU checks do).
#[cfg(feature = "cuda")]
fn gpu(kind: BackendKind) -> Result<burn::backend::cuda::CudaDevice> {
    ddp_examples::backend::prepare_gpu("transformer_step", kind, 0)
}

/// Whether this build has burn's `autotune` feature (the benches' `autotune` feature).
#[cfg(feature = "cuda")]
fn autotune() -> &'static str {
    if cfg!(feature = "autotune") {
        "on"
    } else {
        "off"
    }
}

/// Sequences per batch and digits per sequence.
#[derive(Debug, Clone, Copy)]
struct Batching {
    batch: usize,
    digits: usize,
}

fn batch<B: Backend>(b: Batching, step: usize, device: &B::Device) -> ReverseBatch<B> {
    use burn::data::dataloader::batcher::Batcher;
    let items: Vec<Vec<i64>> = (0..b.batch)
        .map(|i| sequence(7, (step * b.batch + i) as u64, b.digits))
        .collect();
    ReverseBatcher.batch(items, device)
}

/// The example's loss: cross-entropy on the positions that hold the reversed digits.
fn loss<B: Backend>(
    b: Batching,
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, burn::tensor::Int>,
) -> Tensor<B, 1> {
    let device = logits.device();
    let Batching { batch, digits } = b;
    let scored = scored_positions(digits);
    let logits = logits
        .slice([0..batch, scored.clone(), 0..VOCAB])
        .reshape([batch * digits, VOCAB]);
    let targets = targets.slice([0..batch, scored]).reshape([batch * digits]);
    CrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, targets)
}

fn bench<B: TapBackend>(args: &Args, device: B::Device, name: &str) -> Result<()>
where
    TinyGpt<B>: AutodiffModule<B>,
{
    let digits = args.shape.digits()?;
    let bt = Batching {
        batch: args.shape.batch,
        digits,
    };
    let shape = GptShape {
        vocab: VOCAB,
        max_len: 2 * digits + 2,
        d_model: args.shape.d_model,
        heads: args.shape.heads,
        layers: args.shape.layers,
        boundaries: false,
    };
    B::seed(&device, 42);
    let marked = GptShape {
        boundaries: true,
        ..shape
    };
    let mut plain_model = TinyGpt::<B>::new(shape, &device);
    let mut synced_model = plain_model.clone();
    let mut synced_opt = AdamConfig::new().init::<B, TinyGpt<B>>();
    let mut plain_opt = AdamConfig::new().init::<B, TinyGpt<B>>();
    let config = DdpConfig::new()
        .with_collectives(args.collectives.into())
        .with_bucket_cap_mb(args.bucket_cap_mb)
        .with_automatic_overlap(!args.no_automatic_overlap);
    let (_server, pg) = world_of_one()?;
    let mut ddp =
        DistributedDataParallel::new(TinyGpt::<B>::new(shape, &device), pg, config.clone())?;
    let (_server2, pg2) = world_of_one()?;
    let mut ddp_marked =
        DistributedDataParallel::new(TinyGpt::<B>::new(marked, &device), pg2, config.clone())?;
    let mut ddp_opt = AdamConfig::new().init::<B, TinyGpt<B>>();
    let mut marked_opt = AdamConfig::new().init::<B, TinyGpt<B>>();
    // With the device engine forced (NCCL or its stand-in), the same DDP with the local
    // reduction (at world 1: taps and the step's bookkeeping, no engine): DDP (world 1) minus
    // this row is the engine's own per-step cost.
    let engine = matches!(
        args.collectives,
        CollectivesArg::Nccl | CollectivesArg::StandIn
    );
    let mut local = if engine {
        let (server, pg) = world_of_one()?;
        let host = config.clone().with_collectives(CollectivesArg::Host.into());
        let ddp = DistributedDataParallel::new(TinyGpt::<B>::new(shape, &device), pg, host)?;
        Some((
            server,
            ddp,
            AdamConfig::new().init::<B, TinyGpt<B>>(),
            RowTimes::default(),
        ))
    } else {
        None
    };
    let mut sharded = if args.sharded {
        Some(Sharded::new(&config, shape, &device)?)
    } else {
        None
    };
    let (mut plain, mut synced) = (RowTimes::default(), RowTimes::default());
    let (mut wrapped, mut wrapped_marked) = (RowTimes::default(), RowTimes::default());
    // Rows alternate step by step, each step starting at another row, so that a slower stretch
    // of the machine (load, clocks, another process) falls on every row alike; each row's ratio
    // to plain burn is the median of its per-step ratios, with a distribution-free interval.
    // The first quarter of the steps warm up (the first step of each row is its cold start).
    let warmup = args.steps.div_ceil(4);
    // 0 plain, 1 synced, 2 DDP, 3 DDP with boundaries, then the optional rows.
    let mut optional = Vec::new();
    if local.is_some() {
        optional.push(Optional::Local);
    }
    if sharded.is_some() {
        optional.extend([Optional::Zero, Optional::Fsdp]);
    }
    let rows = 4 + optional.len();
    for step in 0..warmup + args.steps {
        let measured = step >= warmup;
        for slot in 0..rows {
            let b = batch::<B>(bt, step, &device);
            match (slot + step) % rows {
                0 => {
                    let t = Instant::now();
                    let l = loss(bt, plain_model.forward(b.inputs), b.targets);
                    let grads = GradientsParams::from_grads(l.backward(), &plain_model);
                    plain_model = plain_opt.step(0.002, plain_model, grads);
                    B::sync(&device)?;
                    plain.record(t, measured);
                }
                1 => {
                    let t = Instant::now();
                    let l = loss(bt, synced_model.forward(b.inputs), b.targets);
                    let grads = GradientsParams::from_grads(l.backward(), &synced_model);
                    B::sync(&device)?;
                    synced_model = synced_opt.step(0.002, synced_model, grads);
                    B::sync(&device)?;
                    synced.record(t, measured);
                }
                2 => ddp_step(
                    bt,
                    b,
                    &mut ddp,
                    &mut ddp_opt,
                    &mut wrapped,
                    measured,
                    &device,
                )?,
                3 => ddp_step(
                    bt,
                    b,
                    &mut ddp_marked,
                    &mut marked_opt,
                    &mut wrapped_marked,
                    measured,
                    &device,
                )?,
                row => match (optional[row - 4], local.as_mut(), sharded.as_mut()) {
                    (Optional::Local, Some((_, ddp, opt, times)), _) => {
                        ddp_step(bt, b, ddp, opt, times, measured, &device)?
                    }
                    (Optional::Zero, _, Some(sharded)) => {
                        sharded.zero_step(bt, b, measured, &device)?
                    }
                    (Optional::Fsdp, _, Some(sharded)) => {
                        sharded.fsdp_step(bt, b, measured, &device)?
                    }
                    _ => unreachable!("optional rows exist only with their state"),
                },
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    println!(
        "# transformer step, world 1: TinyGpt {} ({:.2}M parameters)",
        args.shape.describe(),
        plain_model.num_params() as f64 / 1e6
    );
    println!(
        "# backend {name}, collectives {:?}, buckets <= {} MiB, Adam, {} steps per row after {} \
         of warm-up, rows alternating step by step; ms/step: median; / plain: median of the \
         per-step ratios (95% interval in the last column)",
        args.collectives, args.bucket_cap_mb, args.steps, warmup
    );
    println!(
        "# {:<34} {:>10} {:>12} {:>18} {:>12} {:>14} {:>14}",
        "configuration",
        "ms/step",
        "/ plain",
        "comm overlapped",
        "waited ms",
        "first step ms",
        "95% interval"
    );
    println!(
        "  {:<34} {:>10.2} {:>12} {:>18} {:>12} {:>14.1}",
        "plain burn",
        plain.median_ms(),
        "",
        "",
        "",
        ms(plain.first)
    );
    let (ratio, interval) = synced.ratio_to(&plain);
    println!(
        "  {:<34} {:>10.2} {:>12.3} {:>18} {:>12} {:>14.1} {:>14}",
        "plain burn, host sync before Adam",
        synced.median_ms(),
        ratio,
        "",
        "",
        ms(synced.first),
        interval
    );
    let mut ddp_rows = vec![
        ("DDP (world 1)", &wrapped),
        ("DDP, layer boundaries", &wrapped_marked),
    ];
    if let Some((_, _, _, times)) = local.as_ref() {
        ddp_rows.push(("DDP, local reduction (no engine)", times));
    }
    for (label, row) in ddp_rows {
        let (ratio, interval) = row.ratio_to(&plain);
        println!(
            "  {:<34} {:>10.2} {:>12.3} {:>17.0}% {:>12.2} {:>14.1} {:>14}",
            label,
            row.median_ms(),
            ratio,
            100.0 * mean(&row.overlaps),
            mean(&row.waits),
            ms(row.first),
            interval
        );
    }
    if let Some(sharded) = sharded {
        for (label, row) in [
            ("ZeRO-2 (DDP + ZeRO stage 2)", &sharded.zero),
            ("FSDP (one unit per layer)", &sharded.fsdp_row),
        ] {
            let (ratio, interval) = row.ratio_to(&plain);
            println!(
                "  {:<34} {:>10.2} {:>12.3} {:>18} {:>12} {:>14.1} {:>14}",
                label,
                row.median_ms(),
                ratio,
                "",
                "",
                ms(row.first),
                interval
            );
        }
    }
    println!("# goal on a GPU: DDP / plain <= 1.03, >= 70% of all-reduce time overlapped");
    Ok(())
}

/// The rows a run may add to the four it always has.
#[derive(Clone, Copy, Debug)]
enum Optional {
    Local,
    Zero,
    Fsdp,
}

/// One row's step times: the very first step (the cold start) and the measured ones, and for
/// DDP rows each measured step's overlap and host wait.
#[derive(Default)]
struct RowTimes {
    first: Option<Duration>,
    times: Vec<Duration>,
    overlaps: Vec<f64>,
    waits: Vec<f64>,
}

impl RowTimes {
    /// Runs `step` and records its time up to the end of the device's work (`Backend::sync`).
    fn time<B: Backend>(
        &mut self,
        measured: bool,
        device: &B::Device,
        step: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let t = Instant::now();
        step()?;
        B::sync(device)?;
        self.record(t, measured);
        Ok(())
    }

    /// A step that began at `start` and has just ended (after `Backend::sync`).
    fn record(&mut self, start: Instant, measured: bool) {
        let took = start.elapsed();
        self.first.get_or_insert(took);
        if measured {
            self.times.push(took);
        }
    }

    fn median_ms(&self) -> f64 {
        median(self.times.clone()).as_secs_f64() * 1e3
    }

    /// The median of this row's per-step ratios to `base`'s (the same steps) and its 95%
    /// interval.
    fn ratio_to(&self, base: &RowTimes) -> (f64, String) {
        let ratios = self
            .times
            .iter()
            .zip(&base.times)
            .map(|(t, b)| t.as_secs_f64() / b.as_secs_f64())
            .collect();
        median_ratio(ratios)
    }
}

/// One DDP step into `row`, with its overlap and host wait.
fn ddp_step<B: TapBackend>(
    bt: Batching,
    b: ReverseBatch<B>,
    ddp: &mut DistributedDataParallel<B, TinyGpt<B>>,
    opt: &mut Adam<TinyGpt<B>, B>,
    row: &mut RowTimes,
    measured: bool,
    device: &B::Device,
) -> Result<()>
where
    TinyGpt<B>: AutodiffModule<B>,
{
    row.time::<B>(measured, device, || {
        let logits = ddp.forward(|m| m.forward(b.inputs))?;
        let grads = ddp.backward(loss(bt, logits, b.targets))?;
        ddp.optimizer_step(opt, 0.002, grads);
        Ok(())
    })?;
    if measured && let Some(stats) = ddp.last_step_stats() {
        row.overlaps.push(stats.overlap_fraction());
        row.waits
            .push(stats.sync_after_backward.as_secs_f64() * 1e3);
    }
    Ok(())
}

type Adam<M, B> = burn::optim::adaptor::OptimizerAdaptor<burn::optim::Adam, M, B>;

/// The `--sharded` rows: ZeRO stage 2 behind a world-1 DDP, and FSDP with one unit per layer,
/// each with its own model, Adam and group, on the collectives `--collectives` names.
struct Sharded<B: TapBackend>
where
    TinyGpt<B>: AutodiffModule<B>,
{
    zero_ddp: DistributedDataParallel<B, TinyGpt<B>>,
    zero_opt: ZeroRedundancyOptimizer<Adam<TinyGpt<B>, B>, TinyGpt<B>, B>,
    fsdp: FullyShardedDataParallel<B, TinyGpt<B>>,
    fsdp_opt: Adam<ShardedParams<B>, B>,
    zero: RowTimes,
    fsdp_row: RowTimes,
    _servers: [ddp_comm::StoreServer; 2],
}

impl<B: TapBackend> Sharded<B>
where
    TinyGpt<B>: AutodiffModule<B>,
{
    /// `config`: the DDP rows' settings; ZeRO-2's DDP and FSDP use its collectives.
    fn new(config: &DdpConfig, shape: GptShape, device: &B::Device) -> Result<Self> {
        let collectives = config.collectives;
        let (zero_server, pg) = world_of_one()?;
        let mut zero_ddp =
            DistributedDataParallel::new(TinyGpt::<B>::new(shape, device), pg, config.clone())?;
        let zero_opt = ZeroConfig::new()
            .with_stage(ZeroStage::Two)
            .with_collectives(Some(collectives))
            .init(AdamConfig::new().init::<B, TinyGpt<B>>(), &mut zero_ddp)?;
        let (fsdp_server, pg) = world_of_one()?;
        let units = FsdpConfig::new()
            .with_units(shape.fsdp_units())
            .with_collectives(collectives);
        let fsdp = FullyShardedDataParallel::new(TinyGpt::<B>::new(shape, device), pg, units)?;
        Ok(Self {
            zero_ddp,
            zero_opt,
            fsdp,
            fsdp_opt: AdamConfig::new().init::<B, ShardedParams<B>>(),
            zero: RowTimes::default(),
            fsdp_row: RowTimes::default(),
            _servers: [zero_server, fsdp_server],
        })
    }

    fn zero_step(
        &mut self,
        bt: Batching,
        b: ReverseBatch<B>,
        measured: bool,
        device: &B::Device,
    ) -> Result<()> {
        let (ddp, opt) = (&mut self.zero_ddp, &mut self.zero_opt);
        self.zero.time::<B>(measured, device, || {
            let logits = ddp.forward(|m| m.forward(b.inputs))?;
            let grads = ddp.backward(loss(bt, logits, b.targets))?;
            ddp.optimizer_step(opt, 0.002, grads);
            Ok(())
        })
    }

    fn fsdp_step(
        &mut self,
        bt: Batching,
        b: ReverseBatch<B>,
        measured: bool,
        device: &B::Device,
    ) -> Result<()> {
        let (fsdp, opt) = (&mut self.fsdp, &mut self.fsdp_opt);
        self.fsdp_row.time::<B>(measured, device, || {
            let logits = fsdp.forward(|m| m.forward(b.inputs))?;
            let grads = fsdp.backward(loss(bt, logits, b.targets))?;
            fsdp.optimizer_step(opt, 0.002, grads)?;
            Ok(())
        })
    }
}
