//! [`DdpStrategy`]: burn-train's epoch loop, rewritten for N processes.
//!
//! burn-train 0.21 keeps its own loop private, so this is that loop (about the size of
//! `SingleDeviceTrainingStrategy`'s) with the collectives added where a data-parallel loop
//! needs them. Per training step, on every rank:
//! 1. a 1-byte-per-rank all-reduce: does every rank have a batch, did any rank's interrupter
//!    fire (so all ranks stop at the same step, never one waiting in a collective alone);
//! 2. the user's `TrainStep::step`, unchanged (forward and a plain `loss.backward()`), run by
//!    ddp-core's [`DistributedDataParallel::step_on`] on a tapped copy of the learner's model:
//!    as burn's backward reaches each parameter its gradient goes into a bucket, and a full
//!    bucket's all-reduce starts while backward goes on (overlap, as PyTorch's DDP);
//! 3. the averaged gradients go to the optimizer, and the optimizer and the LR scheduler step
//!    once, as in PyTorch; with gradient accumulation the micro-batches' gradients are summed
//!    locally (`step_on_no_sync`, PyTorch's `no_sync`) and reduced once per optimizer step;
//! 4. buffers (running statistics) take rank 0's values, inside `step_on`;
//! 5. the step's output is gathered and merged on rank 0 (see [`DistributedItem`]), which alone
//!    feeds burn-train's metrics, renderer and loggers.
//!
//! After each epoch's validation, rank 0 alone runs the checkpointer and the early-stopping
//! strategy (only it has the metrics they read) and broadcasts the stop decision. With
//! mid-epoch checkpoints, rank 0 also writes one after every `n`-th optimizer step (see
//! `mid_epoch.rs`); a resumed epoch starts at the checkpoint's step.

use crate::checkpoint::{
    AtomicFileCheckpointer, FailureSlot, KINDS, STEPS_DIR, decode, fetch_from_rank0, file_path,
    lock_checkpoint_dir, rank0_failure_on_every_rank, step_files,
};
use crate::components::DdpComponents;
use crate::error::{DdpTrainError, Result};
use crate::item::{Exchange, exchange};
use crate::loader::next_batch;
use crate::mid_epoch::{LoaderPosition, ResumePoint, StepCheckpointer};
use crate::params::verify_same_model;
use crate::renderer::ProgressRenderer;
use crate::silent::SilentRenderer;
use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::Backend;
use burn_train::checkpoint::{
    AsyncCheckpointer, ComposedCheckpointingStrategy, KeepLastNCheckpoints,
    MetricCheckpointingStrategy,
};
use burn_train::metric::LossMetric;
use burn_train::metric::store::{Aggregate, Direction, Split};
use burn_train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearnerModelRecord,
    LearnerOptimizerRecord, LearnerSchedulerRecord, LearningCheckpointer, LearningResult,
    SupervisedLearningStrategy, SupervisedTraining, SupervisedTrainingEventProcessor, TrainLoader,
    TrainStep, TrainingComponents, TrainingItem, TrainingModel, TrainingStrategy, ValidLoader,
};
use ddp_core::checkpoint::storage::remove_temporary_files;
use ddp_core::comm::panic_message;
use ddp_core::progress::ProgressSetting;
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    comm::{ProcessGroup, ReduceOp},
};
use std::io::IsTerminal;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
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

/// What a finished run did, the same on every rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DdpReport {
    /// The last epoch that trained and validated (burn-train counts from 1).
    pub last_epoch: usize,
    /// The epoch after which rank 0's early-stopping strategy ended training.
    pub stopped_early_at: Option<usize>,
    /// Whether an interrupter (on any rank) ended training.
    pub interrupted: bool,
    /// Training steps (micro-batches) this rank ran.
    pub train_steps: u64,
    /// Optimizer steps (each one all-reduce of the gradients).
    pub optimizer_steps: u64,
    /// Gradient buckets all-reduced, summed over the optimizer steps.
    pub buckets: u64,
    /// Of [`buckets`](Self::buckets), those whose all-reduce was issued from inside the
    /// training step's backward (overlapped with it) rather than after it.
    pub buckets_launched_during_backward: u64,
    /// Gradients handed to their bucket at a [`layer_boundary`](ddp_core::layer_boundary)
    /// before the end of backward, summed over the optimizer steps (0 without boundaries).
    pub early_gradients: u64,
    /// Where this run resumed (an epoch end, or a step inside an epoch); `None` for a fresh
    /// start.
    pub resumed_from: Option<ResumePoint>,
    /// Mid-epoch checkpoints rank 0 wrote in this run
    /// ([`DdpStrategy::with_checkpoint_every_n_steps`]; 0 on the other ranks).
    pub step_checkpoints: u64,
}

#[derive(Debug, Default)]
struct RunState {
    report: DdpReport,
    failure: Option<DdpTrainError>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a failure and aborts the group, so peers blocked in a collective fail now with
    /// this reason instead of waiting for the timeout.
    fn fail(&self, error: DdpTrainError) {
        let reason = error.to_string();
        tracing::error!(rank = self.pg.rank(), error = %reason, "DDP training failed; aborting the process group");
        if self.pg.world_size() > 1 {
            self.pg.abort(&reason);
        }
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some(error);
        }
    }

    /// Runs `body`; when it fails or panics, aborts the group at once with the reason, before
    /// the caller's locals are dropped: dropping a loader's iterator or burn's asynchronous
    /// checkpointers joins their threads (a batch or a file still being written), and the
    /// peers would wait in a collective meanwhile, maybe past the timeout. A panic is recorded
    /// (for [`finish`](Self::finish)) and unwinds on. Aborting twice does nothing.
    fn abort_on_failure<T>(&self, body: impl FnOnce() -> Result<T>) -> Result<T> {
        match catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if self.pg.world_size() > 1 {
                    self.pg.abort(&error.to_string());
                }
                Err(error)
            }
            Err(panic) => {
                let reason = format!(
                    "rank {} panicked: {}",
                    self.pg.rank(),
                    panic_message(panic.as_ref())
                );
                tracing::error!(error = %reason, "DDP training panicked; aborting the process group");
                if self.pg.world_size() > 1 {
                    self.pg.abort(&reason);
                }
                let mut state = self.lock();
                if state.failure.is_none() {
                    state.failure = Some(DdpTrainError::Failed(reason));
                }
                drop(state);
                resume_unwind(panic)
            }
        }
    }
}

/// Where a resumed epoch end is loaded from. Compared across ranks: the sources run different
/// collectives (rank 0's files are broadcast, burn's are read by every rank), so ranks that
/// differ would hang in mismatched collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckpointSource {
    /// Nothing to load from.
    None = 0,
    /// [`DdpStrategy::with_checkpoints`]: rank 0's files, broadcast.
    Rank0Files = 1,
    /// burn-train's own checkpointer (`with_file_checkpointer`): every rank reads its files.
    Burn = 2,
}

impl CheckpointSource {
    /// The name in errors of the source an all-gathered code stands for.
    fn describe(code: i64) -> &'static str {
        match code {
            0 => "no checkpointer",
            1 => "with_checkpoints",
            2 => "burn-train's checkpointer",
            _ => "?",
        }
    }
}

/// What one epoch's training loop ended with.
enum EpochEnd {
    Completed,
    Interrupted,
}

impl DdpStrategy {
    /// The whole run; every `?` ends it on this rank, and [`fail`](Self::fail) ends it on the
    /// others.
    #[allow(clippy::too_many_arguments)]
    fn run<LC: DdpComponents>(
        &self,
        components: &mut TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        train: &TrainLoader<LC>,
        valid: &ValidLoader<LC>,
        starting_epoch: usize,
    ) -> Result<()> {
        let pg = &self.pg;
        let rank0 = pg.rank() == 0;
        if self.every_n_steps.is_some() && self.checkpoints.is_none() {
            return Err(DdpTrainError::Settings(
                "with_checkpoint_every_n_steps needs with_checkpoints(dir): mid-epoch \
                 checkpoints are rank 0's atomic files"
                    .into(),
            ));
        }
        // One job per checkpoint directory: rank 0 holds its lock for the whole run, before
        // anything there is read or removed (a failure here aborts the other ranks).
        let _dir_lock = match &self.checkpoints {
            Some(dir) if rank0 && self.dir_lock => Some(lock_checkpoint_dir(dir)?),
            _ => None,
        };
        let resumed = self.resume(components, learner)?;
        self.lock().report.resumed_from = resumed.map(|(point, _)| point);
        let mut step_checkpointer = match (&self.checkpoints, self.every_n_steps) {
            (Some(dir), Some(_)) if rank0 => Some(StepCheckpointer::new(&dir.join("checkpoint"))),
            _ => None,
        };
        let failure: FailureSlot = Arc::default();
        let mut own_checkpointer = match &self.checkpoints {
            Some(dir) if rank0 => {
                if components.checkpointer.is_some() {
                    tracing::warn!(
                        "both DdpStrategy::with_checkpoints and burn-train's checkpointer are set; using DdpStrategy's"
                    );
                }
                let dir = dir.join("checkpoint");
                remove_temporary_files(&dir);
                Some(atomic_checkpointer::<LC>(
                    &dir,
                    &failure,
                    &components.interrupter,
                ))
            }
            _ => None,
        };
        // From here this rank owns threads (burn's checkpoint writers, the loaders') that an
        // error would join on the way out: the group is aborted first.
        self.abort_on_failure(|| {
            self.train_epochs(
                components,
                learner,
                train,
                valid,
                starting_epoch,
                resumed,
                step_checkpointer.as_mut(),
                own_checkpointer.as_mut(),
                &failure,
            )
        })?;
        // Waits for the last writes (dropping burn's asynchronous checkpointers joins them);
        // a failed one fails every rank.
        drop(own_checkpointer);
        let failed = lock_failure(&failure).take();
        rank0_failure_on_every_rank(pg, failed)
    }

    /// The epochs, from `starting_epoch` on, on every rank: ddp-core's engine, then each
    /// epoch's training, validation and rank 0's checkpoint and early-stopping decision.
    #[allow(clippy::too_many_arguments)]
    fn train_epochs<LC: DdpComponents>(
        &self,
        components: &mut TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        train: &TrainLoader<LC>,
        valid: &ValidLoader<LC>,
        starting_epoch: usize,
        resumed: Option<(ResumePoint, Option<LoaderPosition>)>,
        mut step_checkpointer: Option<&mut StepCheckpointer>,
        mut own_checkpointer: Option<&mut LearningCheckpointer<LC>>,
        failure: &FailureSlot,
    ) -> Result<()> {
        let pg = &self.pg;
        let rank0 = pg.rank() == 0;
        // Every rank starts from rank 0's weights and ids (burn initialises them randomly per
        // process): ddp-core's engine broadcasts them, the learner loads them.
        let model = learner.model();
        verify_same_model::<LC::Backend, _>(pg, &model)?;
        let mut ddp = DistributedDataParallel::new(model, pg.clone(), self.config.clone())
            .map_err(DdpTrainError::ddp("setting up data-parallel training"))?;
        learner.load_model(ddp.module().clone().into_record());
        // As burn-train's own strategies: the loaders create their batches on the model's
        // device (with one GPU per rank, not on the default one). Once: a moved
        // DistributedLoader keeps the epoch counter and resume point it was moved with.
        let device = model_device(&learner.model());
        let train = &train.to_device(&device);
        let valid = &valid.to_device(&device);
        tracing::info!(
            rank = pg.rank(),
            world = pg.world_size(),
            starting_epoch,
            epochs = components.num_epochs,
            "DDP training: every rank holds rank 0's model"
        );

        for epoch in starting_epoch..=components.num_epochs {
            let global = Progress::new(epoch, components.num_epochs);
            let resume_at = resumed
                .and_then(|(_, position)| position)
                .filter(|_| epoch == starting_epoch);
            let end = self.train_epoch(
                components,
                learner,
                &mut ddp,
                train,
                &global,
                resume_at,
                step_checkpointer.as_deref_mut(),
            )?;
            if matches!(end, EpochEnd::Interrupted) {
                self.lock().report.interrupted = true;
                tracing::info!(epoch, "training interrupted");
                break;
            }
            self.valid_epoch(&mut components.event_processor, learner, valid, &global)?;

            // 0: go on, 1: early stop, 2: rank 0 could not write a checkpoint.
            let mut stop = [0u8];
            if rank0 {
                flush_valid::<LC>(&mut components.event_processor);
                if let Some(checkpointer) = own_checkpointer.as_deref_mut() {
                    checkpointer.checkpoint(learner, epoch, &components.event_store);
                } else if let Some(checkpointer) = &mut components.checkpointer {
                    checkpointer.checkpoint(learner, epoch, &components.event_store);
                }
                if let Some(early) = &mut components.early_stopping
                    && early.should_stop(epoch, &components.event_store)
                {
                    stop[0] = 1;
                }
                // Writes run behind training: this sees the earlier epochs' failures.
                if lock_failure(failure).is_some() {
                    stop[0] = 2;
                }
            }
            // Rank 0 decides; everyone follows in the same epoch.
            if pg.world_size() > 1 {
                pg.broadcast(&mut stop, 0)
                    .map_err(DdpTrainError::comm(format!(
                        "receiving rank 0's early-stopping decision after epoch {epoch}"
                    )))?;
            }
            if stop[0] == 2 {
                return Err(lock_failure(failure).take().unwrap_or_else(|| {
                    DdpTrainError::Failed(
                        "rank 0 could not write a checkpoint (its log says why)".into(),
                    )
                }));
            }
            let mut state = self.lock();
            state.report.last_epoch = epoch;
            if stop[0] == 1 {
                state.report.stopped_early_at = Some(epoch);
                tracing::info!(epoch, "early stopping (rank 0's decision)");
                break;
            }
        }
        Ok(())
    }

    /// Where the run resumes: the strategy's [`ResumePoint`] (see
    /// [`with_resume`](Self::with_resume)), else burn-train's `checkpoint(epoch)` (an epoch
    /// end); `None` for a fresh start.
    fn resume_point(&self, burn_checkpoint: Option<usize>) -> Result<Option<ResumePoint>> {
        let Some(point) = self.resume else {
            return Ok(burn_checkpoint.map(|epochs_done| ResumePoint {
                epochs_done,
                steps_done: 0,
            }));
        };
        let expected = (point.epochs_done > 0).then_some(point.epochs_done);
        if burn_checkpoint.is_some() && burn_checkpoint != expected {
            return Err(DdpTrainError::Resume(format!(
                "DdpStrategy::with_resume says after {} epochs and {} steps, burn-train's \
                 checkpoint({}) says after epoch {}; give the same point to both (distributed() \
                 passes the strategy's to burn-train)",
                point.epochs_done,
                point.steps_done,
                burn_checkpoint.unwrap_or_default(),
                burn_checkpoint.unwrap_or_default()
            )));
        }
        Ok(Some(point).filter(|p| p.epochs_done > 0 || p.steps_done > 0))
    }

    /// Loads the checkpoint the run resumes from ([`resume_point`](Self::resume_point)), the
    /// same on every rank; inside an epoch, also returns where the loader was.
    fn resume<LC: DdpComponents>(
        &self,
        components: &TrainingComponents<LC>,
        learner: &mut Learner<LC>,
    ) -> Result<Option<(ResumePoint, Option<LoaderPosition>)>> {
        let pg = &self.pg;
        let resume = self.resume_point(components.checkpoint)?;
        let source = match (&self.checkpoints, &components.checkpointer) {
            (Some(_), _) => CheckpointSource::Rank0Files,
            (None, Some(_)) => CheckpointSource::Burn,
            (None, None) => CheckpointSource::None,
        };
        if pg.world_size() > 1 {
            // A rank resuming elsewhere (or not at all) would train other weights, then hang or
            // fail at the first all-reduce; refuse it up front. [epochs, steps, source]
            let (epochs, steps) =
                resume.map_or((-1, 0), |p| (p.epochs_done as i64, p.steps_done as i64));
            let mine = [epochs, steps, source as i64];
            let mut all = vec![0i64; 3 * pg.world_size()];
            pg.all_gather(&mine, &mut all).map_err(DdpTrainError::comm(
                "comparing the points the ranks resume from",
            ))?;
            if all.chunks(3).any(|p| p[..2] != all[..2]) {
                let by_rank: Vec<String> = all
                    .chunks(3)
                    .map(|p| match p {
                        [-1, _, _] => "none".to_string(),
                        [epochs, 0, _] => format!("after epoch {epochs}"),
                        [epochs, steps, _] => format!("epoch {} after step {steps}", epochs + 1),
                        _ => "?".to_string(),
                    })
                    .collect();
                return Err(DdpTrainError::Resume(format!(
                    "the ranks were given different points to resume from (by rank: [{}]); take \
                     them from ddp_train::resume_point (or resume_epoch), which gives every \
                     rank rank 0's",
                    by_rank.join(", ")
                )));
            }
            // Only a resume loads: a fresh start with the setting on rank 0 alone is fine.
            if resume.is_some() && all.chunks(3).any(|p| p[2] != all[2]) {
                let by_rank: Vec<&str> = all
                    .chunks(3)
                    .map(|p| CheckpointSource::describe(p[2]))
                    .collect();
                return Err(DdpTrainError::Settings(format!(
                    "the ranks resume from different checkpointers (by rank: [{}]); give every \
                     rank the same: DdpStrategy::with_checkpoints(dir) on every rank (only rank \
                     0 reads its dir), or burn-train's with_file_checkpointer on every rank",
                    by_rank.join(", ")
                )));
            }
        }
        let Some(point) = resume else {
            return Ok(None);
        };
        let device = model_device(&learner.model());
        if point.is_mid_epoch() {
            let Some(dir) = &self.checkpoints else {
                return Err(DdpTrainError::Settings(
                    "resuming inside an epoch needs with_checkpoints(dir), where rank 0's \
                     mid-epoch checkpoints are"
                        .into(),
                ));
            };
            let (epoch, step) = (point.epochs_done + 1, point.steps_done);
            let paths = step_files(&dir.join("checkpoint").join(STEPS_DIR), epoch, step);
            let what = format!("the checkpoint of epoch {epoch}, step {step}");
            let files = fetch_from_rank0(pg, &paths, &what)?;
            let [model, optim, scheduler, position]: [Vec<u8>; 4] =
                files.try_into().map_err(|files: Vec<Vec<u8>>| {
                    DdpTrainError::Resume(format!("{what}: {} files instead of 4", files.len()))
                })?;
            let position = LoaderPosition::decode(&position, &paths[3])?;
            if (position.epoch, position.step) != (epoch, step) {
                return Err(DdpTrainError::Resume(format!(
                    "{}: says epoch {}, step {}",
                    paths[3].display(),
                    position.epoch,
                    position.step
                )));
            }
            if position.world != pg.world_size() {
                return Err(DdpTrainError::Resume(format!(
                    "{what} was taken with {} ranks, this run has {}: resume a mid-epoch \
                     checkpoint with the same world size, or from the last epoch end \
                     (ddp_train::resume_epoch)",
                    position.world,
                    pg.world_size()
                )));
            }
            self.load_records(learner, [model, optim, scheduler], &paths)?;
            tracing::info!(
                rank = pg.rank(),
                epoch,
                step,
                "resumed inside epoch {epoch}, after step {step}, from rank 0's checkpoint"
            );
            return Ok(Some((point, Some(position))));
        }
        let epoch = point.epochs_done;
        match &self.checkpoints {
            Some(dir) => {
                let dir = dir.join("checkpoint");
                let paths: Vec<PathBuf> = KINDS.iter().map(|k| file_path(&dir, k, epoch)).collect();
                let files = fetch_from_rank0(pg, &paths, &format!("checkpoint {epoch}"))?;
                let files: [Vec<u8>; 3] = files.try_into().map_err(|files: Vec<Vec<u8>>| {
                    DdpTrainError::Resume(format!(
                        "checkpoint {epoch}: {} files instead of {}",
                        files.len(),
                        KINDS.len()
                    ))
                })?;
                self.load_records(learner, files, &paths)?;
                tracing::info!(rank = pg.rank(), epoch, "resumed from rank 0's checkpoint");
            }
            None => {
                // The same on every rank (the source was compared above).
                let Some(checkpointer) = &components.checkpointer else {
                    return Err(DdpTrainError::Settings(format!(
                        "resuming after epoch {epoch} needs a checkpoint to load, but neither \
                         DdpStrategy::with_checkpoints(dir) nor burn-train's \
                         with_file_checkpointer is set (epoch {} would start from untrained \
                         weights): add with_checkpoints(dir) with the training directory, or \
                         start over without a resume point",
                        epoch + 1
                    )));
                };
                // burn-train's own checkpointer: every rank reads the files (shared directory).
                // It panics on a missing or cut-short file (burn writes in place, so a kill
                // mid-write leaves one): an error here fails every rank instead, and says how
                // to get past it rather than crash on every restart.
                let loaded = catch_unwind(AssertUnwindSafe(|| {
                    checkpointer.load_checkpoint(learner.clone(), &device, epoch)
                }));
                *learner = loaded.map_err(|panic| {
                    DdpTrainError::Resume(format!(
                        "burn-train's checkpointer could not load the checkpoint of epoch \
                         {epoch} ({}): checkpoint/model-{epoch}, optim-{epoch} or \
                         scheduler-{epoch} in the training directory is missing or cut short \
                         (burn writes them in place; a kill mid-write cuts one). Delete those \
                         three files of epoch {epoch} to resume from the epoch before, or use \
                         DdpStrategy::with_checkpoints(dir), which writes atomically",
                        panic_message(panic.as_ref())
                    ))
                })?;
            }
        }
        Ok(Some((point, None)))
    }

    /// Decodes a checkpoint's model, optimizer and scheduler records (`paths` in that order,
    /// for errors) into `learner`.
    fn load_records<LC: DdpComponents>(
        &self,
        learner: &mut Learner<LC>,
        [model, optim, scheduler]: [Vec<u8>; 3],
        paths: &[PathBuf],
    ) -> Result<()> {
        let device = &model_device(&learner.model());
        learner.load_model(decode::<LC::Backend, LearnerModelRecord<LC>>(
            model, device, &paths[0],
        )?);
        learner.load_optim(decode::<LC::Backend, LearnerOptimizerRecord<LC>>(
            optim, device, &paths[1],
        )?);
        learner.load_scheduler(decode::<LC::Backend, LearnerSchedulerRecord<LC>>(
            scheduler, device, &paths[2],
        )?);
        Ok(())
    }

    /// One epoch's training steps on every rank, from `resume_at`'s step when the epoch
    /// resumes a mid-epoch checkpoint; rank 0 passes its `step_checkpointer`.
    #[allow(clippy::too_many_arguments)]
    fn train_epoch<LC: DdpComponents>(
        &self,
        components: &mut TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        ddp: &mut DistributedDataParallel<LC::Backend, TrainingModel<LC>>,
        train: &TrainLoader<LC>,
        global: &Progress,
        resume_at: Option<LoaderPosition>,
        step_checkpointer: Option<&mut StepCheckpointer>,
    ) -> Result<EpochEnd> {
        let mut iter = train.iter();
        // Dropping the iterator joins its loader thread: on a failure the group is aborted
        // first.
        self.abort_on_failure(|| {
            self.train_steps(
                components,
                learner,
                ddp,
                &mut *iter,
                global,
                resume_at,
                step_checkpointer,
            )
        })
    }

    /// [`train_epoch`](Self::train_epoch)'s steps over `iter`.
    #[allow(clippy::too_many_arguments)]
    fn train_steps<LC: DdpComponents>(
        &self,
        components: &mut TrainingComponents<LC>,
        learner: &mut Learner<LC>,
        ddp: &mut DistributedDataParallel<LC::Backend, TrainingModel<LC>>,
        iter: &mut dyn DataLoaderIterator<<TrainingModel<LC> as TrainStep>::Input>,
        global: &Progress,
        resume_at: Option<LoaderPosition>,
        mut step_checkpointer: Option<&mut StepCheckpointer>,
    ) -> Result<EpochEnd> {
        let pg = &self.pg;
        let (world, rank) = (pg.world_size(), pg.rank());
        let epoch = global.items_processed;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        let device = model_device(&learner.model());
        let mut accumulated = 0;
        let mut step = skip_to(&mut *iter, epoch, resume_at)?;
        let mut end = EpochEnd::Completed;
        loop {
            // A data error ends the run here (this rank's failure aborts the group, so the
            // others fail at the next collective, quoting it).
            let batch = next_batch(&mut *iter).map_err(|f| f.in_epoch(epoch))?;
            // Who has a batch, and did anyone's interrupter fire.
            let mut control = vec![0u8; world + 1];
            control[rank] = u8::from(batch.is_some());
            control[world] = u8::from(components.interrupter.should_stop());
            if world > 1 {
                pg.all_reduce(&mut control, ReduceOp::Max)
                    .map_err(DdpTrainError::comm(format!(
                        "epoch {epoch}: starting step {}",
                        step + 1
                    )))?;
            }
            if control[world] == 1 {
                end = EpochEnd::Interrupted;
                break;
            }
            let exhausted: Vec<usize> = (0..world).filter(|&r| control[r] == 0).collect();
            let Some(batch) = batch.filter(|_| exhausted.is_empty()) else {
                if exhausted.len() == world {
                    break;
                }
                return Err(DdpTrainError::UnevenBatches {
                    epoch,
                    step: step + 1,
                    exhausted,
                });
            };
            step += 1;
            // The LR scheduler steps once per optimizer step, as in PyTorch.
            if accumulated == 0 {
                learner.lr_step();
            }
            let progress = iter.progress();
            let items_done = progress.items_processed;
            accumulated += 1;
            // The user's step on a tapped copy of the learner's model: its backward feeds the
            // buckets. The gradients it returns are empty (the taps keep them): use DDP's.
            let model = learner.model();
            let context = || format!("epoch {epoch}, step {step}: training step");
            let output = if accumulated == accumulation {
                let (output, grads) = ddp
                    .step_on(&model, |m| m.step(batch))
                    .map_err(DdpTrainError::ddp(context()))?;
                learner.optimizer_step(grads);
                accumulated = 0;
                let mut state = self.lock();
                state.report.optimizer_steps += 1;
                if let Some(stats) = ddp.last_step_stats() {
                    state.report.buckets += stats.buckets as u64;
                    state.report.buckets_launched_during_backward +=
                        stats.buckets_launched_during_backward as u64;
                    state.report.early_gradients += stats.early_gradients as u64;
                }
                output
            } else {
                ddp.step_on_no_sync(&model, |m| m.step(batch))
                    .map_err(DdpTrainError::ddp(context()))?
            };
            self.lock().report.train_steps += 1;
            let global_batch = self.metrics == MetricsSync::Global;
            match exchange(pg, Some(output.item), global_batch, &device, step)? {
                Exchange::Step(Some(item)) => {
                    let item = TrainingItem::new(
                        item,
                        progress,
                        global.clone(),
                        Some(step),
                        Some(learner.lr_current()),
                    );
                    components
                        .event_processor
                        .process_train(LearnerEvent::ProcessedItem(item));
                }
                Exchange::Step(None) => {}
                Exchange::Done => {
                    return Err(DdpTrainError::ItemSync {
                        step,
                        reason: "no rank reported an output for a step every rank ran".into(),
                    });
                }
            }
            // Every rank counts the same steps, so all know a checkpoint is due; rank 0 alone
            // holds a checkpointer and writes (a failure ends the run on every rank).
            let due = accumulated == 0
                && self
                    .every_n_steps
                    .is_some_and(|n| (step / accumulation).is_multiple_of(n));
            if due && let Some(checkpointer) = step_checkpointer.as_deref_mut() {
                let position = LoaderPosition {
                    epoch,
                    step,
                    world,
                    items: items_done,
                };
                checkpointer.save(learner, &components.event_store, position)?;
                self.lock().report.step_checkpoints += 1;
            }
        }
        if accumulated > 0 {
            // As burn-train's own loop: micro-batches left at the end of an epoch are dropped
            // (every rank has the same count: the ranks step together).
            ddp.discard_no_sync_gradients().map_err(DdpTrainError::ddp(
                "dropping a partial gradient accumulation",
            ))?;
            tracing::debug!(
                epoch,
                accumulated,
                "dropping a partial gradient accumulation"
            );
        }
        if rank == 0 {
            components
                .event_processor
                .process_train(LearnerEvent::EndEpoch(epoch));
        }
        Ok(end)
    }

    fn valid_epoch<LC: DdpComponents>(
        &self,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
        learner: &Learner<LC>,
        valid: &ValidLoader<LC>,
        global: &Progress,
    ) -> Result<()> {
        let mut iter = valid.iter();
        // As in `train_epoch`: the group is aborted before the loader thread is joined. This
        // also covers a panic of the user's `InferenceStep`, which, unlike the training step,
        // runs outside ddp-core's guard.
        self.abort_on_failure(|| self.valid_steps(processor, learner, &mut *iter, global))
    }

    /// [`valid_epoch`](Self::valid_epoch)'s steps over `iter`.
    fn valid_steps<LC: DdpComponents>(
        &self,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
        learner: &Learner<LC>,
        iter: &mut dyn DataLoaderIterator<<LC::InferenceModel as InferenceStep>::Input>,
        global: &Progress,
    ) -> Result<()> {
        let epoch = global.items_processed;
        // Autodiff backends share their inner backend's device type.
        let device = model_device(&learner.model());
        let model = learner.model().valid();
        let global_batch = self.metrics == MetricsSync::Global;
        let mut step = 0;
        loop {
            // Shards may differ by one batch: a rank without one still takes part. A data
            // error fails the run (not a shorter validation set).
            let batch = next_batch(&mut *iter).map_err(|f| f.in_epoch(epoch))?;
            let output = batch.map(|batch| model.step(batch));
            let progress = iter.progress();
            match exchange(&self.pg, output, global_batch, &device, step + 1)? {
                Exchange::Done => break,
                Exchange::Step(item) => {
                    step += 1;
                    if let Some(item) = item {
                        let item =
                            TrainingItem::new(item, progress, global.clone(), Some(step), None);
                        processor.process_valid(LearnerEvent::ProcessedItem(item));
                    }
                }
            }
        }
        if self.pg.rank() == 0 {
            processor.process_valid(LearnerEvent::EndEpoch(epoch));
        }
        Ok(())
    }
}

/// Moves a fresh epoch's iterator to where a mid-epoch checkpoint left it and returns the
/// steps already taken (0 without one). A loader that starts there itself (a
/// [`DistributedLoader`](crate::DistributedLoader) given the same
/// [`ResumePoint`]) is checked; any other has the taken batches pulled and dropped.
fn skip_to<O>(
    iter: &mut dyn burn::data::dataloader::DataLoaderIterator<O>,
    epoch: usize,
    resume_at: Option<LoaderPosition>,
) -> Result<usize> {
    let start = iter.progress().items_processed;
    let Some(position) = resume_at else {
        if start != 0 {
            return Err(DdpTrainError::Resume(format!(
                "epoch {epoch}: the training loader starts at item {start}, inside the epoch, \
                 but the strategy resumes at its start: give DdpStrategy::with_resume the \
                 ResumePoint the loader got"
            )));
        }
        return Ok(0);
    };
    if start == 0 {
        for pulled in 0..position.step {
            if next_batch(iter).map_err(|f| f.in_epoch(epoch))?.is_none() {
                return Err(DdpTrainError::Resume(format!(
                    "epoch {epoch}: the training loader ended after {pulled} batches, but the \
                     checkpoint was taken after step {}",
                    position.step
                )));
            }
        }
    }
    let at = iter.progress().items_processed;
    if at != position.items {
        return Err(DdpTrainError::Resume(format!(
            "epoch {epoch}: after step {} the training loader is at item {at}, but it was at \
             item {} when the checkpoint was taken: resume with the same data set, batch size \
             and world size",
            position.step, position.items
        )));
    }
    Ok(position.step)
}

fn lock_failure(slot: &FailureSlot) -> std::sync::MutexGuard<'_, Option<DdpTrainError>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// burn-train's checkpointer over [`AtomicFileCheckpointer`]s (rank 0 only), with burn-train's
/// default choice of epochs to keep. A failed write stops training through `interrupter` (as
/// burn's own does) and is kept in `failure`.
fn atomic_checkpointer<LC: DdpComponents>(
    dir: &Path,
    failure: &FailureSlot,
    interrupter: &burn_train::Interrupter,
) -> LearningCheckpointer<LC> {
    let file = |kind| AtomicFileCheckpointer::new(dir.to_path_buf(), kind, failure.clone());
    let keep = ComposedCheckpointingStrategy::builder()
        .add(KeepLastNCheckpoints::new(2))
        .add(MetricCheckpointingStrategy::new(
            &LossMetric::<LC::Backend>::new(),
            Aggregate::Mean,
            Direction::Lowest,
            Split::Valid,
        ))
        .build();
    LearningCheckpointer::new(
        AsyncCheckpointer::new(file("model")).with_interrupter(interrupter.clone()),
        AsyncCheckpointer::new(file("optim")).with_interrupter(interrupter.clone()),
        AsyncCheckpointer::new(file("scheduler")).with_interrupter(interrupter.clone()),
        Box::new(keep),
    )
}

/// Waits until burn-train's event thread has handled the validation epoch's end, so the
/// checkpointer and early stopping read this epoch's metrics. The processor's channel holds one
/// message and validation's `Start` is a no-op: the second `Start` is accepted only after the
/// event before it (the end of the epoch) was fully processed.
fn flush_valid<LC: DdpComponents>(processor: &mut SupervisedTrainingEventProcessor<LC>) {
    processor.process_valid(LearnerEvent::Start);
    processor.process_valid(LearnerEvent::Start);
}

impl<LC: DdpComponents> SupervisedLearningStrategy<LC> for DdpStrategy {
    /// burn-train's `train`, with events, summary and rendering on rank 0 only.
    fn train(
        &self,
        learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        mut components: TrainingComponents<LC>,
    ) -> LearningResult<LC::InferenceModel> {
        let rank0 = self.pg.rank() == 0;
        // The checkpoint itself is loaded inside `fit` (collectively, see `resume`), where a
        // failure ends the run on every rank instead of panicking.
        // (A contradictory resume point fails in `fit`, on every rank.)
        let starting_epoch = self
            .resume_point(components.checkpoint)
            .ok()
            .flatten()
            .map_or(1, |point| point.epochs_done + 1);
        let summary = components.summary.clone();
        if rank0 {
            components
                .event_processor
                .process_train(LearnerEvent::Start);
        }
        let (model, mut processor) = self.fit(
            components,
            learner,
            dataloader_train,
            dataloader_valid,
            starting_epoch,
        );
        if rank0 {
            let summary = summary.and_then(|s| s.init().ok());
            processor.process_train(LearnerEvent::End(summary));
        }
        LearningResult {
            model: model.valid(),
            renderer: processor.renderer(),
        }
    }

    fn fit(
        &self,
        mut components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        // A panic (the user's step or scheduler, burn's code) aborts the group before it
        // unwinds on, so the peers fail at once, quoting it, instead of at the timeout.
        let outcome = self.abort_on_failure(|| {
            self.run(
                &mut components,
                &mut learner,
                &dataloader_train,
                &dataloader_valid,
                starting_epoch,
            )
        });
        if let Err(e) = outcome {
            self.fail(e);
        }
        (learner.model(), components.event_processor)
    }
}

/// Makes a burn-train `SupervisedTraining` distributed.
pub trait DistributedTrainingExt {
    /// Trains with `strategy` (see [`DdpStrategy`]). Rank 0 renders: burn-train's terminal
    /// dashboard when it runs in a terminal outside the launcher (with the `tui` feature, on by
    /// default, and `DDP_PROGRESS` unset or `auto`), else [`ProgressRenderer`] (the launcher's
    /// live bar, or its own bar or lines); call `.renderer(...)` afterwards for another. The
    /// other ranks draw nothing and install no experiment log file (rank 0 renders and logs for
    /// the whole job).
    fn distributed(self, strategy: &DdpStrategy) -> Self;
}

impl<LC: DdpComponents + 'static> DistributedTrainingExt for SupervisedTraining<LC> {
    fn distributed(self, strategy: &DdpStrategy) -> Self {
        let mut training =
            self.with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy.clone())));
        if let Some(point) = strategy.resume.filter(|p| p.epochs_done > 0) {
            // burn-train's view of the resumed epoch (its dashboard shows it).
            training = training.checkpoint(point.epochs_done);
        }
        if strategy.rank() == 0 {
            let dashboard = uses_dashboard(
                cfg!(feature = "tui"),
                std::io::stdout().is_terminal(),
                ddp_core::progress::claim_report_pipe(),
                ProgressSetting::from_env(),
            );
            if dashboard {
                // burn-train's default renderer: its dashboard, given the run's interrupter
                // (quitting it stops every rank at the next step) and resumed epoch.
                training
            } else {
                training.renderer(ProgressRenderer::new())
            }
        } else {
            training
                .renderer(SilentRenderer)
                .with_application_logger(None)
        }
    }
}

/// Whether rank 0 keeps burn-train's own renderer (its dashboard): only when it is built in
/// (`tui_built`), stdout is a terminal, the launcher gave this process no report pipe (under
/// the launcher, its bar shows progress above every rank's output) and `DDP_PROGRESS` does not
/// ask for bars or lines.
fn uses_dashboard(
    tui_built: bool,
    stdout_is_terminal: bool,
    under_launcher: bool,
    setting: ProgressSetting,
) -> bool {
    tui_built && stdout_is_terminal && !under_launcher && setting == ProgressSetting::Auto
}

/// The device the model's parameters live on (the default device for a model without any).
fn model_device<B: Backend, M: Module<B>>(model: &M) -> B::Device {
    model.devices().into_iter().next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_is_drawn_only_in_a_terminal_outside_the_launcher_when_asked_for_nothing_else()
    {
        use ProgressSetting::{Auto, Bar, Lines};
        assert!(uses_dashboard(true, true, false, Auto));
        // Not built, not a terminal, under the launcher, or bars/lines asked for: ours.
        assert!(!uses_dashboard(false, true, false, Auto));
        assert!(!uses_dashboard(true, false, false, Auto));
        assert!(!uses_dashboard(true, true, true, Auto));
        assert!(!uses_dashboard(true, true, false, Bar));
        assert!(!uses_dashboard(true, true, false, Lines));
    }
}
