//! The guide's PyTorch example (`docs/guide/pytorch/mlp_ddp.py`: a small MLP, a
//! `DistributedSampler`, torchrun) ported to ddp-burn, line for line.
//!
//! ```text
//! cargo run -p ddp-examples --bin from_pytorch -- --nproc-per-node 2
//! ```
//!
//! The program launches itself once per rank (`launch`, torchrun's equivalent); it also runs
//! under `ddp-run`, torchrun's environment, `srun` or `mpirun`. Rank 0 prints the last batch's
//! loss each epoch, then the accuracy over the whole data set, counted on every rank.

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::AdamConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use clap::Parser;
use ddp_core::data::{DistributedDataLoaderBuilder, DistributedSamplerConfig, ExactShard};
use ddp_core::launcher::{LaunchArgs, LaunchError, WorkerContext};
use ddp_core::metrics::EvalTotals;
use ddp_core::{DdpConfig, DistributedDataParallel};

ddp_core::use_fast_allocator!();

type B = Autodiff<Flex>;

const EPOCHS: usize = 8;
const BATCH: usize = 32;
const LR: f64 = 0.01;
const SEED: u64 = 42;

#[derive(Debug, Parser)]
struct Args {
    /// torchrun's flags: --nproc-per-node, --nnodes, --max-restarts, ...
    #[command(flatten)]
    launch: LaunchArgs,
}

/// 2,048 points in the square [-1, 1]^2; label 1 inside the circle of radius 0.7.
#[derive(Debug, Clone)]
struct Rings;

#[derive(Debug, Clone)]
struct Point {
    x: [f32; 2],
    label: i64,
}

impl Dataset<Point> for Rings {
    fn get(&self, i: usize) -> Option<Point> {
        if i >= self.len() {
            return None;
        }
        let k = i as f64;
        let x = [
            (k * 12.9898).sin() * 0.5 + (k * 0.731).sin() * 0.5,
            (k * 78.233).cos() * 0.5 + (k * 0.317).cos() * 0.5,
        ];
        let label = i64::from(x[0] * x[0] + x[1] * x[1] < 0.49);
        Some(Point {
            x: [x[0] as f32, x[1] as f32],
            label,
        })
    }

    fn len(&self) -> usize {
        2048
    }
}

/// PyTorch's default `collate_fn`: stacks points into `[n, 2]` inputs and `[n]` labels.
#[derive(Debug, Clone)]
struct Stack;

#[derive(Debug, Clone)]
struct Batch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 1, Int>,
}

impl<B: Backend> Batcher<B, Point, Batch<B>> for Stack {
    fn batch(&self, points: Vec<Point>, device: &B::Device) -> Batch<B> {
        let n = points.len();
        let x: Vec<f32> = points.iter().flat_map(|p| p.x).collect();
        let y: Vec<i64> = points.iter().map(|p| p.label).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [n, 2]), device),
            y: Tensor::from_data(TensorData::new(y, [n]), device),
        }
    }
}

/// `nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))`.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Mlp {
            fc1: LinearConfig::new(2, 64).init(device),
            fc2: LinearConfig::new(64, 64).init(device),
            out: LinearConfig::new(64, 2).init(device),
            act: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.act.forward(self.fc1.forward(x));
        let x = self.act.forward(self.fc2.forward(x));
        self.out.forward(x)
    }
}

fn main() -> Result<(), LaunchError> {
    let args = Args::parse();
    // Run plainly, this starts one copy of the program per rank (torchrun's part); in each
    // copy it joins the process group (init_process_group's part) and calls `train`.
    ddp_core::launch(&args.launch, train)
}

fn train(ctx: WorkerContext) -> anyhow::Result<()> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    let pg = ctx.into_process_group();
    let device = Default::default();
    B::seed(&device, SEED);
    // DDP(model): rank 0's weights are copied to every rank.
    let mut ddp =
        DistributedDataParallel::new(Mlp::<B>::new(&device), pg.clone(), DdpConfig::new())?;
    // DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=SEED) and
    // DataLoader(data, batch_size=BATCH, sampler=sampler).
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(SEED);
    let mut loader = DistributedDataLoaderBuilder::new(Stack)
        .batch_size(BATCH)
        .set_device(device)
        .build(Rings, sampler)?;
    let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for epoch in 0..EPOCHS {
        loader.set_epoch(epoch as u64); // a new shuffle every epoch, the same on every rank
        let mut last_loss = f32::NAN;
        for batch in loader.iter() {
            let batch = batch?;
            let logits = ddp.forward(|m| m.forward(batch.x))?;
            let loss = loss_fn.forward(logits, batch.y);
            last_loss = loss.clone().into_scalar();
            let grads = ddp.backward(loss)?; // gradients are averaged over the ranks here
            ddp.optimizer_step(&mut optim, LR, grads); // no zero_grad: grads are a value
        }
        if rank == 0 {
            println!("epoch {epoch}: last batch loss {last_loss:.4}");
        }
    }
    // Accuracy over the whole set: each rank scores every world-th sample, then the counts
    // are summed over the ranks.
    let mut totals = EvalTotals::default();
    let model = ddp.module().valid(); // torch.no_grad(): the model without autodiff
    for i in ExactShard::new(Rings.len(), world, rank)?.indices() {
        let point = Rings.get(i).expect("an index of the shard");
        let batch: Batch<Flex> = Stack.batch(vec![point.clone()], &device);
        let predicted: i64 = model.forward(batch.x).argmax(1).into_scalar().elem();
        totals.add(u64::from(predicted == point.label), 1, 0.0);
    }
    let totals = totals.all_reduce(&pg)?;
    if rank == 0 {
        println!(
            "accuracy {:.2}% of {} points",
            100.0 * totals.accuracy().unwrap_or(0.0),
            totals.count
        );
    }
    Ok(())
}
