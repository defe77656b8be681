//! Resume-by-default, shared by the examples: load the latest valid checkpoint into the model,
//! the optimizer and the loader, or say why training starts fresh.
//!
//! `--fresh` means "start this launch over", not "start every attempt over": the launcher
//! repeats the command line on each `--max-restarts` restart, so [`StartFrom::new`] turns
//! `--fresh` into [`StartFrom::Scratch`] on the first attempt only, and restarts resume from
//! the checkpoints this launch wrote.

use anyhow::{Context, Result};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use ddp_core::checkpoint::{FullCheckpointer, LoadOutcome, TrainingState};
use ddp_core::data::DistributedDataLoader;
use ddp_core::launch::WorkerContext;

/// Where training continues: the first epoch to run, the global step count so far, and the
/// checkpoint's training state when resuming.
#[derive(Debug, Clone, Default)]
pub struct StartPoint {
    /// Epochs already finished.
    pub epoch: usize,
    /// Optimizer steps already taken.
    pub step: u64,
    /// The resumed checkpoint's [`TrainingState`], for what the program saved besides the
    /// model and the optimizer (its user payload: `state.user::<T>()`, e.g. a loss scaler's
    /// state); `None` when training starts fresh.
    pub state: Option<TrainingState>,
}

/// What to do with the checkpoints already in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Resume from the latest valid checkpoint, if there is one (the default).
    Latest,
    /// `--fresh` on the launch's first attempt: ignore existing checkpoints and start over.
    Scratch,
    /// `--fresh`, but this is restart `n` of the launch: resume from the checkpoints this
    /// launch wrote (the first attempt already started over).
    LatestAfterRestart(u32),
}

impl StartFrom {
    /// `--fresh` (`fresh`) applied to this attempt: only the first attempt of a launch starts
    /// over ([`WorkerContext::is_restart`]).
    pub fn new(fresh: bool, ctx: &WorkerContext) -> Self {
        match (fresh, ctx.is_restart()) {
            (false, _) => StartFrom::Latest,
            (true, false) => StartFrom::Scratch,
            (true, true) => StartFrom::LatestAfterRestart(ctx.restart_count()),
        }
    }
}

/// Loads the latest valid checkpoint, or starts over for [`StartFrom::Scratch`]; rank 0 says
/// what happened on stderr.
///
/// Starting over in a directory that already holds checkpoints first saves the initial state
/// as checkpoint `step-0000000000`, so `latest` names this run from its first step: a restart
/// (or the next plain run) then resumes this run, never the older one that was set aside.
///
/// # Collective
/// Every rank calls it (the checkpoint travels from rank 0).
#[allow(clippy::too_many_arguments)]
pub fn resume_or_start<B, M, O, I, Out>(
    name: &str,
    checkpoints: &FullCheckpointer,
    start: StartFrom,
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
    let dir = checkpoints.config().dir().display();
    match start {
        StartFrom::Scratch => {
            // Rank-local listing: only rank 0's answer counts, so share it. An unreadable
            // directory counts as holding checkpoints: the save then fails on every rank alike.
            let mut older = [u8::from(
                main && checkpoints.latest().map_or(true, |l| l.is_some()),
            )];
            checkpoints
                .process_group()
                .broadcast(&mut older, 0)
                .context("sharing whether older checkpoints exist")?;
            if main {
                eprintln!("{name}: --fresh: starting over (removing the checkpoints in {dir})");
            }
            if older[0] == 1 {
                // The older run's checkpoints go: a save never moves `latest` below a newer
                // valid checkpoint, and left behind they would never be pruned.
                checkpoints
                    .rewind_to(0)
                    .context("removing the older run's checkpoints for --fresh")?;
                checkpoints
                    .save(
                        model,
                        optim,
                        &TrainingState::new(0, 0).with_sampler(loader.state()),
                    )
                    .context("saving the initial state of the fresh run")?;
            }
            return Ok(StartPoint::default());
        }
        StartFrom::LatestAfterRestart(n) if main => eprintln!(
            "{name}: restart {n} of this launch: resuming its checkpoints (--fresh applied to the first attempt only)"
        ),
        StartFrom::Latest | StartFrom::LatestAfterRestart(_) => {}
    }
    match checkpoints.load_latest(device, model, optim)? {
        LoadOutcome::Resumed(resumed) => {
            resumed.restore_loader(loader)?;
            let start = StartPoint {
                epoch: resumed.state.epoch as usize,
                step: resumed.state.global_step,
                state: Some(resumed.state),
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
