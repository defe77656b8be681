//! DDP step over TCP with the PowerSGD hook against plain DDP, 2 ranks (processes).
//!
//! ```text
//! cargo bench -p ddp-benches --bench powersgd_tcp
//! cargo bench -p ddp-benches --bench powersgd_tcp -- --steps 20 --rank 4
//! ```
//!
//! Model: MLP 1024-2048-2048-10 (6.3M parameters, 24 MiB of f32 gradients), batch 64 per rank,
//! SGD, one compute thread per rank, `DDP_TRANSPORT=tcp` (loopback here: a stand-in for a link
//! between hosts). Reports the median step time, the bytes each rank handed to collectives per
//! step (`ProcessGroup::payload_bytes`), and the time the hook spent per step. PowerSGD starts
//! compressing after 2 exact steps, which are not measured.

use anyhow::Result;
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::SgdConfig;
use clap::Parser;
use ddp_benches::{BATCH, BenchMlp, bench_batch, median, run_two_ranks};
use ddp_core::hooks::PowerSgdConfig;
use ddp_core::{DdpConfig, DistributedDataParallel, comm::ProcessGroup, init_from_env};
use std::time::{Duration, Instant};

type B = Autodiff<Flex>;
const START_ITER: usize = 2;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Measured steps per configuration (after warm-up).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// PowerSGD rank.
    #[arg(long, default_value_t = 4)]
    rank: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    if std::env::var("RAYON_NUM_THREADS").is_err() {
        // SAFETY: single-threaded at this point (start of main).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    if std::env::var("RANK").is_ok() {
        return worker();
    }
    let mut env = vec![(ddp_comm::TRANSPORT_ENV, "tcp")];
    env.extend(ddp_core::launcher::ALLOCATOR_ENV);
    run_two_ranks(&env)
}

fn worker() -> Result<()> {
    let args = Args::parse();
    let pg = init_from_env()?;
    if pg.rank() == 0 {
        println!("# DDP step over TCP, 2 ranks: MLP 1024-2048-2048-10 (24 MiB f32 gradients)");
        println!(
            "# batch {BATCH} per rank, SGD, 1 compute thread per rank, {} steps (median), transport {}",
            args.steps,
            pg.backend_name()
        );
        println!(
            "# {:<20} {:>9} {:>12} {:>14} {:>9}",
            "reduction", "ms/step", "samples/s", "MiB sent/step", "bytes"
        );
    }
    let plain = measure(&pg, &args, None)?;
    let compressed = measure(&pg, &args, Some(args.rank))?;
    if pg.rank() == 0 {
        for (name, (step, bytes)) in [
            ("plain all-reduce".to_string(), plain),
            (format!("PowerSGD rank {}", args.rank), compressed),
        ] {
            println!(
                "  {:<20} {:>9.2} {:>12.0} {:>14.3} {:>8.1}x",
                name,
                step.as_secs_f64() * 1e3,
                (2 * BATCH) as f64 / step.as_secs_f64(),
                bytes as f64 / (1 << 20) as f64,
                plain.1 as f64 / bytes as f64
            );
        }
        println!(
            "  step time PowerSGD / plain: {:.3}",
            compressed.0.as_secs_f64() / plain.0.as_secs_f64()
        );
    }
    Ok(())
}

/// Median step time and bytes sent per step, with PowerSGD of `rank` or plain.
fn measure(pg: &ProcessGroup, args: &Args, rank: Option<usize>) -> Result<(Duration, u64)> {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut ddp =
        DistributedDataParallel::new(BenchMlp::<B>::new(&device), pg.clone(), DdpConfig::new())?;
    if let Some(r) = rank {
        let hook = PowerSgdConfig::new()
            .with_rank(r)
            .with_start_iter(START_ITER)
            .init()?;
        ddp.register_comm_hook(hook)?;
    }
    let mut opt = SgdConfig::new().init::<B, BenchMlp<B>>();
    let mut times = Vec::new();
    let mut sent = 0;
    for step in 0..START_ITER + 2 + args.steps {
        let (x, y) = bench_batch::<B>(&device);
        let before = pg.payload_bytes();
        let t = Instant::now();
        let out = ddp.forward(|m| m.forward(x, false))?;
        let grads = ddp.backward(loss_fn.forward(out, y))?;
        ddp.optimizer_step(&mut opt, 0.01, grads);
        if step >= START_ITER + 2 {
            times.push(t.elapsed());
            sent += pg.payload_bytes() - before;
        }
    }
    Ok((median(times), sent / args.steps.max(1) as u64))
}
