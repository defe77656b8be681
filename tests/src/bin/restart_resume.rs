//! Test program of `tests/processes/launch_restart_resume.rs`: DDP training with a checkpoint
//! every epoch, resumed by default, under `launch()`.
//!
//! `restart_resume --nproc-per-node 2 [--max-restarts 1] [--kill-rank R] -- <checkpoint-dir> <output-file> [kill-step]`
//!
//! With `kill-step`, rank `--kill-rank` (default 1) SIGKILLs itself at that global step on the
//! first attempt only; with
//! `--max-restarts 1` the launcher restarts the group, which resumes from the last checkpoint.
//! Rank 0 writes the final parameters (little-endian f32) to `<output-file>`.

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::AdamConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Device, Tensor, TensorData};
use clap::Parser;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, LoadOutcome, TrainingState};
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    data::{DistributedDataLoaderBuilder, DistributedSamplerConfig},
    launch,
    launch::{LaunchArgs, LaunchError, WorkerContext},
};

type B = Autodiff<Flex>;

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// The rank that kills itself at `kill_step`.
    #[arg(long, default_value_t = 1)]
    kill_rank: usize,
    checkpoint_dir: String,
    output: String,
    kill_step: Option<u64>,
}

#[derive(Clone)]
struct Rows;

impl Batcher<B, [f32; 5], (Tensor<B, 2>, Tensor<B, 2>)> for Rows {
    fn batch(&self, items: Vec<[f32; 5]>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|r| r[..4].to_vec()).collect();
        let y: Vec<f32> = items.iter().map(|r| r[4]).collect();
        (
            Tensor::from_data(TensorData::new(x, [n, 4]), device),
            Tensor::from_data(TensorData::new(y, [n, 1]), device),
        )
    }
}

fn main() -> Result<(), LaunchError> {
    let args = Args::parse();
    launch(&args.launch, |ctx| train(ctx, &args))
}

fn train(ctx: WorkerContext, args: &Args) -> Result<()> {
    let (rank, world, attempt) = (ctx.rank(), ctx.world_size(), ctx.restart_count());
    let pg = ctx.into_process_group();
    let device = Default::default();
    B::seed(&device, 3);
    let rows: Vec<[f32; 5]> = (0..48)
        .map(|i| {
            let x = [
                (i % 7) as f32 / 7.0,
                (i % 5) as f32 / 5.0,
                (i % 3) as f32,
                1.0,
            ];
            [x[0], x[1], x[2], x[3], 2.0 * x[0] - x[1] + 0.5 * x[2]]
        })
        .collect();
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(9);
    let mut loader = DistributedDataLoaderBuilder::new(Rows)
        .batch_size(4)
        .build(InMemDataset::new(rows), sampler)?;
    let mut model: Linear<B> = LinearConfig::new(4, 1).init(&device);
    let mut optim = AdamConfig::new().init::<B, Linear<B>>();
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(&args.checkpoint_dir), pg.clone())?;
    let (mut epoch0, mut step) = (0, 0);
    if let LoadOutcome::Resumed(r) = ckpt.load_latest(&device, &mut model, &mut optim)? {
        r.restore_loader(&mut loader)?;
        (epoch0, step) = (r.state.epoch, r.state.global_step);
        if rank == 0 {
            println!("RESUMED attempt={attempt} epoch={epoch0} step={step}");
        }
    }
    let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new())?;
    for epoch in epoch0..4 {
        loader.set_epoch(epoch);
        for batch in loader.iter() {
            let (x, y) = batch?;
            if attempt == 0 && rank == args.kill_rank && args.kill_step == Some(step) {
                // SAFETY: raising a signal on our own process.
                unsafe { libc::raise(libc::SIGKILL) };
            }
            let pred = ddp.forward(|m| m.forward(x))?;
            let grads = ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))?;
            ddp.optimizer_step(&mut optim, 0.05, grads);
            step += 1;
        }
        ckpt.save(
            ddp.module(),
            &optim,
            &TrainingState::new(epoch + 1, step).with_sampler(loader.state()),
        )?;
    }
    if rank == 0 {
        struct Collect(Vec<u8>);
        impl ModuleVisitor<B> for Collect {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let data = p.val().into_data().convert::<f32>();
                self.0.extend(data.iter::<f32>().flat_map(f32::to_le_bytes));
            }
        }
        let mut c = Collect(Vec::new());
        ddp.module().visit(&mut c);
        std::fs::write(&args.output, c.0).with_context(|| format!("writing {}", args.output))?;
    }
    Ok(())
}
