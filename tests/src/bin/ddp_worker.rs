//! A DDP rank for the multi-process equivalence test:
//! `ddp_worker <initial-weights-file> <output-dir> <sgd|adam>`.
//!
//! Rank 0 starts from the given weights, the others from their own random ones (DDP must make
//! them equal); every rank trains `STEPS` steps on its share of each global batch and writes its
//! final parameters (little-endian f32) to `<output-dir>/rank<r>.bin`.

use anyhow::{Context, Result};
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, SgdConfig};
use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env};
use ddp_tests::fixtures::{
    Opt, STEPS, SmallMlp, TestBackend as B, batch, flat_params, from_bytes, step_indices,
};

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
    let pg = init_from_env()?;
    let (rank, world) = (pg.rank(), pg.world_size());
    let device = Default::default();
    let model = if rank == 0 {
        from_bytes(&std::fs::read(init).with_context(|| format!("reading {init}"))?)
            .map_err(anyhow::Error::msg)?
    } else {
        SmallMlp::<B>::new(&device)
    };
    let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new())?;
    let mut sgd = SgdConfig::new().init::<B, SmallMlp<B>>();
    let mut adam = AdamConfig::new().init::<B, SmallMlp<B>>();
    for step in 0..STEPS {
        let (x, y) = batch(&step_indices(step, world, Some(rank)), &device);
        let pred = ddp.forward(|m| m.forward(x))?;
        let grads = ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))?;
        match opt {
            Opt::Sgd => ddp.optimizer_step(&mut sgd, 0.1, grads),
            Opt::Adam => ddp.optimizer_step(&mut adam, 0.01, grads),
        }
    }
    let bytes: Vec<u8> = flat_params(ddp.module())
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let path = format!("{out}/rank{rank}.bin");
    std::fs::write(&path, bytes).with_context(|| format!("writing {path}"))?;
    println!("ok");
    Ok(())
}
