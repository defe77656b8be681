//! Plain DDP, ZeRO stage 1, ZeRO stage 2 and fully sharded parameters (FSDP, one unit per
//! layer) side by side at world 2 on shared memory: what each rank holds between steps
//! (parameters, averaged gradients, Adam state) and the step time.
//!
//! ```text
//! cargo bench -p ddp-benches --bench zero_stages
//! cargo bench -p ddp-benches --bench zero_stages -- --steps 20
//! ```
//!
//! Model: MLP 1024-2048-2048-10 (6.3M parameters, 24 MiB f32), batch 64 per rank, Adam, one
//! compute thread per rank, two processes on one host (`DDP_TRANSPORT=shm`). The four setups
//! train their own copy of the model in interleaved rounds (the first round is warm-up), so
//! machine load hits them alike; times are medians of per-step wall times.
//!
//! - `params`: the trainable bytes the rank holds between steps (a full replica, except FSDP:
//!   its chunk of every unit; FSDP gathers the whole model for each forward and backward).
//! - `grads`: the averaged gradients the rank holds for its optimizer step (DDP and stage 1:
//!   all of them; stage 2: its reduce-scatter block; FSDP: its chunks). Every setup also holds
//!   its full *local* gradient from backward until the reduction.
//! - `adam state`: the optimizer record serialised at full precision (about its memory).
//! - `sent/step`: bytes handed to collectives per step (`ProcessGroup::payload_bytes`).

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use clap::Parser;
use ddp_benches::{BenchMlp, bench_batch, median, run_two_ranks};
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::{
    DdpConfig, DistributedDataParallel, comm::ProcessGroup, init_from_env,
    zero::ZeroRedundancyOptimizer,
};
use std::time::{Duration, Instant};

type B = Autodiff<Flex>;
type Model = BenchMlp<B>;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Measured steps per setup (after one warm-up round).
    #[arg(long, default_value_t = 12)]
    steps: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

const ROUNDS: usize = 4;
const LR: f64 = 1e-4;

fn main() -> Result<()> {
    if std::env::var("RAYON_NUM_THREADS").is_err() {
        // One compute thread per rank, set before anything starts a thread pool.
        // SAFETY: single-threaded at this point (start of main).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    if std::env::var("RANK").is_ok() {
        return worker();
    }
    Args::parse();
    run_two_ranks(&[("DDP_TRANSPORT", "shm")])
}

/// One training step of `ddp` with `optim`; its wall time and the bytes it sent.
fn step<O: Optimizer<Model, B>>(
    pg: &ProcessGroup,
    ddp: &mut DistributedDataParallel<B, Model>,
    optim: &mut O,
) -> Result<(Duration, u64)> {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (x, y) = bench_batch::<B>(&device);
    let sent = pg.payload_bytes();
    let t = Instant::now();
    let out = ddp.forward(|m| m.forward(x, false))?;
    let grads = ddp.backward(loss_fn.forward(out, y))?;
    ddp.optimizer_step(optim, LR, grads);
    Ok((t.elapsed(), pg.payload_bytes() - sent))
}

/// One fully sharded training step; its wall time, the bytes it sent and the gradient bytes
/// this rank kept.
fn fsdp_step<O: Optimizer<ShardedParams<B>, B>>(
    pg: &ProcessGroup,
    fsdp: &mut FullyShardedDataParallel<B, Model>,
    optim: &mut O,
) -> Result<(Duration, u64, u64)> {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (x, y) = bench_batch::<B>(&device);
    let sent = pg.payload_bytes();
    let t = Instant::now();
    let out = fsdp.forward(|m| m.forward(x, false))?;
    let grads = fsdp.backward(loss_fn.forward(out, y))?;
    let held = grads.bytes();
    fsdp.optimizer_step(optim, LR, grads)?;
    Ok((t.elapsed(), pg.payload_bytes() - sent, held))
}

fn state_bytes<M: burn::module::AutodiffModule<B>, O: Optimizer<M, B>>(optim: &O) -> Result<usize> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Ok(Recorder::<B>::record(&rec, optim.to_record(), ())
        .context("serialising Adam's state")?
        .len())
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn worker() -> Result<()> {
    let args = Args::parse();
    let pg = init_from_env()?;
    let device = Default::default();
    let adam = || AdamConfig::new().init::<B, Model>();
    let ddp = |pg: &ProcessGroup| {
        DistributedDataParallel::new(Model::new(&device), pg.clone(), DdpConfig::new())
    };
    let mut plain_ddp = ddp(&pg)?;
    let mut plain = adam();
    let mut one_ddp = ddp(&pg)?;
    let mut one = ZeroRedundancyOptimizer::new(adam(), pg.clone());
    let mut two_ddp = ddp(&pg)?;
    let mut two = ZeroRedundancyOptimizer::stage2(adam(), &mut two_ddp)?;
    let units = FsdpConfig::new().with_units(["l1", "l2", "l3"]);
    let mut fsdp = FullyShardedDataParallel::new(Model::new(&device), pg.clone(), units)?;
    let mut fsdp_adam = AdamConfig::new().init::<B, ShardedParams<B>>();
    let mut fsdp_grads = 0;
    let params = plain_ddp.module().num_params() * 4;

    let mut times: [Vec<Duration>; 4] = Default::default();
    let mut sent = [0u64; 4];
    let per_round = args.steps.div_ceil(ROUNDS);
    for round in 0..=ROUNDS {
        for _ in 0..per_round {
            let (t, s, held) = fsdp_step(&pg, &mut fsdp, &mut fsdp_adam)?;
            fsdp_grads = held;
            let measured = [
                step(&pg, &mut plain_ddp, &mut plain)?,
                step(&pg, &mut one_ddp, &mut one)?,
                step(&pg, &mut two_ddp, &mut two)?,
                (t, s),
            ];
            if round > 0 {
                for (i, (t, s)) in measured.into_iter().enumerate() {
                    times[i].push(t);
                    sent[i] = s;
                }
            }
        }
    }
    // Per setup: params, grads, state, sent/step; every rank's, gathered on every rank.
    let mine: Vec<i64> = [
        [
            params,
            params,
            state_bytes::<Model, _>(&plain)?,
            sent[0] as usize,
        ],
        [
            params,
            one.gradient_bytes().unwrap_or(0),
            one.local_state_bytes()?,
            sent[1] as usize,
        ],
        [
            params,
            two.gradient_bytes().unwrap_or(0),
            two.local_state_bytes()?,
            sent[2] as usize,
        ],
        [
            fsdp.parameter_bytes() as usize,
            fsdp_grads as usize,
            state_bytes::<ShardedParams<B>, _>(&fsdp_adam)?,
            sent[3] as usize,
        ],
    ]
    .iter()
    .flatten()
    .map(|&b| b as i64)
    .collect();
    let mut all = vec![0i64; mine.len() * pg.world_size()];
    pg.all_gather(&mine, &mut all)?;
    if pg.rank() != 0 {
        return Ok(());
    }
    println!(
        "# ZeRO stages and FSDP, world 2 ({}), MLP 1024-2048-2048-10 (6.3M params), Adam, batch 64 per \
         rank, 1 thread per rank, {} steps per setup (median)",
        pg.backend_name(),
        per_round * ROUNDS
    );
    println!(
        "# {:<14} {:>4} {:>11} {:>11} {:>14} {:>11} {:>14} {:>9}",
        "setup",
        "rank",
        "params MiB",
        "grads MiB",
        "adam state MiB",
        "total MiB",
        "sent/step MiB",
        "ms/step"
    );
    let names = ["DDP + Adam", "ZeRO-1", "ZeRO-2", "FSDP"];
    for (i, name) in names.iter().enumerate() {
        let ms = median(times[i].clone()).as_secs_f64() * 1e3;
        for rank in 0..pg.world_size() {
            let row = &all[rank * mine.len() + i * 4..rank * mine.len() + i * 4 + 4];
            println!(
                "  {:<14} {:>4} {:>11.2} {:>11.2} {:>14.2} {:>11.2} {:>14.2} {:>9.1}",
                name,
                rank,
                mib(row[0]),
                mib(row[1]),
                mib(row[2]),
                mib(row[0] + row[1] + row[2]),
                mib(row[3]),
                ms
            );
        }
    }
    Ok(())
}
