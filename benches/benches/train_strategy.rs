//! burn-train's loop on our DDP (`ddp_train::DdpStrategy`) against a hand-written DDP loop, on
//! the same model and data.
//!
//! ```text
//! cargo bench -p ddp-benches --bench train_strategy
//! cargo bench -p ddp-benches --bench train_strategy -- --steps 40 --rounds 4
//! ```
//!
//! Model: the DDP benches' MLP 1024-2048-2048-10 (6.3M parameters), batch 64 per rank, SGD,
//! one compute thread per rank, ranks as processes over shared memory (world 2) and world 1.
//! Both loops read the same synthetic data set through the same `DistributedLoader`:
//! - hand-written: `ddp.forward`, `ddp.backward`, `ddp.optimizer_step`, the loss read back;
//! - strategy: `SupervisedTraining` with `.distributed(&strategy)`, a loss metric, one epoch
//!   per round (validation on one small batch).
//!
//! A step's time is the interval between the starts of consecutive steps (the strategy's
//! `TrainStep::step` records it), so it covers everything a loop does per step: loading,
//! forward, backward, all-reduce, optimizer, and for the strategy the step-control collective,
//! merging the outputs on rank 0 and burn-train's event processing. Medians over the rounds
//! after the first (warm-up); the modes alternate round by round. Compare within one run.
//!
//! `--overlap` says how gradients leave during backward, in both loops:
//! - `auto` (default): each loop as a user gets it with the default `DdpConfig`. The
//!   hand-written loop's `forward`/`backward` learn where to anchor the taps on their first
//!   step (automatic overlap); the strategy's `step_on` cannot (burn-train's `TrainStep` calls
//!   `backward` itself, so DDP never sees the loss it would probe), so its buckets leave when
//!   backward ends.
//! - `off`: automatic overlap off in both: the strategy's own cost alone.
//! - `boundaries`: the model marks `layer_boundary` after each hidden layer, in both loops: both
//!   overlap, with no learning.

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoader;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::SgdConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use clap::Parser;
use ddp_benches::{BATCH, BenchMlp, median, world_of_one};
use ddp_core::{
    DdpConfig, DistributedDataParallel, comm::ProcessGroup, data::DistributedSamplerConfig,
    init_from_env,
};
use ddp_train::burn_train::metric::LossMetric;
use ddp_train::burn_train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use ddp_train::{DdpStrategy, DistributedLoader, DistributedTrainingExt, SilentRenderer};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type B = Autodiff<Flex>;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Steps per round (one epoch of the strategy).
    #[arg(long, default_value_t = 24)]
    steps: usize,
    /// Rounds per mode; the first is warm-up.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// How gradients leave during backward, in both loops (see the module docs).
    #[arg(long, value_enum, default_value_t = Overlap::Auto)]
    overlap: Overlap,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `--overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Overlap {
    /// The default `DdpConfig` in both loops.
    Auto,
    /// Automatic overlap off in both loops.
    Off,
    /// Layer boundaries marked in the model, in both loops.
    Boundaries,
}

impl Overlap {
    fn config(self) -> DdpConfig {
        DdpConfig::new().with_automatic_overlap(self == Overlap::Auto)
    }
    fn marked(self) -> bool {
        self == Overlap::Boundaries
    }
}

/// When each training step started (the strategy's steps record themselves here).
static STEP_STARTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

fn mark_step() {
    STEP_STARTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Instant::now());
}

/// The step intervals recorded since the last call, dropping the first (it includes the
/// round's set-up).
fn take_intervals() -> Vec<Duration> {
    let starts = std::mem::take(&mut *STEP_STARTS.lock().unwrap_or_else(|e| e.into_inner()));
    starts
        .windows(2)
        .skip(1)
        .map(|w| w[1].duration_since(w[0]))
        .collect()
}

/// One sample: 1024 features and a label.
#[derive(Clone, Debug)]
struct Item {
    x: Vec<f32>,
    y: i64,
}

#[derive(Clone, Debug)]
struct Batch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 1, Int>,
}

#[derive(Clone, Copy, Debug)]
struct ItemBatcher;

impl<B: Backend> Batcher<B, Item, Batch<B>> for ItemBatcher {
    fn batch(&self, items: Vec<Item>, device: &B::Device) -> Batch<B> {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.x.iter().copied()).collect();
        let y: Vec<i64> = items.iter().map(|i| i.y).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [n, 1024]), device),
            y: Tensor::from_data(TensorData::new(y, [n]), device),
        }
    }
}

/// `n` deterministic samples (a small LCG: no RNG state shared with burn).
fn dataset(n: usize) -> Vec<Item> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    (0..n)
        .map(|i| Item {
            x: (0..1024).map(|_| next()).collect(),
            y: (i % 10) as i64,
        })
        .collect()
}

/// The MLP with burn-train's step traits.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    mlp: BenchMlp<B>,
    /// Mark layer boundaries in the forward (`--overlap boundaries`).
    marked: bool,
}

impl<B: Backend> Net<B> {
    fn classify(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        let out = self.mlp.forward(batch.x, self.marked);
        let loss = CrossEntropyLossConfig::new()
            .init(&out.device())
            .forward(out.clone(), batch.y.clone());
        ClassificationOutput::new(loss, out, batch.y)
    }
}

impl<B: AutodiffBackend> TrainStep for Net<B> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: Batch<B>) -> TrainOutput<ClassificationOutput<B>> {
        mark_step();
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Net<B> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

fn train_loader(
    pg: &ProcessGroup,
    data: &[Item],
    epoch: u64,
) -> Result<DistributedLoader<B, Item, Batch<B>>> {
    let sampler = DistributedSamplerConfig::new(pg.world_size(), pg.rank()).with_seed(1);
    Ok(DistributedLoader::train(
        InMemDataset::new(data.to_vec()),
        ItemBatcher,
        BATCH,
        sampler,
    )?
    .with_start_epoch(epoch))
}

/// One round of the hand-written loop: `steps` DDP steps over the loader.
fn hand_round(
    ddp: &mut DistributedDataParallel<B, Net<B>>,
    optim: &mut impl burn::optim::Optimizer<Net<B>, B>,
    loader: &DistributedLoader<B, Item, Batch<B>>,
) -> Result<()> {
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    for batch in loader.iter() {
        mark_step();
        let out = ddp.forward(|m| m.mlp.forward(batch.x, m.marked))?;
        let loss = loss_fn.forward(out, batch.y);
        let _value: f32 = loss.clone().into_scalar();
        let grads = ddp.backward(loss)?;
        ddp.optimizer_step(optim, 0.01, grads);
    }
    mark_step(); // the end of the last step
    Ok(())
}

/// One round of burn-train's loop: one epoch through `DdpStrategy`.
fn strategy_round(
    pg: &ProcessGroup,
    data: &[Item],
    valid: &[Item],
    epoch: u64,
    dir: &std::path::Path,
    overlap: Overlap,
) -> Result<()> {
    let model = Net {
        mlp: BenchMlp::<B>::new(&Default::default()),
        marked: overlap.marked(),
    };
    let strategy = DdpStrategy::new(pg.clone()).with_ddp_config(overlap.config());
    let train = train_loader(pg, data, epoch)?;
    let valid = DistributedLoader::<Flex, _, _>::eval(
        InMemDataset::new(valid.to_vec()),
        ItemBatcher,
        BATCH,
        pg.world_size(),
        pg.rank(),
    )?;
    let _result = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
        .metrics((LossMetric::new(),))
        .num_epochs(1)
        .with_application_logger(None)
        .renderer(SilentRenderer)
        .distributed(&strategy)
        .launch(Learner::new(model, SgdConfig::new().init(), 0.01));
    mark_step(); // after the last step's bookkeeping (and validation: dropped below)
    strategy.finish().context("the strategy's run")?;
    Ok(())
}

/// Both loops on `pg`, alternating round by round: medians (hand-written, strategy) and the
/// median over rounds of the strategy's median over the hand-written one's.
fn measure(pg: &ProcessGroup, args: &Args) -> Result<(Duration, Duration, f64)> {
    let device = Default::default();
    let data = dataset(args.steps * BATCH * pg.world_size());
    let valid = dataset(BATCH * pg.world_size());
    let dir = std::env::temp_dir().join(format!(
        "train_strategy_bench_{}_{}",
        std::process::id(),
        pg.rank()
    ));
    let mut ddp = DistributedDataParallel::new(
        Net {
            mlp: BenchMlp::<B>::new(&device),
            marked: args.overlap.marked(),
        },
        pg.clone(),
        args.overlap.config(),
    )?;
    let mut optim = SgdConfig::new().init::<B, Net<B>>();
    let (mut hand, mut strat, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        take_intervals();
        hand_round(
            &mut ddp,
            &mut optim,
            &train_loader(pg, &data, round as u64)?,
        )?;
        let h = take_intervals();
        strategy_round(pg, &data, &valid, round as u64, &dir, args.overlap)?;
        // The last interval holds validation and the end of the run, not a step.
        let mut s = take_intervals();
        s.pop();
        if round > 0 {
            // Each round's pair ran back to back, under the same load: their ratio is less
            // noisy than the ratio of the overall medians.
            ratios.push(median(s.clone()).as_secs_f64() / median(h.clone()).as_secs_f64());
            hand.extend(h);
            strat.extend(s);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    Ok((median(hand), median(strat), ratio))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(world: usize, (hand, strat, round_ratio): (Duration, Duration, f64)) {
    println!(
        "| {world} | {:>8.2} | {:>8.2} | {:>6.3} | {:>6.3} |",
        ms(hand),
        ms(strat),
        strat.as_secs_f64() / hand.as_secs_f64().max(1e-12),
        round_ratio
    );
}

fn worker(args: &Args) -> Result<()> {
    let pg = init_from_env().context("joining the 2-process group")?;
    let measured = measure(&pg, args)?;
    if pg.rank() == 0 {
        row(pg.world_size(), measured);
    }
    Ok(())
}

fn main() -> Result<()> {
    if std::env::var("RAYON_NUM_THREADS").is_err() {
        // One compute thread per rank, set before anything starts a thread pool.
        // SAFETY: single-threaded at this point (start of main).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    let args = Args::parse();
    if std::env::var("RANK").is_ok() {
        return worker(&args);
    }
    let (allocator_key, _) = ddp_core::launcher::ALLOCATOR_ENV[0];
    if std::env::var_os(allocator_key).is_none() {
        // glibc reads its malloc settings at start-up: run again with the environment the
        // launcher gives its workers (the world-2 ranks inherit it).
        let status = Command::new(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .envs(ddp_core::launcher::ALLOCATOR_ENV)
            .status()
            .context("re-running with the launcher's allocator settings")?;
        std::process::exit(status.code().unwrap_or(1));
    }
    println!(
        "# DdpStrategy (burn-train's loop) vs a hand-written DDP loop: MLP 1024-2048-2048-10, \
         batch {BATCH} per rank, SGD, 1 compute thread per rank"
    );
    println!(
        "# {} steps per round, {} rounds (first is warm-up), median step-start intervals, \
         --overlap {:?}",
        args.steps, args.rounds, args.overlap
    );
    println!(
        "| world | hand-written ms/step | DdpStrategy ms/step | ratio | median of round ratios |"
    );
    println!("|---|---|---|---|---|");
    let (_server, pg) = world_of_one()?;
    row(1, measure(&pg, &args)?);
    drop(pg);
    ddp_benches::run_two_ranks(&[])
}
