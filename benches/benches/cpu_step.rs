//! One process's training step on burn's CPU backend: milliseconds and minor page faults per
//! step, by allocator and compute threads, next to PyTorch on the same shapes (issue 31).
//!
//! ```text
//! cargo bench -p ddp-benches --bench cpu_step
//! cargo bench -p ddp-benches --bench cpu_step -- --python /path/to/python --steps 30
//! ```
//!
//! Models (the held-out-sized ones): MLP 784-4096-4096-10, batch 32; CNN on 1x28x28 images
//! (`conv 3x3 1->32, relu, maxpool 2, conv 3x3 32->64, relu, maxpool 2, linear 3136->10`),
//! batch 16. SGD, cross-entropy. Each row is a fresh child process (allocators and glibc's
//! malloc settings are fixed at start-up; `RAYON_NUM_THREADS` sizes burn-flex's pool) that
//! runs warm-up steps, then reports the median wall time of the measured steps and its minor
//! page faults per step (`getrusage`: first touches of memory the allocator just got from the
//! kernel).
//!
//! Allocators: glibc's defaults; glibc with the launcher's worker settings
//! (`ddp_core::launcher::ALLOCATOR_ENV`); glibc with transparent huge pages for its mmap'd chunks
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`); mimalloc; jemalloc. The last two are this
//! binary's own global allocator (jemalloc with `--features jemalloc`), picked per child by
//! `DDP_BENCH_ALLOCATOR` (see `ddp_benches::allocator::SwitchAllocator`). PyTorch's row runs `benches/pytorch/cpu_step.py` with the same shapes
//! and `torch.set_num_threads`, when `--python` names an interpreter that has torch.

use anyhow::{Context, Result, bail};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use clap::Parser;
use ddp_benches::allocator::{SwitchAllocator, allocator_env, allocator_env_removed, minor_faults};
use ddp_benches::class_labels;
use std::process::Command;
use std::time::Instant;

/// burn-flex with autodiff, as the examples train.
type Train = Autodiff<Flex>;

#[global_allocator]
static GLOBAL: SwitchAllocator = SwitchAllocator;

/// The allocators measured by default: jemalloc too when built with `--features jemalloc`.
const DEFAULT_ALLOCATORS: &str = if cfg!(feature = "jemalloc") {
    "glibc,launcher,hugetlb,mimalloc,jemalloc"
} else {
    "glibc,launcher,hugetlb,mimalloc"
};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Measured steps per row (after warm-up).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Warm-up steps per row (not measured).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Compute threads per process to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Models to measure (mlp, cnn; conv2-wgrad: the backward of the CNN's second convolution
    /// alone, its weight gradient).
    #[arg(long, value_delimiter = ',', default_value = "mlp,cnn,conv2-wgrad")]
    models: Vec<String>,
    /// Allocators to measure (glibc, launcher, hugetlb, mimalloc, jemalloc).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_ALLOCATORS)]
    allocators: Vec<String>,
    /// A Python interpreter with torch, for PyTorch's rows (skipped without it).
    #[arg(long, env = "CPU_STEP_PYTHON")]
    python: Option<String>,
    /// Internal: run one row in this process and print its result.
    #[arg(long, hide = true)]
    child: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
    act: Relu,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Mlp {
            l1: LinearConfig::new(784, 4096).init(device),
            l2: LinearConfig::new(4096, 4096).init(device),
            l3: LinearConfig::new(4096, 10).init(device),
            act: Relu::new(),
        }
    }
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = x.flatten(1, 3);
        let x = self.act.forward(self.l1.forward(x));
        let x = self.act.forward(self.l2.forward(x));
        self.l3.forward(x)
    }
}

#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> Cnn<B> {
    fn new(device: &B::Device) -> Self {
        let conv = |from, to| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        Cnn {
            conv1: conv(1, 32),
            conv2: conv(32, 64),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            out: LinearConfig::new(64 * 7 * 7, 10).init(device),
            act: Relu::new(),
        }
    }
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.pool.forward(self.act.forward(self.conv1.forward(x)));
        let x = self.pool.forward(self.act.forward(self.conv2.forward(x)));
        self.out.forward(x.flatten(1, 3))
    }
}

/// Median ms per step and minor faults per step of `steps` SGD steps after `warmup`.
fn measure<M, F>(mut model: M, forward: F, batch: usize, args: &Args) -> (f64, f64)
where
    M: burn::module::AutodiffModule<Train> + Clone,
    F: Fn(&M, Tensor<Train, 4>) -> Tensor<Train, 2>,
{
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = SgdConfig::new().init::<Train, M>();
    let y = class_labels::<Train>(batch, &device);
    let mut times = Vec::with_capacity(args.steps);
    let mut faults = 0;
    for step in 0..args.warmup + args.steps {
        let x = Tensor::<Train, 4>::random([batch, 1, 28, 28], Distribution::Default, &device);
        let (t, f) = (Instant::now(), minor_faults());
        let loss = loss_fn.forward(forward(&model, x), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        // burn-flex computes eagerly: the step is done when `step` returns.
        model = optim.step(0.01, model, grads);
        if step >= args.warmup {
            times.push(t.elapsed().as_secs_f64() * 1e3);
            faults += minor_faults() - f;
        }
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], faults as f64 / args.steps as f64)
}

/// Median ms and faults of the backward of the CNN's second convolution alone (input
/// `[16, 32, 14, 14]`, not requiring a gradient): its weight and bias gradients, the weight's
/// being burn's generic `conv2d_weight_backward` on burn-flex.
fn measure_conv2_weight_grad(args: &Args) -> (f64, f64) {
    let device = Default::default();
    let conv: Conv2d<Train> = Conv2dConfig::new([32, 64], [3, 3])
        .with_padding(PaddingConfig2d::Same)
        .init(&device);
    let mut times = Vec::with_capacity(args.steps);
    let mut faults = 0;
    for step in 0..args.warmup + args.steps {
        let x = Tensor::<Train, 4>::random([16, 32, 14, 14], Distribution::Default, &device);
        let out = conv.forward(x).sum();
        let (t, f) = (Instant::now(), minor_faults());
        let grads = out.backward();
        if step >= args.warmup {
            times.push(t.elapsed().as_secs_f64() * 1e3);
            faults += minor_faults() - f;
        }
        drop(grads);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], faults as f64 / args.steps as f64)
}

fn child(model: &str, args: &Args) -> Result<()> {
    <Train as Backend>::seed(&Default::default(), 7);
    let device = Default::default();
    let (ms, faults) = match model {
        "mlp" => measure(Mlp::<Train>::new(&device), |m, x| m.forward(x), 32, args),
        "cnn" => measure(Cnn::<Train>::new(&device), |m, x| m.forward(x), 16, args),
        "conv2-wgrad" => measure_conv2_weight_grad(args),
        other => bail!("unknown model {other:?}: expected mlp, cnn or conv2-wgrad"),
    };
    println!("RESULT {ms:.3} {faults:.0}");
    Ok(())
}

fn parse_result(stdout: &[u8]) -> Option<(f64, f64)> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("RESULT "))?;
    let mut it = line.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some((it.next()??, it.next()??))
}

fn run_row(cmd: &mut Command, what: &str) -> Result<(f64, f64)> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_result(&out.stdout).with_context(|| format!("{what} printed no RESULT line"))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(model) = &args.child {
        return child(model, &args);
    }
    let exe = std::env::current_exe().context("finding this bench's executable")?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/pytorch/cpu_step.py");
    println!(
        "# CPU training step, one process: MLP 784-4096-4096-10 batch 32, CNN 28x28 batch 16; SGD"
    );
    println!(
        "# median of {} steps after {} warm-up; faults = minor page faults per step",
        args.steps, args.warmup
    );
    println!(
        "{:<11} {:>7} {:<10} {:>9} {:>9} {:>10}",
        "model", "threads", "allocator", "ms/step", "faults", "vs PyTorch"
    );
    for model in &args.models {
        for &threads in &args.threads {
            let torch = match &args.python {
                Some(python) => Some(run_row(
                    Command::new(python).args([
                        script,
                        "--model",
                        model,
                        "--threads",
                        &threads.to_string(),
                        "--steps",
                        &args.steps.to_string(),
                        "--warmup",
                        &args.warmup.to_string(),
                    ]),
                    "PyTorch",
                )?),
                None => None,
            };
            for allocator in &args.allocators {
                let mut cmd = Command::new(&exe);
                cmd.args([
                    "--child",
                    model,
                    "--steps",
                    &args.steps.to_string(),
                    "--warmup",
                    &args.warmup.to_string(),
                ])
                .env("RAYON_NUM_THREADS", threads.to_string());
                for key in allocator_env_removed() {
                    cmd.env_remove(key);
                }
                cmd.envs(allocator_env(allocator)?);
                let (ms, faults) = run_row(&mut cmd, &format!("{model} {allocator}"))?;
                let ratio = torch.map_or("-".to_string(), |(t, _)| format!("{:.2}x", ms / t));
                println!(
                    "{model:<11} {threads:>7} {allocator:<10} {ms:>9.2} {faults:>9.0} {ratio:>10}"
                );
            }
            if let Some((ms, faults)) = torch {
                println!(
                    "{model:<11} {threads:>7} {:<10} {ms:>9.2} {faults:>9.0} {:>10}",
                    "pytorch", "1.00x"
                );
            }
        }
    }
    Ok(())
}
