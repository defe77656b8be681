//! A DDP rank for the multi-process equivalence test:
//! `ddp_worker <initial-weights-file> <output-dir> <sgd|adam>`.
//!
//! Rank 0 starts from the given weights, the others from their own random ones (DDP must make
//! them equal); every rank trains `STEPS` steps on its share of each global batch and writes its
//! final parameters (little-endian f32) to `<output-dir>/rank<r>.bin`. `DDP_TEST_BACKEND=cuda`
//! (feature `cuda`) trains on GPU 0 instead, every rank on the same GPU.
//! `DDP_TEST_COLLECTIVES=stand-in` reduces through the device engine's CPU stand-in
//! (`Collectives::StandIn`) with small buckets; `DDP_TEST_STAND_IN_FENCE` injects its faults.
//! `DDP_TEST_SHARDING=zero2` steps with ZeRO stage 2 (`ZeroRedundancyOptimizer::stage2`, whose
//! collectives follow DDP's: on the stand-in, the device path), in collectives of a few tensors;
//! `fsdp` trains with `FullyShardedDataParallel` instead of DDP (units `fc1` and `fc2`, on the
//! communicator `DDP_TEST_COLLECTIVES` names).

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
    Opt, STEPS, SmallMlp, TestBackend, batch, flat_params, from_bytes, step_indices,
};

/// `flex` (default) or `cuda` (feature `cuda`; every rank on GPU 0, gradients host-staged).
const BACKEND_ENV: &str = "DDP_TEST_BACKEND";
/// `auto` (default) or `stand-in`.
const COLLECTIVES_ENV: &str = "DDP_TEST_COLLECTIVES";
/// `none` (default) or `zero2`.
const SHARDING_ENV: &str = "DDP_TEST_SHARDING";

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
    let params = match backend.as_str() {
        "flex" => train::<TestBackend>(pg, &init, opt, &Default::default())?,
        #[cfg(feature = "cuda")]
        "cuda" => {
            anyhow::ensure!(
                ddp_core::comm::cuda_driver_present(),
                "no CUDA driver found (libcuda could not be loaded)"
            );
            let device = burn::backend::cuda::CudaDevice::new(0);
            train::<burn::backend::Autodiff<burn::backend::Cuda>>(pg, &init, opt, &device)?
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
    let path = format!("{out}/rank{}.bin", rank_of_env()?);
    std::fs::write(&path, bytes).with_context(|| format!("writing {path}"))?;
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

/// Trains `STEPS` steps on this rank's share of each global batch and returns the parameters.
fn train<B: TapBackend>(
    pg: ProcessGroup,
    init: &[u8],
    opt: Opt,
    device: &B::Device,
) -> Result<Vec<f32>> {
    let model = if pg.rank() == 0 {
        from_bytes::<B>(init, device).map_err(anyhow::Error::msg)?
    } else {
        SmallMlp::<B>::new(device)
    };
    let config = config()?;
    let zero2 = match std::env::var(SHARDING_ENV).as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("none") => false,
        Ok("zero2") => true,
        Ok("fsdp") => return train_fsdp(pg, model, opt, config.collectives, device),
        other => anyhow::bail!("{SHARDING_ENV}={other:?}: expected none, zero2 or fsdp"),
    };
    let mut ddp = DistributedDataParallel::new(model, pg, config)?;
    let sgd = SgdConfig::new().init::<B, SmallMlp<B>>();
    let adam = AdamConfig::new().init::<B, SmallMlp<B>>();
    // Tiny collectives: several reduce-scatters and all-gathers per step.
    let zero_bucket = 256;
    match (opt, zero2) {
        (Opt::Sgd, false) => train_steps(&mut ddp, sgd, 0.1, device)?,
        (Opt::Adam, false) => train_steps(&mut ddp, adam, 0.01, device)?,
        (Opt::Sgd, true) => {
            let zero =
                ZeroRedundancyOptimizer::stage2(sgd, &mut ddp)?.with_bucket_bytes(zero_bucket);
            train_steps(&mut ddp, zero, 0.1, device)?
        }
        (Opt::Adam, true) => {
            let zero =
                ZeroRedundancyOptimizer::stage2(adam, &mut ddp)?.with_bucket_bytes(zero_bucket);
            train_steps(&mut ddp, zero, 0.01, device)?
        }
    }
    Ok(flat_params(ddp.module()))
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

/// `STEPS` steps of `optim` at learning rate `lr`, each on this rank's share of the batch.
fn train_steps<B: TapBackend, O: Optimizer<SmallMlp<B>, B>>(
    ddp: &mut DistributedDataParallel<B, SmallMlp<B>>,
    mut optim: O,
    lr: f64,
    device: &B::Device,
) -> Result<()> {
    let (rank, world) = (ddp.process_group().rank(), ddp.process_group().world_size());
    for step in 0..STEPS {
        let (x, y) = batch::<B>(&step_indices(step, world, Some(rank)), device);
        let pred = ddp.forward(|m| m.forward(x))?;
        let grads = ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))?;
        ddp.optimizer_step(&mut optim, lr, grads);
    }
    Ok(())
}
