//! The digits classifier trained with burn-train's usual builder (`SupervisedTraining` +
//! `Learner`, its metrics and renderer), made distributed by one call: `.distributed(&strategy)`.
//!
//! ```sh
//! cargo run --release -p ddp-train --example digits_learner -- --nproc-per-node 2
//! ```
//!
//! `launch()` makes the binary its own launcher: run plainly, it starts one copy per rank and
//! supervises them; each copy joins the process group and trains its shard. Rank 0 renders,
//! writes burn-train's logs and checkpoints under `--dir` (each epoch, and every
//! `--checkpoint-every-n-steps` optimizer steps inside epochs), and prints the test accuracy
//! of the trained model. Run it again and it resumes at the latest checkpoint, inside an epoch
//! if that is a step checkpoint (`--fresh` starts over); with `--max-restarts N`, a group
//! restarted after a failure resumes the same way. Checkpoints are rank 0's alone
//! (`DdpStrategy::with_checkpoints`: written atomically, sent to the other ranks on resume),
//! so the ranks need no shared filesystem.

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};
use burn_train::metric::{AccuracyMetric, LossMetric};
use burn_train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use clap::Parser;
use ddp_core::checkpoint::lock_dir;
use ddp_core::{data::DistributedSamplerConfig, launch, launch::LaunchArgs};
use ddp_examples::digits::{DigitBatch, DigitBatcher, DigitDataset, load_digits, split};
use ddp_examples::models::DigitsMlp;
use ddp_train::{DdpStrategy, DistributedLoader, DistributedTrainingExt, resume_point};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

type B = Autodiff<Flex>;

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Epochs.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Images per rank and step (the global batch is this times the world size).
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Where burn-train writes its logs and checkpoints (rank 0 only; on resume rank 0 reads
    /// them and sends them to the other ranks).
    #[arg(long, default_value = "target/digits-learner")]
    dir: PathBuf,
    /// Start over instead of resuming from the latest checkpoint in `--dir` (first attempt
    /// only: a restart after a failure always resumes).
    #[arg(long)]
    fresh: bool,
    /// Also checkpoint inside epochs, every N optimizer steps (0: at epoch ends only), so a
    /// restart loses at most N steps.
    #[arg(long, default_value_t = 0)]
    checkpoint_every_n_steps: usize,
    /// Fault injection for the restart test: in the first attempt, rank 1 SIGKILLs itself as
    /// it starts its N-th training step (counted over the whole run, from 1).
    #[arg(long)]
    kill_rank1_at_step: Option<usize>,
    /// Seed of the initial weights (every rank gets rank 0's anyway).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Rank 0 writes the trained parameters here, as little-endian f32 in module order (for
    /// comparing runs bit for bit).
    #[arg(long)]
    weights_out: Option<PathBuf>,
}

/// Every float parameter of `module`, in module order.
fn flat_params<Bk: Backend, M: Module<Bk>>(module: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Bk, D>>) {
            self.0
                .extend(p.val().into_data().convert::<f32>().iter::<f32>());
        }
    }
    let mut c = Collect(Vec::new());
    module.visit(&mut c);
    c.0
}

/// The examples' MLP with burn-train's step traits.
#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    mlp: DigitsMlp<B>,
}

/// `--kill-rank1-at-step`: the training step at which this process kills itself (0: never).
static KILL_AT_STEP: AtomicUsize = AtomicUsize::new(0);
/// Training steps this process has started.
static STEPS_STARTED: AtomicUsize = AtomicUsize::new(0);

impl<B: Backend> Classifier<B> {
    fn forward_classification(&self, batch: DigitBatch<B>) -> ClassificationOutput<B> {
        let output = self.mlp.forward(batch.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Classifier<B> {
    type Input = DigitBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: DigitBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let started = STEPS_STARTED.fetch_add(1, Ordering::Relaxed) + 1;
        if started == KILL_AT_STEP.load(Ordering::Relaxed) {
            eprintln!("rank 1: killing itself at training step {started} (--kill-rank1-at-step)");
            // SAFETY: a signal to this process itself.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let item = self.forward_classification(batch);
        TrainOutput::new(self, item.loss.backward(), item) // a plain backward, unchanged
    }
}

impl<B: Backend> InferenceStep for Classifier<B> {
    type Input = DigitBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: DigitBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    launch(&args.launch, |ctx| -> Result<()> {
        let ctx_restart = ctx.is_restart();
        let fresh = args.fresh && !ctx_restart;
        let pg = ctx.into_process_group();
        let (world, rank) = (pg.world_size(), pg.rank());
        // One job per directory: rank 0 holds its lock for the whole run, taken before
        // `--fresh` removes anything (so the strategy need not take it again).
        let _dir_lock = if rank == 0 {
            std::fs::create_dir_all(&args.dir).context("creating the training directory")?;
            Some(lock_dir(&args.dir).context("locking the training directory")?)
        } else {
            None
        };
        if fresh && rank == 0 {
            match std::fs::remove_dir_all(args.dir.join("checkpoint")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).context("removing old checkpoints (--fresh)");
                }
                _ => {}
            }
        }
        if rank == 1 && !ctx_restart {
            KILL_AT_STEP.store(args.kill_rank1_at_step.unwrap_or(0), Ordering::Relaxed);
        }
        // Rank 0's latest complete checkpoint (an epoch end, or a step inside a later epoch),
        // on every rank (only rank 0 reads the directory).
        let resume = resume_point(&pg, &args.dir)?;
        match resume {
            Some(point) if point.is_mid_epoch() => println!(
                "rank {rank}: resuming inside epoch {}, after step {} from {}",
                point.epochs_done + 1,
                point.steps_done,
                args.dir.display()
            ),
            Some(point) => println!(
                "rank {rank}: resuming after epoch {} from {}",
                point.epochs_done,
                args.dir.display()
            ),
            None => {}
        }
        let device = Default::default();
        B::seed(&device, args.seed);
        let (train_items, test_items) = split(load_digits()?, 7, 0.8);
        let test_copy = test_items.clone();

        let strategy = DdpStrategy::new(pg.clone())
            .with_checkpoints(&args.dir)
            .with_dir_lock(false) // rank 0 holds the lock already (taken before --fresh)
            .with_checkpoint_every_n_steps(args.checkpoint_every_n_steps)
            .with_resume(resume); // loads it; `distributed` tells burn-train the epoch
        let sampler = DistributedSamplerConfig::new(world, rank).with_seed(42);
        let train = DistributedLoader::<B, _, _>::train(
            DigitDataset(train_items),
            DigitBatcher,
            args.batch_size,
            sampler,
        )?
        .with_resume(resume) // starts the sampler there (epoch and position)
        .with_abort_group(pg.clone());
        let valid = DistributedLoader::<Flex, _, _>::eval(
            DigitDataset(test_items),
            DigitBatcher,
            256,
            world,
            rank,
        )?
        .with_abort_group(pg.clone());

        let model = Classifier::<B> {
            mlp: DigitsMlp::new(128, &device),
        };
        let training = SupervisedTraining::new(&args.dir, Arc::new(train), Arc::new(valid))
            .metrics((AccuracyMetric::new(), LossMetric::new()))
            .num_epochs(args.epochs)
            .summary();
        let training = training.distributed(&strategy); // the one call that makes it distributed
        let learner = Learner::new(model, AdamConfig::new().init(), args.lr);
        let result = training.launch(learner);
        let report = strategy.finish().context("distributed training")?;
        if rank == 0 {
            // The trained model (identical on every rank) on the whole test split.
            let batch: DigitBatch<Flex> = DigitBatcher.batch(test_copy, &device);
            let n = batch.targets.dims()[0];
            let out = InferenceStep::step(&result.model, batch);
            let correct: i64 = out
                .output
                .argmax(1)
                .squeeze::<1>()
                .equal(out.targets)
                .int()
                .sum()
                .into_scalar()
                .elem();
            println!(
                "world {world}: {} epochs, {} optimizer steps; test accuracy {:.2}% ({correct}/{n} images)",
                report.last_epoch,
                report.optimizer_steps,
                100.0 * correct as f64 / n as f64,
            );
            if let Some(path) = &args.weights_out {
                let bytes: Vec<u8> = flat_params::<Flex, _>(&result.model)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                std::fs::write(path, bytes)
                    .with_context(|| format!("writing the weights to {}", path.display()))?;
            }
        }
        Ok(())
    })?;
    Ok(())
}
