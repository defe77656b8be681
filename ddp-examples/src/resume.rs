//! Resume-by-default, shared by the examples: load the latest valid checkpoint into the model,
//! the optimizer and the loader, or say why training starts fresh.

use anyhow::Result;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use ddp_core::DistributedDataLoader;
use ddp_core::checkpoint::{Checkpointer, LoadOutcome};

/// Where training continues: the first epoch to run and the global step count so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartPoint {
    /// Epochs already finished.
    pub epoch: usize,
    /// Optimizer steps already taken.
    pub step: u64,
}

/// Loads the latest valid checkpoint unless `fresh`; rank 0 says what happened on stderr.
///
/// # Collective
/// Every rank calls it (the checkpoint travels from rank 0).
#[allow(clippy::too_many_arguments)]
pub fn resume_or_start<B, M, O, I, Out>(
    name: &str,
    checkpoints: &Checkpointer,
    fresh: bool,
    device: &B::Device,
    model: &mut M,
    optim: &mut O,
    loader: &mut DistributedDataLoader<B, I, Out>,
    epochs: usize,
) -> Result<StartPoint>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let main = checkpoints.process_group().rank() == 0;
    if fresh {
        if main {
            eprintln!(
                "{name}: --fresh: ignoring checkpoints in {}",
                checkpoints.config().dir().display()
            );
        }
        return Ok(StartPoint::default());
    }
    match checkpoints.load_latest(device, model, optim)? {
        LoadOutcome::Resumed(resumed) => {
            resumed.restore_loader(loader)?;
            let start = StartPoint {
                epoch: resumed.state.epoch as usize,
                step: resumed.state.global_step,
            };
            if main {
                eprintln!(
                    "{name}: resuming from {}: {} of {epochs} epochs done, step {}",
                    resumed.info.path.display(),
                    start.epoch.min(epochs),
                    start.step
                );
            }
            Ok(start)
        }
        fresh => {
            if main {
                eprintln!("{name}: {fresh}");
            }
            Ok(StartPoint::default())
        }
    }
}
