//! A DDP rank for the multi-process equivalence test:
//! `ddp_worker <initial-weights-file> <output-dir> <sgd|adam>`.
//!
//! Rank 0 starts from the given weights, the others from their own random ones (DDP must make
//! them equal); every rank trains `STEPS` steps on its share of each global batch and writes its
//! final parameters (little-endian f32) to `<output-dir>/rank<r>.bin`. `DDP_TEST_BACKEND=cuda`
//! (feature `cuda`) trains on GPU 0 instead, every rank on the same GPU.
//! `DDP_TEST_COLLECTIVES=stand-in` reduces through the device engine's CPU stand-in
//! (`Collectives::StandIn`) with small buckets; `DDP_TEST_STAND_IN_FENCE` injects its faults
//! (ddp-core's `test-hooks`: `delay:<ms>`, `slow:<ms>:<k>`, `never:<n>`, `fail:<n>`, `kill:<n>`,
//! `abort:<n>`).
//!
//! What each rank does, from its own environment (the tests set some on one rank only):
//! - `DDP_TEST_OVERLAP=off`: `DdpConfig::with_automatic_overlap(false)` (plain taps).
//! - `DDP_TEST_NO_SYNC=<k>`: each step's batch in `k` micro-batches (loss / k), the first
//!   `k - 1` through `backward_no_sync` (gradient accumulation); `k` divides `PER_RANK`.
//! - `DDP_TEST_SKIP_BIAS=1`: this rank's forward leaves `fc2.bias` unused.
//! - `DDP_TEST_STEPS=<n>`: uneven inputs (set it on every rank): `with_uneven_inputs(true)`,
//!   this rank trains `n` steps, then `join`s.
//! - `DDP_TEST_BUCKETS=other`: this rank's buckets are laid out differently (other caps), as a
//!   misconfigured rank's would be.
//!
//! - `DDP_TEST_SHARDING=zero2`: steps with ZeRO stage 2 (`ZeroRedundancyOptimizer::stage2`,
//!   whose collectives follow DDP's: on the stand-in, the device path), in collectives of a few
//!   tensors; `fsdp`: trains with `FullyShardedDataParallel` instead of DDP (units `fc1` and
//!   `fc2`, on the communicator `DDP_TEST_COLLECTIVES` names; no stats).
//!
//! Besides its parameters every rank writes `<output-dir>/rank<r>.stats`: per synchronised
//! step, `<buckets> <buckets launched during backward>` (from `last_step_stats`).

use anyhow::{Context, Result};
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, Optimizer, SgdConfig};
use ddp_core::TapBackend;
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::zero::ZeroRedundancyOptimizer;
use ddp_core::{
    Collectives, DdpConfig, DistributedDataParallel, comm::ProcessGroup, init_from_env,
};
use ddp_tests::fixtures::{
    Opt, PER_RANK, STEPS, SmallMlp, TestBackend, batch, flat_params, from_bytes, step_indices,
};

/// `flex` (default) or `cuda` (feature `cuda`; every rank on GPU 0, gradients host-staged).
const BACKEND_ENV: &str = "DDP_TEST_BACKEND";
/// `auto` (default) or `stand-in`.
const COLLECTIVES_ENV: &str = "DDP_TEST_COLLECTIVES";
/// `on` (default) or `off`.
const OVERLAP_ENV: &str = "DDP_TEST_OVERLAP";
/// Micro-batches per step (default 1).
const NO_SYNC_ENV: &str = "DDP_TEST_NO_SYNC";
/// `1`: this rank does not use `fc2.bias`.
const SKIP_BIAS_ENV: &str = "DDP_TEST_SKIP_BIAS";
/// Steps this rank trains before it joins (uneven inputs).
const STEPS_ENV: &str = "DDP_TEST_STEPS";
/// `same` (default) or `other`.
const BUCKETS_ENV: &str = "DDP_TEST_BUCKETS";
/// `none` (default), `zero2` or `fsdp`.
const SHARDING_ENV: &str = "DDP_TEST_SHARDING";

/// What shards the training state (`DDP_TEST_SHARDING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharding {
    None,
    Zero2,
    Fsdp,
}

/// How this rank trains, from the environment (see the crate docs above).
#[derive(Debug)]
struct Plan {
    config: DdpConfig,
    micro: usize,
    skip_bias: bool,
    /// `Some` with uneven inputs.
    steps: Option<usize>,
    sharding: Sharding,
}

impl Plan {
    fn from_env() -> Result<Plan> {
        let mut config = config()?;
        match var(OVERLAP_ENV)?.as_deref() {
            None | Some("on") => {}
            Some("off") => config = config.with_automatic_overlap(false),
            Some(other) => anyhow::bail!("{OVERLAP_ENV}={other}: expected on or off"),
        }
        match var(BUCKETS_ENV)?.as_deref() {
            None | Some("same") => {}
            Some("other") => {
                let (cap, first) = (config.bucket_cap_mb, config.first_bucket_cap_mb);
                config = config
                    .with_bucket_cap_mb(cap * 4.0)
                    .with_first_bucket_cap_mb(first * 4.0)
            }
            Some(other) => anyhow::bail!("{BUCKETS_ENV}={other}: expected same or other"),
        }
        let micro = match var(NO_SYNC_ENV)? {
            None => 1,
            Some(k) => k.parse().with_context(|| format!("{NO_SYNC_ENV}={k}"))?,
        };
        anyhow::ensure!(
            micro >= 1 && PER_RANK.is_multiple_of(micro),
            "{NO_SYNC_ENV}={micro}: must divide {PER_RANK}"
        );
        let skip_bias = var(SKIP_BIAS_ENV)?.as_deref() == Some("1");
        let steps = match var(STEPS_ENV)? {
            None => None,
            Some(n) => Some(n.parse().with_context(|| format!("{STEPS_ENV}={n}"))?),
        };
        if steps.is_some() {
            config = config.with_uneven_inputs(true);
        }
        let sharding = match var(SHARDING_ENV)?.as_deref() {
            None | Some("none") => Sharding::None,
            Some("zero2") => Sharding::Zero2,
            Some("fsdp") => Sharding::Fsdp,
            Some(other) => anyhow::bail!("{SHARDING_ENV}={other}: expected none, zero2 or fsdp"),
        };
        Ok(Plan {
            config,
            micro,
            skip_bias,
            steps,
            sharding,
        })
    }
}

/// An environment variable, `None` when unset.
fn var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {name}")),
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, init, out, opt] = args.as_slice() else {
        anyhow::bail!("usage: ddp_worker <initial-weights-file> <output-dir> <sgd|adam>");
    };
    let opt: Opt = opt.parse().map_err(anyhow::Error::msg)?;
    let init = std::fs::read(init).with_context(|| format!("reading {init}"))?;
    let backend = std::env::var(BACKEND_ENV).unwrap_or_else(|_| "flex".into());
    let pg = init_from_env()?;
    let plan = Plan::from_env()?;
    let (params, stats) = match backend.as_str() {
        "flex" => train::<TestBackend>(pg, &init, opt, &plan, &Default::default())?,
        #[cfg(feature = "cuda")]
        "cuda" => {
            anyhow::ensure!(
                ddp_core::comm::cuda_driver_present(),
                "no CUDA driver found (libcuda could not be loaded)"
            );
            let device = burn::backend::cuda::CudaDevice::new(0);
            train::<burn::backend::Autodiff<burn::backend::Cuda>>(pg, &init, opt, &plan, &device)?
        }
        other => anyhow::bail!(
            "{BACKEND_ENV}={other}: expected flex{}",
            if cfg!(feature = "cuda") {
                " or cuda"
            } else {
                " (or cuda, with the cuda feature)"
            }
        ),
    };
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    let rank = rank_of_env()?;
    let path = format!("{out}/rank{rank}.bin");
    std::fs::write(&path, bytes).with_context(|| format!("writing {path}"))?;
    let stats: String = stats.iter().map(|(b, d)| format!("{b} {d}\n")).collect();
    let path = format!("{out}/rank{rank}.stats");
    std::fs::write(&path, stats).with_context(|| format!("writing {path}"))?;
    println!("ok");
    Ok(())
}

/// The DDP settings `DDP_TEST_COLLECTIVES` asks for.
fn config() -> Result<DdpConfig> {
    match std::env::var(COLLECTIVES_ENV).as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("auto") => Ok(DdpConfig::new()),
        // Buckets of a few parameters, so a step has several in flight.
        Ok("stand-in") => Ok(DdpConfig::new()
            .with_collectives(Collectives::StandIn)
            .with_bucket_cap_mb(0.0005)
            .with_first_bucket_cap_mb(0.0001)),
        other => anyhow::bail!("{COLLECTIVES_ENV}={other:?}: expected auto or stand-in"),
    }
}

fn rank_of_env() -> Result<usize> {
    std::env::var("RANK")
        .context("RANK is not set")?
        .parse()
        .context("RANK is not a number")
}

/// Per synchronised step: the buckets, and how many were launched during backward.
type StepStats = Vec<(usize, usize)>;

/// Trains `plan`'s steps (default `STEPS`) on this rank's share of each global batch, joins
/// with uneven inputs, and returns the parameters and, per synchronised step, the buckets and
/// how many were launched during backward.
fn train<B: TapBackend>(
    pg: ProcessGroup,
    init: &[u8],
    opt: Opt,
    plan: &Plan,
    device: &B::Device,
) -> Result<(Vec<f32>, StepStats)> {
    let model = if pg.rank() == 0 {
        from_bytes::<B>(init, device).map_err(anyhow::Error::msg)?
    } else {
        SmallMlp::<B>::new(device)
    };
    if plan.sharding == Sharding::Fsdp {
        let params = train_fsdp(pg, model, opt, plan.config.collectives, device)?;
        return Ok((params, Vec::new()));
    }
    let mut ddp = DistributedDataParallel::new(model, pg, plan.config.clone())?;
    let sgd = SgdConfig::new().init::<B, SmallMlp<B>>();
    let adam = AdamConfig::new().init::<B, SmallMlp<B>>();
    // Tiny ZeRO collectives: several reduce-scatters and all-gathers per step.
    let zero_bucket = 256;
    let stats = match (opt, plan.sharding == Sharding::Zero2) {
        (Opt::Sgd, false) => train_steps(&mut ddp, sgd, 0.1, plan, device)?,
        (Opt::Adam, false) => train_steps(&mut ddp, adam, 0.01, plan, device)?,
        (Opt::Sgd, true) => {
            let zero =
                ZeroRedundancyOptimizer::stage2(sgd, &mut ddp)?.with_bucket_bytes(zero_bucket);
            train_steps(&mut ddp, zero, 0.1, plan, device)?
        }
        (Opt::Adam, true) => {
            let zero =
                ZeroRedundancyOptimizer::stage2(adam, &mut ddp)?.with_bucket_bytes(zero_bucket);
            train_steps(&mut ddp, zero, 0.01, plan, device)?
        }
    };
    Ok((flat_params(ddp.module()), stats))
}

/// `plan`'s steps of `optim` at learning rate `lr` (micro-batches, join), each on this rank's
/// share of the batch; per synchronised step, the buckets and how many were launched during
/// backward.
fn train_steps<B: TapBackend, O: Optimizer<SmallMlp<B>, B>>(
    ddp: &mut DistributedDataParallel<B, SmallMlp<B>>,
    mut optim: O,
    lr: f64,
    plan: &Plan,
    device: &B::Device,
) -> Result<StepStats> {
    let (rank, world) = (ddp.process_group().rank(), ddp.process_group().world_size());
    let mut stats = Vec::new();
    let per_micro = PER_RANK / plan.micro;
    for step in 0..plan.steps.unwrap_or(STEPS) {
        let indices = step_indices(step, world, Some(rank));
        for (k, part) in indices.chunks(per_micro).enumerate() {
            let (x, y) = batch::<B>(part, device);
            let pred = ddp.forward(|m| m.forward_using_bias(x, plan.skip_bias))?;
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean) / plan.micro as f32;
            if k + 1 < plan.micro {
                ddp.backward_no_sync(loss)?;
                continue;
            }
            let grads = ddp.backward(loss)?;
            ddp.optimizer_step(&mut optim, lr, grads);
            let s = ddp
                .last_step_stats()
                .context("no stats after a synchronised step")?;
            stats.push((s.buckets, s.buckets_launched_during_backward));
        }
    }
    if plan.steps.is_some() {
        ddp.join(&mut optim, lr)?;
    }
    Ok(stats)
}

/// Trains `STEPS` steps with FSDP on `collectives` and returns the whole model's parameters.
fn train_fsdp<B: TapBackend>(
    pg: ProcessGroup,
    model: SmallMlp<B>,
    opt: Opt,
    collectives: Collectives,
    device: &B::Device,
) -> Result<Vec<f32>> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let config = FsdpConfig::new()
        .with_units(["fc1", "fc2"])
        .with_collectives(collectives);
    let mut fsdp = FullyShardedDataParallel::new(model, pg, config)?;
    let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
    let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
    for step in 0..STEPS {
        let (x, y) = batch::<B>(&step_indices(step, world, Some(rank)), device);
        let pred = fsdp.forward(|m| m.forward(x))?;
        let grads = fsdp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))?;
        match opt {
            Opt::Sgd => fsdp.optimizer_step(&mut sgd, 0.1, grads)?,
            Opt::Adam => fsdp.optimizer_step(&mut adam, 0.01, grads)?,
        }
    }
    Ok(flat_params(&fsdp.full_module()?))
}
