//! Our DDP against PyTorch DDP (gloo) at world 2 on CPUs, on `ddp_step`'s three models, with
//! our ranks on burn's Flex backend and on its LibTorch backend (PyTorch's own kernels).
//!
//! ```text
//! cargo bench -p ddp-benches --bench ddp_vs_pytorch -- --python PYTHON
//! LIBTORCH_USE_PYTORCH=1 cargo bench -p ddp-benches --features tch --bench ddp_vs_pytorch -- --python PYTHON
//! ```
//!
//! `PYTHON` is an interpreter with torch (2.9.0 is what burn 0.21's LibTorch backend links);
//! the `tch` feature adds the LibTorch rows. Models ([`ddp_benches::workloads`], built the same
//! way in PyTorch by `benches/pytorch/ddp_overlap.py`): MLP 1024-2048-2048-10 batch 64, the
//! transformer example's TinyGpt batch 32 x 13 tokens, the digits CNN batch 64 with each rank's
//! own batch-norm statistics (PyTorch's SyncBatchNorm does not run on CPUs), and `cnn28`, a
//! user's CNN on 28x28 images (two 3x3 convolutions, 1->32->64 maps, and a linear layer:
//! 0.5M parameters) batch 32. SGD, default DDP
//! settings on both sides except PyTorch's bucket cap, lowered to what our default gives
//! these models (a quarter of the gradients). `--threads` compute threads per rank on every
//! side (burn-flex's pool, libtorch's intra-op threads, `torch.set_num_threads`); our ranks use
//! mimalloc, as the README tells users to.
//!
//! Each model runs in `--blocks` blocks. A block starts, one after the other in fresh
//! processes, two ranks of ours per backend and PyTorch's two ranks, each for `--warmup` +
//! `--steps` steps, and takes each run's median step time (forward, backward, optimizer). The
//! order of the runs alternates between blocks, so a slow stretch of the machine does not fall
//! on one side only. `/ PyTorch` is the median over blocks of the run's step time over
//! PyTorch's in the same block, with its distribution-free 95% interval
//! ([`ddp_benches::median_ratio`]; one entirely below 1.00 means ours is faster). `hidden` is
//! the median share of all-reduce time that ran while backward was still computing.
//!
//! Under each model, `where ours on ... goes` splits our synchronised step (medians, ms):
//! forward, backward, the wait after backward for the last buckets, the optimizer, the
//! all-reduce time on the communication thread, and the same forward and backward under
//! `backward_no_sync` (no exchange at all): the step minus that and the optimizer is what the
//! exchange costs.

use anyhow::{Context, Result, bail};
use burn::optim::SgdConfig;
use clap::Parser;
use ddp_benches::workloads::{ConvNet, Gpt, Mlp, UserCnn, Workload};
use ddp_benches::{median_f64, median_ratio};
use ddp_core::nn::SyncBatchNormBackend;
use ddp_core::{DdpConfig, DistributedDataParallel, TapBackend, comm::ProcessGroup, init_from_env};
use std::process::{Command, Stdio};
use std::time::Instant;

ddp_core::use_fast_allocator!();

#[derive(Parser, Debug, Clone)]
struct Args {
    /// A Python interpreter with torch, for PyTorch DDP's rows.
    #[arg(long, env = "DDP_STEP_PYTHON")]
    python: Option<String>,
    /// Models, comma-separated: mlp, transformer, cnn, cnn28 (a user's CNN on 28x28 images).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mlp,transformer,cnn,cnn28"
    )]
    models: Vec<String>,
    /// Our backends, comma-separated: flex, tch (the default has tch when built with it).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_BACKENDS)]
    backends: Vec<String>,
    /// Blocks per model (each: one run per side); 6 or more give a 95% interval.
    #[arg(long, default_value_t = 8)]
    blocks: usize,
    /// Measured steps per run.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Warm-up steps per run (not measured).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Compute threads per rank.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Internal: this rank runs one model on one backend.
    #[arg(long, hide = true)]
    rank_run: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

const DEFAULT_BACKENDS: &str = if cfg!(feature = "tch") {
    "tch,flex"
} else {
    "flex"
};

/// One run's result on rank 0: median step time and hidden share; for ours also where the
/// step went ([`Detail`]).
#[derive(Debug, Clone, Copy)]
struct Run {
    step_ms: f64,
    hidden: f64,
    detail: Option<Detail>,
}

/// Medians of one of our runs, in ms: the parts of the synchronised step, the all-reduce time
/// on the communication thread, and the same forward and backward under `backward_no_sync`
/// (no exchange at all).
#[derive(Debug, Clone, Copy)]
struct Detail {
    forward: f64,
    backward: f64,
    after_backward: f64,
    optimizer: f64,
    comm: f64,
    no_sync: f64,
}

const DETAIL_NAMES: [&str; 6] = [
    "forward",
    "backward",
    "after bwd",
    "optimizer",
    "comm",
    "no_sync f+b",
];

impl Detail {
    fn values(&self) -> [f64; 6] {
        [
            self.forward,
            self.backward,
            self.after_backward,
            self.optimizer,
            self.comm,
            self.no_sync,
        ]
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(run) = &args.rank_run {
        return rank_main(run, &args);
    }
    let Some(python) = args.python.clone() else {
        bail!(
            "ddp_vs_pytorch compares with PyTorch DDP: pass --python PYTHON (or set DDP_STEP_PYTHON) naming an interpreter with torch (`pip install torch==2.9.0`)"
        );
    };
    for backend in &args.backends {
        match backend.as_str() {
            "flex" => {}
            "tch" if cfg!(feature = "tch") => {}
            "tch" => bail!(
                "--backends tch: this bench was built without the LibTorch backend; run it with `--features tch` (LIBTORCH_USE_PYTORCH=1 and torch 2.9.0 in the Python on PATH)"
            ),
            other => bail!("unknown backend '{other}' (flex, tch)"),
        }
    }
    if args.blocks == 0 || args.steps == 0 {
        bail!("--blocks and --steps must be at least 1");
    }
    let mut header = true;
    for model in &args.models {
        let Some(name) = row_name(model) else {
            bail!("unknown model '{model}' (mlp, transformer, cnn, cnn28)");
        };
        table(model, name, &python, &args, &mut header)?;
    }
    Ok(())
}

/// Every block of one model, then its rows.
fn table(model: &str, name: &str, python: &str, args: &Args, header: &mut bool) -> Result<()> {
    let mut sides: Vec<String> = args.backends.clone();
    sides.push("pytorch".to_string());
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); sides.len()];
    for block in 0..args.blocks {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if block % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let run = if sides[i] == "pytorch" {
                pytorch(python, model, args, header)?
            } else {
                ours(&sides[i], model, args)?
            };
            runs[i].push(run);
        }
    }
    if *header {
        bail!("PyTorch's script printed no header");
    }
    let pytorch = &runs[sides.len() - 1];
    for (side, side_runs) in sides.iter().zip(&runs) {
        let label = match side.as_str() {
            "pytorch" => "PyTorch DDP (gloo)",
            "tch" => "ours, LibTorch",
            _ => "ours, Flex",
        };
        let (ratio, interval) = median_ratio(
            side_runs
                .iter()
                .zip(pytorch)
                .map(|(a, b)| a.step_ms / b.step_ms.max(1e-9))
                .collect(),
        );
        println!(
            "  {:<18} {:<20} {:>9.2} {:>11.3} {:>13} {:>8.0}%",
            name,
            label,
            median_f64(side_runs.iter().map(|r| r.step_ms).collect()),
            ratio,
            interval,
            median_f64(side_runs.iter().map(|r| r.hidden).collect()),
        );
    }
    for (side, side_runs) in sides.iter().zip(&runs) {
        let details: Vec<[f64; 6]> = side_runs
            .iter()
            .filter_map(|r| r.detail.map(|d| d.values()))
            .collect();
        if details.is_empty() {
            continue;
        }
        let parts: Vec<String> = (0..6)
            .map(|i| {
                let m = median_f64(details.iter().map(|d| d[i]).collect());
                format!("{} {m:.1}", DETAIL_NAMES[i])
            })
            .collect();
        println!("    where ours on {side} goes (ms): {}", parts.join(", "));
    }
    Ok(())
}

/// The row label of a `--models` name; `None` for a name that is not a model. A workload's
/// `NAME` does not depend on the backend: Flex's is read.
fn row_name(model: &str) -> Option<&'static str> {
    type Any = burn::backend::Autodiff<burn::backend::Flex>;
    Some(match model {
        "mlp" => <Mlp as Workload<Any>>::NAME,
        "transformer" => <Gpt as Workload<Any>>::NAME,
        "cnn" => <ConvNet as Workload<Any>>::NAME,
        "cnn28" => <UserCnn as Workload<Any>>::NAME,
        _ => return None,
    })
}

/// A free port on the loopback interface for a run's rendezvous.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The `RESULT <ms> <hidden %> [<detail> x 6]` line of a run's rank 0.
fn parse_result(stdout: &str) -> Option<Run> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("RESULT "))?;
    let values: Vec<f64> = line
        .split_whitespace()
        .map(|v| v.parse::<f64>().ok())
        .collect::<Option<_>>()?;
    let detail = match values.as_slice() {
        [_, _, f, b, a, o, c, n] => Some(Detail {
            forward: *f,
            backward: *b,
            after_backward: *a,
            optimizer: *o,
            comm: *c,
            no_sync: *n,
        }),
        _ => None,
    };
    Some(Run {
        step_ms: *values.first()?,
        hidden: *values.get(1)?,
        detail,
    })
}

/// Two ranks of ours, in fresh processes of this binary.
fn ours(backend: &str, model: &str, args: &Args) -> Result<Run> {
    let exe = std::env::current_exe()?;
    let port = free_port()?.to_string();
    let threads = args.threads.to_string();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args(["--rank-run", &format!("{backend}:{model}")])
                .args(["--steps", &args.steps.to_string()])
                .args(["--warmup", &args.warmup.to_string()])
                .args(["--threads", &threads])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("RAYON_NUM_THREADS", &threads)
                .env("OMP_NUM_THREADS", &threads)
                .stdout(if rank == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("spawning rank {rank} of ours on {backend}"))
        })
        .collect::<Result<_>>()?;
    let mut rank0 = None;
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            failures.push(format!(
                "rank {rank} ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if rank == 0 {
            rank0 = parse_result(&String::from_utf8_lossy(&out.stdout));
        }
    }
    match (rank0, failures.is_empty()) {
        (Some(run), true) => Ok(run),
        _ => bail!(
            "our {model} run on {backend} gave no result: {}",
            failures.join("; ")
        ),
    }
}

/// PyTorch DDP's two ranks (`benches/pytorch/ddp_overlap.py`). Prints the script's header
/// lines once, as the table's header.
fn pytorch(python: &str, model: &str, args: &Args, header: &mut bool) -> Result<Run> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/pytorch/ddp_overlap.py");
    let out = Command::new(python)
        .arg(script)
        .args(["--model", model])
        .args(["--steps", &args.steps.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .args(["--port", &free_port()?.to_string()])
        .env("OMP_NUM_THREADS", args.threads.to_string())
        .output()
        .with_context(|| format!("running {python} {script}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(run) = parse_result(&text) else {
        bail!(
            "{script} --model {model} gave no result (exit {}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    if *header {
        *header = false;
        if let Some(line) = text.lines().find(|l| l.starts_with("# PyTorch")) {
            println!("{line}");
        }
        println!(
            "# ours: ddp-burn DDP (shared memory), world 2, {} thread(s) per rank, mimalloc; {} blocks of {} + {} warm-up steps per side and model",
            args.threads, args.blocks, args.steps, args.warmup
        );
        println!(
            "# {:<18} {:<20} {:>9} {:>11} {:>13} {:>9}",
            "model", "side", "step ms", "/ PyTorch", "95% CI", "hidden"
        );
    }
    Ok(run)
}

/// A rank of one of our runs: `run` is `backend:model`.
fn rank_main(run: &str, args: &Args) -> Result<()> {
    let Some((backend, model)) = run.split_once(':') else {
        bail!("--rank-run takes backend:model, not '{run}'");
    };
    let pg = init_from_env()?;
    let result = match backend {
        "flex" => {
            let device = Default::default();
            by_model::<burn::backend::Autodiff<burn::backend::Flex>>(&pg, model, &device, args)?
        }
        #[cfg(feature = "tch")]
        "tch" => {
            let threads = i32::try_from(args.threads).context("--threads is too large")?;
            // SAFETY: sets libtorch's intra-op thread count before any tensor exists.
            unsafe { torch_sys::at_set_num_threads(threads) };
            let device = burn::backend::libtorch::LibTorchDevice::Cpu;
            by_model::<burn::backend::Autodiff<burn::backend::LibTorch>>(&pg, model, &device, args)?
        }
        other => bail!("backend '{other}' is not in this build"),
    };
    if pg.rank() == 0 {
        let detail = result.detail.map(|d| d.values()).unwrap_or_default();
        let detail: Vec<String> = detail.iter().map(|v| format!("{v:.3}")).collect();
        println!(
            "RESULT {:.3} {:.1} {}",
            result.step_ms,
            100.0 * result.hidden,
            detail.join(" ")
        );
    }
    Ok(())
}

fn by_model<B: TapBackend + SyncBatchNormBackend>(
    pg: &ProcessGroup,
    model: &str,
    device: &B::Device,
    args: &Args,
) -> Result<Run> {
    match model {
        "mlp" => measure::<B, Mlp>(pg, device, args),
        "transformer" => measure::<B, Gpt>(pg, device, args),
        "cnn" => measure::<B, ConvNet>(pg, device, args),
        "cnn28" => measure::<B, UserCnn>(pg, device, args),
        other => bail!("unknown model '{other}'"),
    }
}

/// Warm-up, then the medians of `args.steps` steps with DDP's default configuration, then
/// as many forwards and backwards under `backward_no_sync`.
fn measure<B: TapBackend + SyncBatchNormBackend, W: Workload<B>>(
    pg: &ProcessGroup,
    device: &B::Device,
    args: &Args,
) -> Result<Run> {
    let model = W::model(device, false, None);
    let mut ddp = DistributedDataParallel::new(model, pg.clone(), DdpConfig::new())?;
    let mut opt = SgdConfig::new().init::<B, W::M>();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mut columns: [Vec<f64>; 8] = Default::default();
    for n in 0..args.warmup + args.steps {
        let t = Instant::now();
        let loss = ddp.forward(|m| W::loss(m, false, n, device))?;
        let grads = ddp.backward(loss)?;
        let o = Instant::now();
        ddp.optimizer_step(&mut opt, 0.01, grads);
        let (step, optimizer) = (ms(t.elapsed()), ms(o.elapsed()));
        if n >= args.warmup {
            let s = ddp.last_step_stats().cloned().unwrap_or_default();
            let values = [
                step,
                s.overlap_fraction(),
                ms(s.forward),
                ms(s.backward),
                ms(s.sync_after_backward),
                optimizer,
                ms(s.comm),
            ];
            for (column, v) in columns.iter_mut().zip(values) {
                column.push(v);
            }
        }
    }
    for n in 0..args.steps {
        let t = Instant::now();
        let loss = ddp.forward(|m| W::loss(m, false, n, device))?;
        ddp.backward_no_sync(loss)?;
        columns[7].push(ms(t.elapsed()));
    }
    let [
        step,
        hidden,
        forward,
        backward,
        after_backward,
        optimizer,
        comm,
        no_sync,
    ] = columns.map(median_f64);
    Ok(Run {
        step_ms: step,
        hidden,
        detail: Some(Detail {
            forward,
            backward,
            after_backward,
            optimizer,
            comm,
            no_sync,
        }),
    })
}
