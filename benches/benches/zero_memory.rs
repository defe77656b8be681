//! Memory per rank of the transformer example's model under DDP, ZeRO-1, ZeRO-2 and fully
//! sharded parameters (FSDP, one unit per transformer layer) at world 1, 2 and 4: the model
//! state each rank holds between steps (parameters, averaged gradients, Adam's moments) and its
//! peak process memory. The goal of sharding (issue 26): model state per rank about `1/world`
//! of DDP's. (FSDP here gathers the whole model for each forward and backward, so its peak
//! holds a whole replica: see `ddp_core::fsdp` for why burn 0.21 allows no less.)
//!
//! ```text
//! cargo bench -p ddp-benches --bench zero_memory
//! cargo bench -p ddp-benches --bench zero_memory -- --d-model 512 --layers 8 --heads 8 --steps 5
//! ```
//!
//! Each (mode, world) runs as `world` fresh processes (this binary again, one per rank, on
//! shared memory, one compute thread each), so every peak is that rank's alone. Each rank
//! trains the example's `TinyGpt` (default: the example's shape, d_model 256, 4 layers, 4
//! heads, 3.2M parameters) with Adam for `--steps` steps on its own batches of the
//! sequence-reversal task, then reports:
//!
//! - `params`: the parameter tensors it holds between steps: a whole replica under DDP and
//!   ZeRO, its chunk of every unit under FSDP (`FullyShardedDataParallel::parameter_bytes`;
//!   from forward to backward every mode holds the whole model, which shows in the peak).
//! - `grads`: averaged gradient tensors it holds after the reduction: DDP and ZeRO-1 every
//!   parameter's (counted in what `backward` returned), ZeRO-2 its reduce-scatter block
//!   (`ZeroRedundancyOptimizer::gradient_bytes`: its shard, one flag per tensor, padding). Every
//!   mode also holds its full *local* gradient from backward until the step (ZeRO-2's
//!   reduce-scatter is not overlapped with backward), which shows in the peak, not here. FSDP:
//!   its chunks (`ShardedGradients::bytes`).
//! - `adam`: the bytes of the moment tensors in this rank's Adam state (its shard under ZeRO).
//! - `state`: the sum, and `vs DDP` its ratio to DDP's at the same world size.
//! - `peak RSS`: `VmHWM` from `/proc/self/status` after the last step (before anything is
//!   measured), and `start RSS`, `VmRSS` once the process group is up, before the model exists:
//!   what every process costs without the model (the binary, burn, the transport's buffers).
//!
//! Each column is the largest over the ranks (the rank that bounds the memory a machine
//! needs); ZeRO's partition is by whole tensors, so ranks differ by up to one tensor; FSDP's
//! chunks are equal. Workers use
//! mimalloc, as the examples do.

use anyhow::{Context, Result, bail};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::{AdaptorRecord, AdaptorRecordV1};
use burn::optim::{Adam, AdamConfig, AdamState, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use clap::{Parser, ValueEnum};
use ddp_core::comm::ProcessGroup;
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::{
    DdpConfig, DistributedDataParallel, init_from_env,
    zero::{ZeroRedundancyOptimizer, ZeroStage},
};
use ddp_examples::models::{GptShape, TinyGpt};
use ddp_examples::reverse::{ReverseBatcher, VOCAB, scored_positions, sequence};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type B = Autodiff<Flex>;
type Model = TinyGpt<B>;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// World sizes to run, each as that many processes.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    worlds: Vec<usize>,
    /// What each rank holds.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ddp,zero1,zero2,fsdp"
    )]
    modes: Vec<Mode>,
    /// Training steps per rank (Adam's state exists after the first).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Sequences per rank per step.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Digits per sequence (the example's default: 6).
    #[arg(long, default_value_t = 6)]
    seq_len: usize,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256)]
    d_model: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads (must divide `--d-model`).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Seconds one (mode, world) run may take before its processes are stopped.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Set on the processes this bench starts: run as a rank of this mode.
    #[arg(long, value_enum, hide = true)]
    worker: Option<Mode>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// What the ranks shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Plain DDP and Adam: every rank holds everything.
    Ddp,
    /// ZeRO stage 1: Adam's state sharded.
    Zero1,
    /// ZeRO stage 2: Adam's state and the averaged gradients sharded.
    Zero2,
    /// Fully sharded (`ddp_core::fsdp`): parameters too, one unit per transformer layer.
    Fsdp,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Ddp => "DDP + Adam",
            Mode::Zero1 => "ZeRO-1",
            Mode::Zero2 => "ZeRO-2",
            Mode::Fsdp => "FSDP",
        }
    }
}

/// One rank's measurements, in bytes; printed by the worker as one line after [`ROW`].
#[derive(Debug, Clone, Copy, Default)]
struct Row {
    params: u64,
    grads: u64,
    adam: u64,
    peak_rss: u64,
    start_rss: u64,
}

const ROW: &str = "zero_memory_row";

impl Row {
    fn state(&self) -> u64 {
        self.params + self.grads + self.adam
    }

    fn line(&self) -> String {
        format!(
            "{ROW} {} {} {} {} {}",
            self.params, self.grads, self.adam, self.peak_rss, self.start_rss
        )
    }

    fn parse(line: &str) -> Option<Row> {
        let mut v = line.strip_prefix(ROW)?.split_whitespace().map(str::parse);
        let mut next = || v.next()?.ok();
        Some(Row {
            params: next()?,
            grads: next()?,
            adam: next()?,
            peak_rss: next()?,
            start_rss: next()?,
        })
    }

    /// The largest of each column over `rows`.
    fn max(rows: &[Row]) -> Row {
        rows.iter().fold(Row::default(), |m, r| Row {
            params: m.params.max(r.params),
            grads: m.grads.max(r.grads),
            adam: m.adam.max(r.adam),
            peak_rss: m.peak_rss.max(r.peak_rss),
            start_rss: m.start_rss.max(r.start_rss),
        })
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.heads == 0 || args.d_model % args.heads != 0 {
        bail!(
            "--heads {} must divide --d-model {}",
            args.heads,
            args.d_model
        );
    }
    if let Some(mode) = args.worker {
        let row = worker(&args, mode)?;
        println!("{}", row.line());
        return Ok(());
    }
    if args.worlds.contains(&0) || args.steps == 0 {
        bail!("--worlds must be at least 1 and --steps at least 1");
    }
    let shape = shape(&args);
    let params = TinyGpt::<Flex>::new(shape, &Default::default()).num_params();
    println!(
        "# memory per rank: the transformer example's TinyGpt (d_model {}, {} layers, {} heads: {} \
         parameters), Adam, batch {} per rank, {} steps, one process per rank (shared memory, 1 \
         thread each); columns: the largest over the ranks, MiB",
        args.d_model, args.layers, args.heads, params, args.batch_size, args.steps
    );
    println!(
        "# {:<11} {:>5} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9}",
        "mode", "world", "params", "grads", "adam", "state", "vs DDP", "peak RSS", "start RSS"
    );
    for &world in &args.worlds {
        let mut ddp_state = None;
        for &mode in &args.modes {
            let rows = run_ranks(&args, mode, world)?;
            let max = Row::max(&rows);
            if mode == Mode::Ddp {
                ddp_state = Some(max.state());
            }
            let ratio = ddp_state
                .map(|d| format!("{:.2}", max.state() as f64 / d as f64))
                .unwrap_or_else(|| "-".into());
            println!(
                "  {:<11} {:>5} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>9.1} {:>9.1}",
                mode.label(),
                world,
                mib(max.params),
                mib(max.grads),
                mib(max.adam),
                mib(max.state()),
                ratio,
                mib(max.peak_rss),
                mib(max.start_rss)
            );
        }
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn shape(args: &Args) -> GptShape {
    GptShape {
        vocab: VOCAB,
        max_len: 2 * args.seq_len + 2,
        d_model: args.d_model,
        heads: args.heads,
        layers: args.layers,
        boundaries: false,
    }
}

/// Runs this binary as the `world` ranks of `mode` and collects every rank's [`Row`]. A rank
/// that fails, or a run past `--timeout-secs`, stops the others.
fn run_ranks(args: &Args, mode: Mode, world: usize) -> Result<Vec<Row>> {
    let exe = std::env::current_exe()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let forwarded: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mode_arg = format!("{mode:?}").to_lowercase();
    let mut children = Children(Vec::new());
    for rank in 0..world {
        let child = Command::new(&exe)
            .args(&forwarded)
            .args(["--worker", &mode_arg])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("DDP_TRANSPORT", "shm")
            .env("RAYON_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting rank {rank} of {mode:?} at world {world}"))?;
        children.0.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut done = vec![false; world];
    while done.iter().any(|d| !d) {
        for (rank, child) in children.0.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("rank {rank} of {mode:?} at world {world} failed: {status}");
                }
                done[rank] = true;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "{mode:?} at world {world} ran past --timeout-secs {}",
                args.timeout_secs
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut rows = Vec::with_capacity(world);
    for (rank, child) in children.0.iter_mut().enumerate() {
        let mut out = String::new();
        if let Some(stdout) = child.stdout.as_mut() {
            std::io::Read::read_to_string(stdout, &mut out)?;
        }
        let row = out
            .lines()
            .find_map(Row::parse)
            .with_context(|| format!("rank {rank} printed no measurements: {out:?}"))?;
        rows.push(row);
    }
    Ok(rows)
}

/// The ranks of one run; dropping it stops and reaps any that are still running (a failure
/// or timeout elsewhere must not leave them waiting for their peers).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// One rank: trains `--steps` steps in `mode` and measures what it holds.
fn worker(args: &Args, mode: Mode) -> Result<Row> {
    let pg = init_from_env().context("joining the bench's process group")?;
    let start_rss = proc_status_kib("VmRSS:")? * 1024;
    let device = Default::default();
    B::seed(&device, 42);
    let model = Model::new(shape(args), &device);
    if mode == Mode::Fsdp {
        let mut row = train_fsdp(args, model, pg)?;
        row.start_rss = start_rss;
        return Ok(row);
    }
    let mut ddp = DistributedDataParallel::new(model, pg.clone(), DdpConfig::new())?;
    let adam = AdamConfig::new().init::<B, Model>();
    let mut row = match mode {
        Mode::Ddp => train(args, &mut ddp, &mut Held::Plain(adam))?,
        Mode::Zero1 => train(
            args,
            &mut ddp,
            &mut Held::Zero(Box::new(ZeroRedundancyOptimizer::new(adam, pg.clone()))),
        )?,
        Mode::Zero2 => {
            let zero = ZeroRedundancyOptimizer::stage2(adam, &mut ddp)?;
            debug_assert_eq!(zero.stage(), ZeroStage::Two);
            train(args, &mut ddp, &mut Held::Zero(Box::new(zero)))?
        }
        Mode::Fsdp => unreachable!("FSDP returned above"),
    };
    row.start_rss = start_rss;
    Ok(row)
}

type Plain = OptimizerAdaptor<Adam, Model, B>;
/// Adam's state by parameter.
type AdamRecord = <Plain as Optimizer<Model, B>>::Record;

/// The optimizer a rank trains with, as far as measuring it goes.
enum Held {
    Plain(Plain),
    Zero(Box<ZeroRedundancyOptimizer<Plain, Model, B>>),
}

impl Held {
    fn step(&mut self, ddp: &mut DistributedDataParallel<B, Model>, grads: GradientsParams) {
        match self {
            Held::Plain(o) => ddp.optimizer_step(o, 1e-3, grads),
            Held::Zero(o) => ddp.optimizer_step(o.as_mut(), 1e-3, grads),
        }
    }

    /// This rank's Adam state: all of it, or its shard.
    fn state(&self) -> AdamRecord {
        match self {
            Held::Plain(o) => o.to_record(),
            Held::Zero(o) => o.local_state(),
        }
    }

    /// Averaged gradient bytes held after the reduction, given what `backward` returned.
    fn reduced_grads(&self, returned: u64) -> Result<u64> {
        match self {
            Held::Zero(o) if o.stage() == ZeroStage::Two => o
                .gradient_bytes()
                .map(|b| b as u64)
                .context("ZeRO-2 reported no gradients after its step"),
            _ => Ok(returned),
        }
    }
}

/// The batch of step `step` on `rank`: its own sequences.
fn batch_of(args: &Args, step: usize, rank: usize) -> ddp_examples::reverse::ReverseBatch<B> {
    let n = args.batch_size;
    let items: Vec<Vec<i64>> = (0..n)
        .map(|i| sequence(7, ((step * 64 + rank) * n + i) as u64, args.seq_len))
        .collect();
    ReverseBatcher.batch(items, &Default::default())
}

/// The loss of the scored positions.
fn loss(args: &Args, logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let (n, len) = (args.batch_size, args.seq_len);
    let scored = scored_positions(len);
    let logits = logits
        .slice([0..n, scored.clone(), 0..VOCAB])
        .reshape([n * len, VOCAB]);
    let targets: Tensor<B, 1, Int> = targets.slice([0..n, scored]).reshape([n * len]);
    CrossEntropyLossConfig::new()
        .init(&Default::default())
        .forward(logits, targets)
}

/// Fully sharded: one unit per transformer layer, Adam over this rank's chunks.
fn train_fsdp(args: &Args, model: Model, pg: ProcessGroup) -> Result<Row> {
    let rank = pg.rank();
    let units = FsdpConfig::new().with_units(shape(args).fsdp_units());
    let mut fsdp = FullyShardedDataParallel::new(model, pg, units)?;
    let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
    let mut grads_held = 0;
    for step in 0..args.steps {
        let batch = batch_of(args, step, rank);
        let logits = fsdp.forward(|m| m.forward(batch.inputs))?;
        let grads = fsdp.backward(loss(args, logits, batch.targets))?;
        grads_held = grads.bytes();
        fsdp.optimizer_step(&mut adam, 1e-3, grads)?;
    }
    let peak_rss = proc_status_kib("VmHWM:")? * 1024;
    Ok(Row {
        params: fsdp.parameter_bytes(),
        grads: grads_held,
        adam: adam_bytes(adam.to_record()),
        peak_rss,
        start_rss: 0,
    })
}

fn train(
    args: &Args,
    ddp: &mut DistributedDataParallel<B, Model>,
    optim: &mut Held,
) -> Result<Row> {
    let rank = ddp.process_group().rank();
    let mut returned = 0;
    for step in 0..args.steps {
        let batch = batch_of(args, step, rank);
        let logits = ddp.forward(|m| m.forward(batch.inputs))?;
        let grads = ddp.backward(loss(args, logits, batch.targets))?;
        returned = gradient_bytes(ddp.module(), &grads);
        optim.step(ddp, grads);
    }
    let peak_rss = proc_status_kib("VmHWM:")? * 1024;
    Ok(Row {
        params: tensor_bytes(ddp.module()),
        grads: optim.reduced_grads(returned)?,
        adam: adam_bytes(optim.state()),
        peak_rss,
        start_rss: 0,
    })
}

/// A field of `/proc/self/status` in KiB (`VmHWM:`: peak resident memory).
fn proc_status_kib(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context("reading /proc/self/status (this bench measures memory on Linux only)")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}

/// Bytes of the module's trainable float tensors.
fn tensor_bytes<M: AutodiffModule<B>>(module: &M) -> u64 {
    struct Sum(u64);
    impl ModuleVisitor<B> for Sum {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let v = param.val();
            if v.is_require_grad() {
                self.0 += (v.shape().num_elements() * v.dtype().size()) as u64;
            }
        }
    }
    let mut sum = Sum(0);
    module.visit(&mut sum);
    sum.0
}

/// Bytes of the gradient tensors in `grads` (looked up by the module's parameters).
fn gradient_bytes<M: AutodiffModule<B>>(module: &M, grads: &GradientsParams) -> u64 {
    struct Sum<'a>(&'a GradientsParams, u64);
    impl ModuleVisitor<B> for Sum<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self
                .0
                .get::<<B as AutodiffBackend>::InnerBackend, D>(param.id)
            {
                self.1 += (g.shape().num_elements() * g.dtype().size()) as u64;
            }
        }
    }
    let mut sum = Sum(grads, 0);
    module.visit(&mut sum);
    sum.1
}

/// Bytes of the moment tensors in an Adam record (first, second and AMSGrad's maximum).
fn adam_bytes(record: AdamRecord) -> u64 {
    fn moments<Bk: Backend, const D: usize>(s: &AdamState<Bk, D>) -> u64 {
        let m = &s.momentum;
        let size = |t: &Tensor<Bk, D>| (t.shape().num_elements() * t.dtype().size()) as u64;
        size(&m.moment_1) + size(&m.moment_2) + m.max_moment_2.as_ref().map_or(0, size)
    }
    record
        .values()
        .map(|r| {
            let AdaptorRecord::V1(v1) = r;
            match v1 {
                AdaptorRecordV1::Rank0(s) => moments(s),
                AdaptorRecordV1::Rank1(s) => moments(s),
                AdaptorRecordV1::Rank2(s) => moments(s),
                AdaptorRecordV1::Rank3(s) => moments(s),
                AdaptorRecordV1::Rank4(s) => moments(s),
                AdaptorRecordV1::Rank5(s) => moments(s),
                AdaptorRecordV1::Rank6(s) => moments(s),
                AdaptorRecordV1::Rank7(s) => moments(s),
                AdaptorRecordV1::Rank8(s) => moments(s),
            }
        })
        .sum()
}
