//! Uneven inputs with `join`: three ranks with 3, 5 and 7 batches train one model, as PyTorch's
//! `Join` context does, then save one checkpoint.
//!
//! ```text
//! cargo run -p ddp-examples --bin uneven_inputs -- --nproc-per-node 3
//! ```
//!
//! Rank `r` gets `3 + 2r` batches of a synthetic regression task (think: a filtered data set).
//! Each backward first agrees on which ranks still train; a rank with no batches left calls
//! `join`, which answers the others' steps with zero gradients (not counted in the average) and
//! applies the averaged gradients, so every rank ends with the same model and Adam state. Each
//! rank prints how many steps it trained and answered, and a checksum of its parameters (equal
//! on every rank).

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::AdamConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, TrainingState};
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    launch::{LaunchArgs, LaunchError, WorkerContext},
};

type B = Autodiff<Flex>;

#[derive(Debug, Parser)]
struct Args {
    /// Where rank 0 writes the checkpoint after `join`.
    #[arg(long, default_value = "runs/uneven_inputs")]
    checkpoint_dir: String,
    #[command(flatten)]
    launch: LaunchArgs,
}

#[derive(Module, Debug)]
struct Regressor<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> Regressor<B> {
    fn new(device: &B::Device) -> Self {
        Regressor {
            hidden: LinearConfig::new(4, 32).init(device),
            out: LinearConfig::new(32, 1).init(device),
            act: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.out.forward(self.act.forward(self.hidden.forward(x)))
    }
}

/// Batch `step` of rank `rank`: 8 samples of y = x0 - 2 x1 + x2 x3, different on every rank.
fn batch(
    rank: usize,
    step: usize,
    device: &burn::tensor::Device<B>,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..8 {
        let k = (rank * 1000 + step * 8 + i) as f32;
        let x = [
            (k * 0.37).sin(),
            (k * 0.11).cos(),
            (k * 0.53).sin(),
            (k * 0.29).cos(),
        ];
        ys.push(x[0] - 2.0 * x[1] + x[2] * x[3]);
        xs.extend(x);
    }
    (
        Tensor::from_data(TensorData::new(xs, [8, 4]), device),
        Tensor::from_data(TensorData::new(ys, [8, 1]), device),
    )
}

fn main() -> Result<(), LaunchError> {
    let args = Args::parse();
    ddp_core::launch(&args.launch, |ctx| train(ctx, &args))
}

fn train(ctx: WorkerContext, args: &Args) -> anyhow::Result<()> {
    let rank = ctx.rank();
    let device = Default::default();
    let pg = ctx.into_process_group();
    let config = DdpConfig::new().with_uneven_inputs(true);
    let mut ddp = DistributedDataParallel::new(Regressor::<B>::new(&device), pg.clone(), config)?;
    let mut adam = AdamConfig::new().init::<B, Regressor<B>>();
    let batches = 3 + 2 * rank;
    let mut last_loss = f32::NAN;
    for step in 0..batches {
        let (x, y) = batch(rank, step, &device);
        let loss = ddp.forward(|m| MseLoss::new().forward(m.forward(x), y, Reduction::Mean))?;
        last_loss = loss.clone().into_scalar();
        let grads = ddp.backward(loss)?;
        ddp.optimizer_step(&mut adam, 0.01, grads);
    }
    let answered = ddp.join(&mut adam, 0.01)?;
    println!(
        "rank {rank}: trained {batches} steps (last loss {last_loss:.4}), answered {answered} \
         steps after joining, parameter checksum {:.6}",
        checksum(ddp.module())
    );
    // After join every rank holds the same model and optimizer state: rank 0's checkpoint is
    // everyone's, at the job's step count (the same on every rank).
    let steps = (batches + answered) as u64;
    let checkpoints = FullCheckpointer::new(CheckpointConfig::new(&args.checkpoint_dir), pg)?;
    let saved = checkpoints.save(ddp.module(), &adam, &TrainingState::new(1, steps))?;
    if rank == 0 {
        println!("rank 0: checkpoint {}", saved.path.display());
    }
    Ok(())
}

/// Sum of every parameter value: equal on every rank when the replicas are.
fn checksum<M: Module<B>>(m: &M) -> f64 {
    struct Sum(f64);
    impl ModuleVisitor<B> for Sum {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0 += p
                .val()
                .into_data()
                .iter::<f32>()
                .map(f64::from)
                .sum::<f64>();
        }
    }
    let mut sum = Sum(0.0);
    m.visit(&mut sum);
    sum.0
}
