//! DDP step time against plain burn training, and the cost of synchronisation.
//!
//! ```text
//! cargo bench -p ddp-benches --bench ddp_step
//! cargo bench -p ddp-benches --bench ddp_step -- --steps 30 --trace target/ddp_step_trace.json
//! ```
//!
//! Model: MLP 1024-2048-2048-10 (6.3M parameters, 24 MiB of f32 gradients), batch 64 per rank,
//! SGD, one compute thread per rank (`RAYON_NUM_THREADS=1`), ranks as separate processes.
//!
//! - world 1: plain burn step (forward, backward, `GradientsParams::from_grads`, SGD) against the
//!   DDP step (forward through taps, backward with buckets, SGD), interleaved in rounds.
//! - world 2: the synchronised step against the same step under `backward_no_sync`; the no-sync
//!   step has no averaged gradients to apply, so the optimizer time measured in the synchronised
//!   steps is added to it. In automatic mode (plain taps), anchored mode
//!   (`DdpConfig::automatic_overlap`) and with layer boundaries marked, with the fraction of
//!   all-reduce time that ran during backward.
//!
//! Times are medians of per-step wall times; compare ratios within one run. `faults/step` is
//! the process's minor page faults per synchronised / no-sync step. The benchmark runs with the
//! allocator settings the launcher gives its workers (`ddp_core::launch::ALLOCATOR_ENV`);
//! `--glibc-defaults` shows what glibc's defaults cost (about 15,000 faults per step here).

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use clap::Parser;
use ddp_benches::{BATCH, BenchMlp, bench_batch, median, run_two_ranks, world_of_one};
use ddp_core::{DdpConfig, DistributedDataParallel, ProcessGroup, init_from_env};
use std::process::Command;
use std::time::{Duration, Instant};

type B = Autodiff<Flex>;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Measured steps per configuration (after warm-up).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Write the Chrome trace of world 2 (boundaries marked) here.
    #[arg(long)]
    trace: Option<String>,
    /// Run with glibc's default malloc settings instead of the launcher's worker defaults
    /// (`ddp_core::launch::ALLOCATOR_ENV`), to see what per-step page faults cost.
    #[arg(long)]
    glibc_defaults: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Minor page faults of this process so far (first touches of memory the allocator just got
/// from the kernel): the hidden cost of buffers that are freed and allocated again every step.
fn minor_faults() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_minflt as u64
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    if std::env::var("RAYON_NUM_THREADS").is_err() {
        // One compute thread per rank, set before anything starts a thread pool.
        // SAFETY: single-threaded at this point (start of main).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    if std::env::var("RANK").is_ok() {
        return world2_worker();
    }
    let args = Args::parse();
    let (allocator_key, _) = ddp_core::launch::ALLOCATOR_ENV[0];
    if !args.glibc_defaults && std::env::var_os(allocator_key).is_none() {
        // glibc reads its malloc settings at start-up: run again with the environment the
        // launcher gives its workers (the world-2 ranks inherit it).
        let status = Command::new(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .envs(ddp_core::launch::ALLOCATOR_ENV)
            .status()
            .context("re-running with the launcher's allocator settings")?;
        std::process::exit(status.code().unwrap_or(1));
    }
    println!("# DDP step benchmark: MLP 1024-2048-2048-10 (6.3M params, 24 MiB f32 gradients)");
    println!(
        "# batch {BATCH} per rank, SGD, 1 compute thread per rank, {} steps per row (median)",
        args.steps
    );
    let allocator: Vec<String> = ddp_core::launch::ALLOCATOR_ENV
        .iter()
        .filter_map(|(k, _)| std::env::var(k).ok().map(|v| format!("{k}={v}")))
        .collect();
    println!(
        "# allocator: {}",
        if allocator.is_empty() {
            "glibc defaults (--glibc-defaults)".to_string()
        } else {
            format!("{} (the launcher's worker defaults)", allocator.join(" "))
        }
    );
    world1(&args)?;
    world2(&args)
}

fn world1(args: &Args) -> Result<()> {
    let device = Default::default();
    let (_server, pg) = world_of_one()?;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut plain_model = BenchMlp::<B>::new(&device);
    let mut plain_opt = SgdConfig::new().init::<B, BenchMlp<B>>();
    let mut ddp = DistributedDataParallel::new(BenchMlp::<B>::new(&device), pg, DdpConfig::new())?;
    let mut ddp_opt = SgdConfig::new().init::<B, BenchMlp<B>>();
    let (mut plain, mut wrapped) = (Vec::new(), Vec::new());
    let rounds = 4;
    for round in 0..=rounds {
        for _ in 0..args.steps.div_ceil(rounds) {
            let (x, y) = bench_batch::<B>(&device);
            let t = Instant::now();
            let loss = loss_fn.forward(plain_model.forward(x, false), y);
            let grads = GradientsParams::from_grads(loss.backward(), &plain_model);
            plain_model = plain_opt.step(0.01, plain_model, grads);
            if round > 0 {
                plain.push(t.elapsed());
            }
        }
        for _ in 0..args.steps.div_ceil(rounds) {
            let (x, y) = bench_batch::<B>(&device);
            let t = Instant::now();
            let out = ddp.forward(|m| m.forward(x, false))?;
            let grads = ddp.backward(loss_fn.forward(out, y))?;
            ddp.optimizer_step(&mut ddp_opt, 0.01, grads);
            if round > 0 {
                wrapped.push(t.elapsed());
            }
        }
    }
    let (p, d) = (median(plain), median(wrapped));
    println!("#\n# world 1: DDP overhead (goal: ratio <= 1.03)");
    println!(
        "# {:<28} {:>10} {:>12}",
        "configuration", "ms/step", "samples/s"
    );
    println!(
        "  {:<28} {:>10.2} {:>12.0}",
        "plain burn",
        ms(p),
        BATCH as f64 / p.as_secs_f64()
    );
    println!(
        "  {:<28} {:>10.2} {:>12.0}",
        "DDP (world 1)",
        ms(d),
        BATCH as f64 / d.as_secs_f64()
    );
    println!(
        "  ratio DDP / plain: {:.3}",
        d.as_secs_f64() / p.as_secs_f64()
    );
    Ok(())
}

fn world2(_args: &Args) -> Result<()> {
    run_two_ranks(&[])
}

struct Measured {
    sync_faults: u64,
    no_sync_faults: u64,
    sync: Duration,
    no_sync: Duration,
    optimizer: Duration,
    overlap: f64,
    comm: Duration,
    after_backward: Duration,
}

fn world2_worker() -> Result<()> {
    let args = Args::parse();
    let pg = init_from_env()?;
    if pg.rank() == 0 {
        println!(
            "#\n# world 2: synchronised step / no_sync step (goal: ratio <= 1.15; PyTorch gloo here: ~2)"
        );
        println!(
            "# {:<22} {:>9} {:>10} {:>9} {:>7} {:>10} {:>12} {:>9} {:>13}",
            "mode",
            "sync ms",
            "no_sync ms",
            "optim ms",
            "ratio",
            "comm ms",
            "after bwd ms",
            "overlap",
            "faults/step"
        );
    }
    // Automatic: plain taps; anchored: `automatic_overlap` (taps at learned depths); layer
    // boundaries: the model marks them.
    for (mode, marked, anchored) in [
        ("automatic", false, false),
        ("anchored (auto overlap)", false, true),
        ("layer boundaries", true, false),
    ] {
        let config = match (&args.trace, marked) {
            (Some(path), true) => DdpConfig::new()
                .with_timeline_path(Some(path.clone()))
                .with_timeline_steps(3),
            _ => DdpConfig::new(),
        }
        .with_automatic_overlap(anchored);
        let m = measure_world2(&pg, &args, marked, config)?;
        if pg.rank() == 0 {
            let no_sync_step = m.no_sync + m.optimizer;
            println!(
                "  {:<22} {:>9.2} {:>10.2} {:>9.2} {:>7.3} {:>10.2} {:>12.2} {:>8.0}% {:>6}/{:<6}",
                mode,
                ms(m.sync),
                ms(no_sync_step),
                ms(m.optimizer),
                m.sync.as_secs_f64() / no_sync_step.as_secs_f64(),
                ms(m.comm),
                ms(m.after_backward),
                m.overlap * 100.0,
                m.sync_faults,
                m.no_sync_faults
            );
        }
    }
    if let (0, Some(path)) = (pg.rank(), &args.trace) {
        println!("# Chrome trace of the first 3 steps with boundaries: {path}");
    }
    Ok(())
}

fn measure_world2(
    pg: &ProcessGroup,
    args: &Args,
    marked: bool,
    config: DdpConfig,
) -> Result<Measured> {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut ddp = DistributedDataParallel::new(BenchMlp::<B>::new(&device), pg.clone(), config)?;
    let mut opt = SgdConfig::new().init::<B, BenchMlp<B>>();
    let (mut sync, mut no_sync, mut optim, mut overlap, mut comm, mut after) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let (mut sync_faults, mut no_sync_faults) = (0, 0);
    let rounds = 4;
    for round in 0..=rounds {
        for _ in 0..args.steps.div_ceil(rounds) {
            let (x, y) = bench_batch::<B>(&device);
            let f = minor_faults();
            let t = Instant::now();
            let out = ddp.forward(|m| m.forward(x, marked))?;
            let grads = ddp.backward(loss_fn.forward(out, y))?;
            let o = Instant::now();
            ddp.optimizer_step(&mut opt, 0.01, grads);
            if round > 0 {
                optim.push(o.elapsed());
                sync.push(t.elapsed());
                sync_faults += minor_faults() - f;
                let s = ddp.last_step_stats().cloned().unwrap_or_default();
                overlap.push(s.overlap_fraction());
                comm.push(s.comm);
                after.push(s.sync_after_backward);
            }
        }
        for _ in 0..args.steps.div_ceil(rounds) {
            let (x, y) = bench_batch::<B>(&device);
            let f = minor_faults();
            let t = Instant::now();
            let out = ddp.forward(|m| m.forward(x, marked))?;
            ddp.backward_no_sync(loss_fn.forward(out, y))?;
            if round > 0 {
                no_sync.push(t.elapsed());
                no_sync_faults += minor_faults() - f;
            }
        }
        // Flush the accumulated gradients so the next round starts clean (not timed).
        let (x, y) = bench_batch::<B>(&device);
        let out = ddp.forward(|m| m.forward(x, marked))?;
        let _ = ddp.backward(loss_fn.forward(out, y))?;
    }
    overlap.sort_by(|a, b| a.total_cmp(b));
    let measured = (rounds * args.steps.div_ceil(rounds)).max(1) as u64;
    Ok(Measured {
        sync_faults: sync_faults / measured,
        no_sync_faults: no_sync_faults / measured,
        sync: median(sync),
        no_sync: median(no_sync),
        optimizer: median(optim),
        overlap: overlap[overlap.len() / 2],
        comm: median(comm),
        after_backward: median(after),
    })
}
