//! [`DdpStrategy`]: burn-train's epoch loop, rewritten for N processes.
//!
//! burn-train 0.21 keeps its own loop private, so this is that loop (about the size of
//! `SingleDeviceTrainingStrategy`'s) with the collectives added where a data-parallel loop
//! needs them. Per training step, on every rank:
//! 1. a 1-byte-per-rank all-reduce: does every rank have a batch, did any rank's interrupter
//!    fire (so all ranks stop at the same step, never one waiting in a collective alone);
//! 2. the user's `TrainStep::step`, unchanged (forward and a plain `loss.backward()`), run by
//!    ddp-core's [`DistributedDataParallel::step_on`](ddp_core::DistributedDataParallel::step_on) on a tapped copy of the learner's model:
//!    as burn's backward reaches each parameter its gradient goes into a bucket, and a full
//!    bucket's all-reduce starts while backward goes on (overlap, as PyTorch's DDP);
//! 3. the averaged gradients go to the optimizer, and the optimizer and the LR scheduler step
//!    once, as in PyTorch; with gradient accumulation the micro-batches' gradients are summed
//!    locally (`step_on_no_sync`, PyTorch's `no_sync`) and reduced once per optimizer step;
//! 4. buffers (running statistics) take rank 0's values, inside `step_on`;
//! 5. the step's output is gathered and merged on rank 0 (see [`DistributedItem`](crate::DistributedItem)), which alone
//!    feeds burn-train's metrics, renderer and loggers.
//!
//! After each epoch's validation, rank 0 alone runs the checkpointer and the early-stopping
//! strategy (only it has the metrics they read) and broadcasts the stop decision. With
//! mid-epoch checkpoints, rank 0 also writes one after every `n`-th optimizer step (see
//! `mid_epoch.rs`); a resumed epoch starts at the checkpoint's step.
//!
//! The files of this folder, one part of that loop each: the strategy's type and settings
//! (here), what a run reports (`report.rs`), burn-train's entry points (`fit.rs`), the run's
//! setup and teardown (`run.rs`), the epoch loop and rank 0's end-of-epoch decision
//! (`epochs.rs`), one epoch's training steps (`train_epoch.rs`) and validation steps
//! (`valid_epoch.rs`), loading the checkpoint a run resumes from (`resume.rs`, `load.rs`) and
//! finding its step again (`skip.rs`), the epoch-end checkpointer (`checkpointing.rs`), the
//! group abort on failures and panics (`abort.rs`), and `distributed()` (`distributed.rs`).

mod abort;
mod checkpointing;
mod distributed;
mod epochs;
mod fit;
mod load;
mod report;
mod resume;
mod run;
mod skip;
mod train_epoch;
mod valid_epoch;

pub use distributed::DistributedTrainingExt;
pub use report::DdpReport;

use crate::error::{DdpTrainError, Result};
use crate::mid_epoch::ResumePoint;
use burn::module::Module;
use burn::tensor::backend::Backend;
use ddp_core::{DdpConfig, comm::ProcessGroup};
use report::RunState;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// How burn-train's metrics see the ranks' outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsSync {
    /// Every step's outputs are gathered and merged on rank 0, so loss, accuracy and every
    /// other metric computed from the step output cover the global batch exactly (default).
    #[default]
    Global,
    /// Rank 0 reports its own outputs only (no gathering; for outputs too large to send every
    /// step). Metrics are then over rank 0's shard.
    Rank0,
}

/// A burn-train training strategy that trains on every rank of a [`ProcessGroup`] as one
/// process would on the global batch (PyTorch's DDP semantics).
///
/// Build one per process, give it to burn-train's builder with
/// [`DistributedTrainingExt::distributed`], launch, then call [`finish`](Self::finish): burn's
/// strategy trait cannot return errors, so a failed run (a peer died, ranks disagree) ends
/// early on every rank, and `finish` says why.
///
/// Every rank must use the same model architecture, optimizer, scheduler, number of epochs and
/// gradient accumulation, and a [`DistributedLoader`](crate::DistributedLoader) (or any loader
/// giving each rank the same number of training batches).
#[derive(Debug, Clone)]
pub struct DdpStrategy {
    pg: ProcessGroup,
    config: DdpConfig,
    metrics: MetricsSync,
    /// The training directory whose `checkpoint/` rank 0 writes atomically and resumes from.
    checkpoints: Option<PathBuf>,
    /// Optimizer steps between mid-epoch checkpoints (`None`: at epoch ends only).
    every_n_steps: Option<usize>,
    /// Whether rank 0 locks the checkpoint directory for the run.
    dir_lock: bool,
    /// Where to resume (set by [`with_resume`](Self::with_resume)).
    resume: Option<ResumePoint>,
    state: Arc<Mutex<RunState>>,
}

impl DdpStrategy {
    /// A strategy over `pg` (every rank of it trains).
    pub fn new(pg: ProcessGroup) -> Self {
        DdpStrategy {
            pg,
            config: DdpConfig::new(),
            metrics: MetricsSync::default(),
            checkpoints: None,
            every_n_steps: None,
            dir_lock: true,
            resume: None,
            state: Arc::default(),
        }
    }

    /// How metrics see the ranks' outputs (default [`MetricsSync::Global`]).
    pub fn with_metrics(mut self, metrics: MetricsSync) -> Self {
        self.metrics = metrics;
        self
    }

    /// ddp-core's settings for the gradient all-reduce (bucket sizes, compression, NCCL,
    /// buffer broadcast; default [`DdpConfig::new`]). Every rank uses the same.
    /// `uneven_inputs` is refused: the strategy keeps the ranks in step itself.
    pub fn with_ddp_config(mut self, config: DdpConfig) -> Self {
        self.config = config;
        self
    }

    /// Rank 0 writes burn-train's checkpoints (model, optimizer, LR scheduler, each epoch) to
    /// `dir/checkpoint` atomically, and resuming (`SupervisedTraining::checkpoint(epoch)`)
    /// loads them from rank 0: it reads the files and broadcasts their bytes, so the other
    /// ranks never read `dir` and need no shared filesystem. Give every rank the same `dir`
    /// (the training directory); only rank 0's is used, but every rank must set it: a resume
    /// refuses ranks that differ (they would load in different ways). Takes the place of
    /// burn-train's `with_file_checkpointer` (if both are set, burn's is not used). Which
    /// epochs are kept: burn-train's default (the last two and the one with the lowest
    /// validation loss). Files are full precision, so a resumed run is bitwise the
    /// uninterrupted one. For checkpoints inside epochs too, add
    /// [`with_checkpoint_every_n_steps`](Self::with_checkpoint_every_n_steps).
    /// Rank 0 locks `dir` for the whole run (`dir/lock`, as ddp-core's checkpointers do): a
    /// second job on the same `dir` fails at once, naming the first, instead of deleting its
    /// files.
    pub fn with_checkpoints(mut self, dir: impl AsRef<Path>) -> Self {
        self.checkpoints = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Also checkpoint inside epochs, after every `n`-th optimizer step of an epoch (PyTorch
    /// Lightning's `every_n_train_steps`), so a run killed mid-epoch loses at most `n` steps
    /// instead of the whole epoch. Needs [`with_checkpoints`](Self::with_checkpoints): rank 0
    /// writes the model, optimizer, scheduler and the data loader's position (epoch, step,
    /// items) atomically to `dir/checkpoint/steps` and keeps only the latest such checkpoint;
    /// [`resume_point`](crate::resume_point) finds it. The step count is the same on every
    /// rank (they step together), so every rank knows when one is taken without a message;
    /// the others go on while rank 0 writes (they wait at the next step's all-reduce), and a
    /// failed write ends the run on every rank. `0` turns them off (the default: epoch ends
    /// only).
    pub fn with_checkpoint_every_n_steps(mut self, n: usize) -> Self {
        self.every_n_steps = (n > 0).then_some(n);
        self
    }

    /// With `false`, rank 0 does not lock the checkpoint directory. Only for file systems
    /// without locks (a Lustre client without `-o flock`), and only when you make sure yourself
    /// that one job at a time writes the directory.
    pub fn with_dir_lock(mut self, lock: bool) -> Self {
        self.dir_lock = lock;
        self
    }

    /// Resume at `point` (from [`resume_point`](crate::resume_point), the same on every rank;
    /// `None`: a fresh start): the run loads that checkpoint from rank 0 and continues with
    /// epoch `epochs_done + 1`, after its first `steps_done` steps. Give the training
    /// [`DistributedLoader`](crate::DistributedLoader) the same point
    /// ([`with_resume`](crate::DistributedLoader::with_resume)): it then starts at that
    /// position without loading the skipped batches (any other loader has them pulled and
    /// dropped). [`distributed`](DistributedTrainingExt::distributed) passes the epoch on
    /// to burn-train's `checkpoint(epoch)`. The checkpoint comes from
    /// [`with_checkpoints`](Self::with_checkpoints) (inside an epoch, only from there) or
    /// burn-train's `with_file_checkpointer`; with neither, the run fails on every rank
    /// rather than train on from untrained weights.
    pub fn with_resume(mut self, point: Option<ResumePoint>) -> Self {
        self.resume = point;
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.pg.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.pg.world_size()
    }

    /// The process group training runs over.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// The outcome of the last `launch`: what it did, or the error that ended it.
    ///
    /// # Errors
    /// The first error of the run (later calls return [`DdpTrainError::Failed`] with its text).
    pub fn finish(&self) -> Result<DdpReport> {
        let mut state = self.lock();
        match state.failure.take() {
            Some(e) => {
                let text = e.to_string();
                state.failure = Some(DdpTrainError::Failed(text));
                Err(e)
            }
            None => Ok(state.report.clone()),
        }
    }

    /// The run's report and failure (shared by every clone of this strategy).
    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The device the model's parameters live on (the default device for a model without any).
fn model_device<B: Backend, M: Module<B>>(model: &M) -> B::Device {
    model.devices().into_iter().next().unwrap_or_default()
}
