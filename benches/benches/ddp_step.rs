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
//! Overlap table (`--overlap-only` runs just this): for the MLP above, the transformer
//! example's `TinyGpt` (d_model 256, 4 layers, batch 32 x 13 tokens) and a CNN shaped like the
//! `digits_cnn` example's (SyncBatchNorm over the ranks, 32 feature maps, batch 64), at world 2,
//! every mode with DDP's default caps (`DdpConfig::min_buckets` splits these small models into
//! at least 4 buckets): step time (forward, backward, optimizer) and the share of all-reduce time
//! that ran during backward, with DDP's default, with overlap off (`automatic_overlap(false)`, plain
//! taps) and with layer boundaries marked (overlap off otherwise); modes are interleaved in
//! rounds of one step each. `/ off` is the median over rounds of the step time over overlap
//! off's in the same round, `95% CI` that median's distribution-free confidence interval (one
//! reaching 1.00 or below: no slowdown measurable in this many rounds; none under 6 rounds).
//! `ready early` is the median number of buckets that were ready at least 1 ms before
//! backward ended (`StepStats::bucket_ready`). World 1: the default's step time over overlap
//! off for each model, the same way (the cost of its anchors; goal <= 1.03). `--worlds 1` runs
//! only the world-1 tables.
//!
//! Times are medians of per-step wall times; compare ratios within one run. `faults/step` is
//! the process's minor page faults per step (world 1: plain / DDP; world 2: synchronised /
//! no-sync step, in rank 0's process): the difference between plain and DDP, and between
//! synchronised and no-sync steps, is what DDP's own buffers cost per step; the rest is burn's
//! per-step tensors. `--allocators glibc,launcher,mimalloc` runs every table once per
//! allocator, each in fresh processes: glibc's defaults, glibc with the settings the launcher
//! gives its workers (`ddp_core::launcher::ALLOCATOR_ENV`, the default row), mimalloc (what the
//! examples use); see `ddp_benches::allocator`.

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use clap::Parser;
use ddp_benches::allocator::{SwitchAllocator, allocator_env, allocator_env_removed, minor_faults};
use ddp_benches::{BATCH, BenchMlp, bench_batch, median, run_two_ranks, world_of_one};
use ddp_core::{DdpConfig, DistributedDataParallel, comm::ProcessGroup, init_from_env};
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
    /// Allocators to run every table with, each in fresh processes: glibc, launcher (glibc
    /// with the launcher's worker settings), hugetlb, mimalloc, jemalloc (with the `jemalloc`
    /// feature).
    #[arg(long, value_delimiter = ',', default_value = "launcher")]
    allocators: Vec<String>,
    /// The allocator of this process (set by the parent for each row).
    #[arg(long, hide = true)]
    allocator_row: Option<String>,
    /// Measured steps per model and mode in the overlap table (after two warm-up rounds).
    #[arg(long, default_value_t = 12)]
    overlap_steps: usize,
    /// Only the overlap table (default vs off vs boundaries, three models).
    #[arg(long)]
    overlap_only: bool,
    /// Models of the overlap table, comma-separated: mlp, transformer, cnn.
    #[arg(long, value_delimiter = ',', default_value = "mlp,transformer,cnn")]
    models: Vec<String>,
    /// World sizes to run, comma-separated: 1 (DDP's cost in one process), 2 (two ranks).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    worlds: Vec<usize>,
    /// A Python interpreter with torch: PyTorch DDP (gloo) on the transformer's shape
    /// (`benches/pytorch/ddp_overlap.py`), printed under the overlap table.
    #[arg(long, env = "DDP_STEP_PYTHON")]
    python: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[global_allocator]
static GLOBAL: SwitchAllocator = SwitchAllocator;

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
    let Some(allocator) = args.allocator_row.clone() else {
        // The allocator and glibc's malloc settings are fixed at start-up: run every table
        // again in a fresh process per allocator (the world-2 ranks inherit its environment).
        for name in &args.allocators {
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.args(std::env::args_os().skip(1))
                .args(["--allocator-row", name]);
            for key in allocator_env_removed() {
                cmd.env_remove(key);
            }
            let status = cmd
                .envs(allocator_env(name)?)
                .status()
                .with_context(|| format!("running the {name} allocator's tables"))?;
            if !status.success() {
                anyhow::bail!("the {name} allocator's run failed ({status})");
            }
        }
        return Ok(());
    };
    println!("# DDP step benchmark: MLP 1024-2048-2048-10 (6.3M params, 24 MiB f32 gradients)");
    println!(
        "# batch {BATCH} per rank, SGD, 1 compute thread per rank, {} steps per row (median)",
        args.steps
    );
    println!("# allocator: {allocator} (ddp_benches::allocator)");
    if let Some(w) = args.worlds.iter().find(|&&w| w != 1 && w != 2) {
        anyhow::bail!("--worlds {w}: this bench runs world sizes 1 and 2");
    }
    if args.worlds.contains(&1) {
        if !args.overlap_only {
            world1(&args)?;
        }
        overlap::world1(&args)?;
    }
    if args.worlds.contains(&2) {
        world2(&args)?;
    }
    if let Some(python) = &args.python {
        pytorch_overlap(python, &args)?;
    }
    Ok(())
}

/// PyTorch DDP (gloo) on the transformer's shape: its step time and hidden share, as a row
/// under the overlap table.
fn pytorch_overlap(python: &str, args: &Args) -> Result<()> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/pytorch/ddp_overlap.py");
    let out = Command::new(python)
        .args([script, "--steps", &args.overlap_steps.to_string()])
        .output()
        .with_context(|| format!("running {python} {script}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let result = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(|r| {
            r.split_whitespace()
                .map(|v| v.parse::<f64>().ok())
                .collect::<Vec<_>>()
        });
    let Some([Some(step_ms), Some(hidden)]) = result.as_deref() else {
        anyhow::bail!(
            "{script} gave no result (exit {}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for line in text.lines().filter(|l| l.starts_with('#')) {
        println!("{line}");
    }
    println!(
        "  {:<20} {:<26} {:>9.2} {:>7} {:>13} {:>8.0}%",
        "transformer 3.2M", "PyTorch DDP (gloo)", step_ms, "-", "-", hidden
    );
    Ok(())
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
    let (mut plain_faults, mut wrapped_faults) = (0, 0);
    let rounds = 4;
    for round in 0..=rounds {
        for _ in 0..args.steps.div_ceil(rounds) {
            let (x, y) = bench_batch::<B>(&device);
            let (t, f) = (Instant::now(), minor_faults());
            let loss = loss_fn.forward(plain_model.forward(x, false), y);
            let grads = GradientsParams::from_grads(loss.backward(), &plain_model);
            plain_model = plain_opt.step(0.01, plain_model, grads);
            if round > 0 {
                plain.push(t.elapsed());
                plain_faults += minor_faults() - f;
            }
        }
        for _ in 0..args.steps.div_ceil(rounds) {
            let (x, y) = bench_batch::<B>(&device);
            let (t, f) = (Instant::now(), minor_faults());
            let out = ddp.forward(|m| m.forward(x, false))?;
            let grads = ddp.backward(loss_fn.forward(out, y))?;
            ddp.optimizer_step(&mut ddp_opt, 0.01, grads);
            if round > 0 {
                wrapped.push(t.elapsed());
                wrapped_faults += minor_faults() - f;
            }
        }
    }
    let measured = plain.len().max(1) as u64;
    let (p, d) = (median(plain), median(wrapped));
    println!("#\n# world 1: DDP overhead (goal: ratio <= 1.03)");
    println!(
        "# {:<28} {:>10} {:>12} {:>12}",
        "configuration", "ms/step", "samples/s", "faults/step"
    );
    println!(
        "  {:<28} {:>10.2} {:>12.0} {:>12}",
        "plain burn",
        ms(p),
        BATCH as f64 / p.as_secs_f64(),
        plain_faults / measured
    );
    println!(
        "  {:<28} {:>10.2} {:>12.0} {:>12}",
        "DDP (world 1)",
        ms(d),
        BATCH as f64 / d.as_secs_f64(),
        wrapped_faults / measured
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
    if !args.overlap_only {
        sync_table(&pg, &args)?;
    }
    overlap::world2(&pg, &args)
}

fn sync_table(pg: &ProcessGroup, args: &Args) -> Result<()> {
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
    // Plain taps: overlap off; anchored: `automatic_overlap` (taps at learned depths); layer
    // boundaries: the model marks them (taps plain otherwise).
    for (mode, marked, anchored) in [
        ("plain taps (off)", false, false),
        ("anchored (automatic)", false, true),
        ("layer boundaries", true, false),
    ] {
        let config = match (&args.trace, marked) {
            (Some(path), true) => DdpConfig::new()
                .with_timeline_path(Some(path.clone()))
                .with_timeline_steps(3),
            _ => DdpConfig::new(),
        }
        .with_automatic_overlap(anchored);
        let m = measure_world2(pg, args, marked, config)?;
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

/// The overlap table: default vs overlap off vs layer boundaries on three models.
mod overlap {
    use super::{Args, B, ms};
    use anyhow::{Result, bail};
    use burn::optim::{Optimizer, SgdConfig};
    use ddp_benches::workloads::{ConvNet, Gpt, Mlp, Workload};
    use ddp_benches::{median, median_f64, median_ratio, world_of_one};
    use ddp_core::{
        DdpConfig, DistributedDataParallel, comm::ProcessGroup, nn::SyncBatchNormGroup,
    };
    use std::time::{Duration, Instant};

    type Device = burn::backend::flex::FlexDevice;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Mode {
        Default,
        Off,
        Boundaries,
    }

    impl Mode {
        const ALL: [Mode; 3] = [Mode::Default, Mode::Off, Mode::Boundaries];
        fn label(self) -> &'static str {
            match self {
                Mode::Default => "default",
                Mode::Off => "overlap off",
                Mode::Boundaries => "boundaries (off + marks)",
            }
        }
        /// DDP's default configuration (caps included), overlap switched off in two modes.
        fn config(self) -> DdpConfig {
            let config = DdpConfig::new();
            match self {
                Mode::Default => config,
                Mode::Off | Mode::Boundaries => config.with_automatic_overlap(false),
            }
        }
    }

    #[derive(Default)]
    struct Row {
        step: Vec<Duration>,
        overlap: Vec<f64>,
        comm: Vec<Duration>,
        early: Vec<usize>,
        buckets: usize,
    }

    fn median_u(mut v: Vec<usize>) -> usize {
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }

    /// One synchronised step; returns its wall time.
    fn step<W: Workload<B>>(
        ddp: &mut DistributedDataParallel<B, W::M>,
        opt: &mut impl Optimizer<W::M, B>,
        marked: bool,
        n: usize,
        device: &Device,
    ) -> Result<Duration> {
        let t = Instant::now();
        let loss = ddp.forward(|m| W::loss(m, marked, n, device))?;
        let grads = ddp.backward(loss)?;
        ddp.optimizer_step(opt, 0.001, grads);
        Ok(t.elapsed())
    }

    /// Every mode of one model, interleaved step by step: each round runs one step of every
    /// mode, so a slow moment of the machine falls on all of them and the per-round ratios
    /// (see [`ratios`]) compare like with like. The first rounds warm up: buckets are rebuilt
    /// and depths learned there.
    fn measure<W: Workload<B>>(
        pg: &ProcessGroup,
        modes: &[Mode],
        steps: usize,
    ) -> Result<Vec<(Mode, Row)>> {
        let device = Default::default();
        let group = if pg.world_size() > 1 {
            Some(SyncBatchNormGroup::new(pg)?)
        } else {
            None
        };
        let mut runs = Vec::new();
        for &mode in modes {
            let marked = mode == Mode::Boundaries;
            let model = W::model(&device, marked, group.clone());
            let ddp = DistributedDataParallel::new(model, pg.clone(), mode.config())?;
            runs.push((
                mode,
                ddp,
                SgdConfig::new().init::<B, W::M>(),
                Row::default(),
            ));
        }
        let warm_up = 2;
        let mut n = 0;
        for round in 0..warm_up + steps.max(1) {
            for (mode, ddp, opt, row) in runs.iter_mut() {
                let marked = *mode == Mode::Boundaries;
                n += 1;
                let t = step::<W>(ddp, opt, marked, n, &device)?;
                if round < warm_up {
                    continue;
                }
                let s = ddp.last_step_stats().cloned().unwrap_or_default();
                row.step.push(t);
                row.overlap.push(s.overlap_fraction());
                row.comm.push(s.comm);
                row.early
                    .push(s.buckets_ready_before_backward_end(Duration::from_millis(1)));
                row.buckets = s.buckets;
            }
        }
        Ok(runs
            .into_iter()
            .map(|(mode, _, _, row)| (mode, row))
            .collect())
    }

    /// Step time over `base`'s in the same round, per round: the median and its 95% interval
    /// ([`median_ratio`]).
    fn ratios(row: &Row, base: &Row) -> (f64, String) {
        median_ratio(
            row.step
                .iter()
                .zip(&base.step)
                .map(|(t, b)| t.as_secs_f64() / b.as_secs_f64().max(1e-9))
                .collect(),
        )
    }

    fn table<W: Workload<B>>(pg: &ProcessGroup, steps: usize) -> Result<()> {
        let rows = measure::<W>(pg, &Mode::ALL, steps)?;
        if pg.rank() != 0 {
            return Ok(());
        }
        let Some(off) = rows.iter().find(|(m, _)| *m == Mode::Off).map(|(_, r)| r) else {
            bail!("the overlap table needs the overlap-off mode");
        };
        for (mode, row) in &rows {
            let (ratio, interval) = ratios(row, off);
            println!(
                "  {:<20} {:<26} {:>9.2} {:>7.3} {:>13} {:>8.0}% {:>9.2} {:>5}/{:<3}",
                W::NAME,
                mode.label(),
                ms(median(row.step.clone())),
                ratio,
                interval,
                100.0 * median_f64(row.overlap.clone()),
                ms(median(row.comm.clone())),
                median_u(row.early.clone()),
                row.buckets
            );
        }
        Ok(())
    }

    pub(super) fn world2(pg: &ProcessGroup, args: &Args) -> Result<()> {
        if pg.rank() == 0 {
            println!(
                "#\n# world 2, shared memory: all-reduce time hidden behind backward (goal: default >= 50%, step never slower than off)"
            );
            println!(
                "# {:<20} {:<26} {:>9} {:>7} {:>13} {:>9} {:>9} {:>9}",
                "model", "mode", "step ms", "/ off", "95% CI", "hidden", "comm ms", "ready early"
            );
        }
        for model in &args.models {
            match model.as_str() {
                "mlp" => table::<Mlp>(pg, args.overlap_steps)?,
                "transformer" => table::<Gpt>(pg, args.overlap_steps)?,
                "cnn" => table::<ConvNet>(pg, args.overlap_steps)?,
                other => bail!("unknown model '{other}' (mlp, transformer, cnn)"),
            }
        }
        Ok(())
    }

    fn overhead<W: Workload<B>>(steps: usize) -> Result<()> {
        let (_server, pg) = world_of_one()?;
        let rows = measure::<W>(&pg, &[Mode::Default, Mode::Off], steps)?;
        let [(_, default), (_, off)] = rows.as_slice() else {
            bail!("world 1 measures two modes");
        };
        let (ratio, interval) = ratios(default, off);
        println!(
            "  {:<20} {:>11.2} {:>9.2} {:>8.3} {:>13}",
            W::NAME,
            ms(median(default.step.clone())),
            ms(median(off.step.clone())),
            ratio,
            interval
        );
        Ok(())
    }

    pub(super) fn world1(args: &Args) -> Result<()> {
        println!("#\n# world 1: default / overlap off (the anchors' cost; goal <= 1.03)");
        println!(
            "# {:<20} {:>11} {:>9} {:>8} {:>13}",
            "model", "default ms", "off ms", "ratio", "95% CI"
        );
        for model in &args.models {
            match model.as_str() {
                "mlp" => overhead::<Mlp>(args.overlap_steps)?,
                "transformer" => overhead::<Gpt>(args.overlap_steps)?,
                "cnn" => overhead::<ConvNet>(args.overlap_steps)?,
                other => bail!("unknown model '{other}' (mlp, transformer, cnn)"),
            }
        }
        Ok(())
    }
}
