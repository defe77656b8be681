//! Resume-by-default, shared by the examples: load the latest valid checkpoint into the model,
//! the optimizer and the loader, or say why training starts fresh.
//!
//! `--fresh` means "start this launch over", not "start every attempt over": the launcher
//! repeats the command line on each `--max-restarts` restart, so [`StartFrom::new`] turns
//! `--fresh` into [`StartFrom::Scratch`] on the first attempt only. A restart resumes only
//! checkpoints this launch wrote: the attempt that starts over records the launch's id
//! (`DDP_LAUNCH_ID`, set by ddp-run) in the directory once it has cleared it, and a restart
//! that does not find its own id there (the first attempt died before) starts over itself.

use anyhow::{Context, Result};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, LoadOutcome, TrainingState,
};
use ddp_core::data::DistributedDataLoader;
use ddp_core::launcher::WorkerContext;
use serde::Serialize;
use std::path::PathBuf;

/// The examples' checkpoint policy for `dir`: keep the last 3 checkpoints, and hash
/// `run_config` (the settings whose change makes an old checkpoint suspicious) into each.
///
/// # Errors
/// `run_config` does not serialise.
pub fn checkpoint_config<T: Serialize>(
    dir: impl Into<PathBuf>,
    run_config: &T,
) -> Result<CheckpointConfig> {
    Ok(CheckpointConfig::new(dir)
        .with_keep_last(3)
        .with_run_config(run_config)?)
}

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartFrom {
    /// Resume from the latest valid checkpoint, if there is one (the default).
    Latest,
    /// `--fresh` on the launch's first attempt: ignore existing checkpoints and start over.
    Scratch {
        /// This launch's id (`DDP_LAUNCH_ID`), recorded in the directory once it is cleared.
        launch: Option<String>,
    },
    /// `--fresh`, but this is a restart of the launch: resume the checkpoints this launch
    /// wrote if its first attempt got as far as starting over (the directory's fresh-start
    /// record names this launch), or else start over now.
    LatestAfterRestart {
        /// How many restarts came before this attempt.
        restart: u32,
        /// This launch's id (`DDP_LAUNCH_ID`); without one nothing can be proven to be this
        /// launch's, so the restart starts over.
        launch: Option<String>,
    },
}

impl StartFrom {
    /// `--fresh` (`fresh`) applied to this attempt: a `--fresh` launch starts over once, and
    /// its restarts ([`WorkerContext::is_restart`]) resume what it wrote since.
    ///
    /// # Errors
    /// `DDP_LAUNCH_ID` set to a value that is not valid UTF-8.
    pub fn new(fresh: bool, ctx: &WorkerContext) -> Result<Self> {
        // Set by ddp-run and launch() for every attempt of a launch.
        let launch = ddp_core::comm::env_var(ddp_core::launcher::LAUNCH_ID_ENV)?
            .filter(|id| !id.trim().is_empty());
        Ok(match (fresh, ctx.is_restart()) {
            (false, _) => StartFrom::Latest,
            (true, false) => StartFrom::Scratch { launch },
            (true, true) => StartFrom::LatestAfterRestart {
                restart: ctx.restart_count(),
                launch,
            },
        })
    }

    /// Whether this attempt starts over without looking at the checkpoints (`--fresh` on the
    /// first attempt).
    pub fn is_scratch(&self) -> bool {
        matches!(self, StartFrom::Scratch { .. })
    }

    /// Whether this attempt starts over, for either checkpointer: `Some(launch)` (the launch
    /// id to record once the directory is cleared) for `--fresh` on the first attempt, and on
    /// a restart whose launch did not get as far as recording its fresh start (`recorded(launch)`:
    /// whether any rank's directory records this launch's fresh start, asked only then: the
    /// directory may still hold an older run's checkpoints, which a restart must not resume);
    /// `None` to resume. Rank 0 (`main`) says why on stderr as program `name`.
    ///
    /// # Collective
    /// Every rank calls it (`recorded` is a collective, asked on every rank alike).
    ///
    /// # Errors
    /// `recorded`'s.
    pub fn starting_over(
        &self,
        name: &str,
        main: bool,
        recorded: impl FnOnce(&str) -> Result<bool, CheckpointError>,
    ) -> Result<Option<Option<String>>> {
        match self {
            StartFrom::Latest => Ok(None),
            StartFrom::Scratch { launch } => Ok(Some(launch.clone())),
            StartFrom::LatestAfterRestart { restart, launch } => {
                // Every rank asks, with or without a launch id (the question is a collective).
                let ours = recorded(launch.as_deref().unwrap_or(""))
                    .context("reading whether this launch started the directory over")?;
                if ours {
                    if main {
                        eprintln!(
                            "{name}: restart {restart} of this launch: resuming its checkpoints (--fresh applied to the first attempt only)"
                        );
                    }
                    Ok(None)
                } else {
                    if main {
                        let why = match launch {
                            Some(_) => "its first attempt stopped before it had started over",
                            None => {
                                "DDP_LAUNCH_ID is not set, so no checkpoint can be shown to be this launch's"
                            }
                        };
                        eprintln!("{name}: restart {restart} of this launch: {why}");
                    }
                    Ok(Some(launch.clone()))
                }
            }
        }
    }
}

/// Loads the latest valid checkpoint, or starts over for [`StartFrom::Scratch`] (and for a
/// restart of a `--fresh` launch that had not started over yet); rank 0 says what happened on
/// stderr, invalid checkpoints it skipped (and set aside) included.
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
    let launch = start.starting_over(name, main, |launch| {
        checkpoints.fresh_start_recorded(launch)
    })?;
    if let Some(launch) = launch {
        start_over(name, checkpoints, model, optim, loader, launch.as_deref())?;
        return Ok(StartPoint::default());
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
                for bad in &resumed.invalid {
                    eprintln!("{name}: warning: skipped invalid {bad}");
                }
                eprintln!(
                    "{name}: resuming from {}: {}, step {}",
                    resumed.info.path.display(),
                    epochs_done(start.epoch, epochs),
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

/// `3 of 5 epochs done`, or `3000 epochs done, more than --epochs 5: none left to run` (never
/// a count above what the checkpoint holds or a "5 of 5" it does not).
pub fn epochs_done(done: usize, epochs: usize) -> String {
    if done <= epochs {
        format!("{done} of {epochs} epochs done")
    } else {
        format!("{done} epochs done, more than --epochs {epochs}: none left to run")
    }
}

/// `--fresh`: removes the older run's checkpoints, saves the initial state as step 0 when
/// there were any (so `latest` names this run), then records that launch `launch` started
/// the directory over, so its restarts resume what it writes from now on.
fn start_over<B, M, O, I, Out>(
    name: &str,
    checkpoints: &FullCheckpointer,
    model: &M,
    optim: &O,
    loader: &DistributedDataLoader<B, I, Out>,
    launch: Option<&str>,
) -> Result<()>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let main = checkpoints.process_group().rank() == 0;
    // Rank-local listing: only rank 0's answer counts, so share it. An unreadable directory
    // counts as holding checkpoints: the save then fails on every rank alike.
    let mut older = [u8::from(
        main && checkpoints.latest().map_or(true, |l| l.is_some()),
    )];
    checkpoints
        .process_group()
        .broadcast(&mut older, 0)
        .context("sharing whether older checkpoints exist")?;
    if main {
        let dir = checkpoints.config().dir().display();
        eprintln!("{name}: --fresh: starting over (removing the checkpoints in {dir})");
    }
    if older[0] == 1 {
        // The older run's checkpoints go: a save never moves `latest` below a newer valid
        // checkpoint, and left behind they would never be pruned. The directory lock (taken
        // by FullCheckpointer::new) guarantees no other job is using them.
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
    // Only now: a restart before this point starts over again instead of resuming.
    checkpoints
        .record_fresh_start(launch.unwrap_or_default())
        .context("recording the fresh start")?;
    Ok(())
}
