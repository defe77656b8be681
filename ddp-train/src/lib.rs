//! # ddp-train
//!
//! burn-train's own training loop (`SupervisedTraining`, its metrics, renderer, checkpointer and
//! early stopping) on several processes: a data-parallel training strategy over a ddp-burn
//! [`ProcessGroup`](ddp_core::comm::ProcessGroup), the equivalent of PyTorch DDP driven by a
//! high-level trainer.
//!
//! ```text
//! let strategy = DdpStrategy::new(ctx.into_process_group());
//! let train = DistributedLoader::train(train_set, batcher, 32, sampler_config)?;
//! let valid = DistributedLoader::eval(test_set, batcher, 256, world, rank)?;
//! let result = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
//!     .metrics((AccuracyMetric::new(), LossMetric::new()))
//!     .num_epochs(10)
//!     .distributed(&strategy)          // the one call that makes it distributed
//!     .launch(Learner::new(model, optim, lr));
//! let report = strategy.finish()?;     // the run's outcome (burn's trait cannot return errors)
//! ```
//!
//! `examples/digits_learner.rs` is the complete program (launcher, resume, `--fresh`):
//! `cargo run -p ddp-train --example digits_learner -- --nproc-per-node 2`.
//!
//! - [`DdpStrategy`]: burn-train's `SupervisedLearningStrategy`. The user's `TrainStep` runs
//!   unchanged; its gradients are averaged over the ranks after its backward, the optimizer
//!   and LR scheduler step once per step, gradient accumulation accumulates locally and
//!   reduces once per optimizer step (PyTorch's `no_sync`). Rank 0 renders, logs, checkpoints
//!   and decides early stopping; its decision is broadcast so every rank stops together.
//! - [`DistributedLoader`]: burn's `DataLoader` trait over ddp-data's distributed sampler
//!   (each rank its shard, reshuffled every epoch) and exact evaluation shards.
//! - Checkpoints without a shared filesystem ([`DdpStrategy::with_checkpoints`]): rank 0
//!   alone writes burn-train's model, optimizer and scheduler files, each atomically (temporary
//!   file, fsync, rename, directory fsync: a crash mid-write leaves the previous checkpoint
//!   whole), at full precision, at epoch ends and, with
//!   [`DdpStrategy::with_checkpoint_every_n_steps`], inside epochs too (then with the loader's
//!   position); on resume rank 0 reads them and broadcasts the bytes, so the other ranks never
//!   read the directory. See [Resuming](#resuming).
//! - [`resume_point`]: rank 0's latest checkpoint (an epoch end or a step inside a later
//!   epoch) on every rank, a [`ResumePoint`] for [`DdpStrategy::with_resume`] and
//!   [`DistributedLoader::with_resume`]. [`resume_epoch`]: the latest epoch end only.
//! - [`ProgressRenderer`]: rank 0's renderer, installed by `distributed`: a bar per epoch and
//!   phase with the latest metrics, drawn by the launcher when the job runs under it (as the
//!   hand-written examples' bars are), else on rank 0's terminal, else a line every few
//!   seconds. When rank 0 runs in a terminal outside the launcher (a world-1 run, or ranks
//!   started by hand), it shows burn-train's own terminal dashboard instead (feature `tui`, on
//!   by default as in burn-train; `DDP_PROGRESS=bar` or `lines` keeps the bar); quitting the
//!   dashboard stops every rank at the next step.
//! - [`latest_checkpoint`]: the latest complete epoch in this process's directory.
//! - [`DistributedItem`]: how a step output is merged across ranks, so metrics cover the
//!   global batch (implemented for burn-train's classification and regression outputs).
//!
//! ## Resuming
//! ```text
//! let resume = resume_point(&pg, &dir)?;               // the same on every rank
//! let strategy = DdpStrategy::new(pg.clone())
//!     .with_checkpoints(&dir)                          // rank 0 writes, atomically
//!     .with_checkpoint_every_n_steps(100)              // also inside epochs
//!     .with_resume(resume);                            // loads rank 0's checkpoint
//! let train = DistributedLoader::train(train_set, batcher, 32, sampler_config)?
//!     .with_resume(resume);                            // the sampler's epoch and position
//! ```
//! Every rank continues at the checkpoint's step of its epoch (an epoch end without step
//! checkpoints, the default: a run killed mid-epoch then repeats that epoch from its start):
//! model, optimizer and LR scheduler from rank 0's files, the data order continued by
//! ddp-data's [`SamplerState`](ddp_core::data::SamplerState) (the seeded shuffle of that
//! epoch, skipping no sample and repeating none), so a resumed run ends with the weights of
//! an uninterrupted one, bitwise on CPU. A mid-epoch checkpoint is taken after every `n`-th
//! optimizer step of an epoch; every rank counts the same steps, so all know when, and rank 0
//! alone writes, before the next step (the others wait for it at that step's all-reduce). A
//! failed write, ranks given different points, a loader and a strategy at different
//! positions, a [`DistributedLoader`] shuffling for another epoch than the resumed one or
//! with another data set length, seed, `shuffle` or `drop_last` than the checkpoint's, or a
//! world size other than the checkpoint's end the run on every rank with an error saying
//! which.
//!
//! Not saved: the backend's random state (a model with dropout continues with another random
//! stream, so its weights are not bitwise) and burn-train's metric state inside the epoch:
//! the resumed epoch's *training* metrics (shown, logged, and read by early stopping or the
//! checkpoint choice if they use training metrics) cover only the steps after the checkpoint;
//! its validation metrics and every later epoch's are exact. burn-train 0.21 files the first
//! resumed epoch's per-step log lines under `epoch-1` (its metric store counts from 1 until an
//! epoch ends; the same with its own resume); the epoch summaries carry the right numbers.
//!
//! ## What is exact and what is not
//! Metrics computed from the merged output (loss, accuracy, top-k, AUROC, precision/recall,
//! ...) are those of one process holding the global batch; the loss is the batch-weighted mean
//! of the ranks' losses, which equals the global batch's loss for losses that are means over
//! samples (burn's default `Reduction::Mean`), not for sums or losses that mix samples.
//! Not summed: the learning rate (the same on every rank), iteration speed and system metrics
//! (CPU, memory, GPU) are rank 0's own. Training metrics on the padded last shard count the
//! repeated samples, as PyTorch's `DistributedSampler` does; evaluation shards have no padding.
//!
//! ## Overlap
//! Gradients are all-reduced *while* the user's backward runs, as in PyTorch's DDP, though
//! burn-train's `TrainStep::step` runs the forward and a plain `loss.backward()` itself: the
//! step runs through ddp-core's [`DistributedDataParallel::step_on`](ddp_core::DistributedDataParallel::step_on),
//! which calls it on a copy of the learner's model whose parameters pass through gradient taps,
//! with the bucket reducer armed before it. As burn's backward reaches each parameter, its
//! gradient is copied into its bucket; a full bucket's all-reduce starts at once, in the same
//! bucket order on every rank. What is left after backward is waiting for the last buckets.
//! [`DdpReport::buckets_launched_during_backward`] counts the buckets issued from inside
//! backward. Plain taps fire at the end of each parameter's backward chain; a model that marks
//! [`layer_boundary`](ddp_core::layer_boundary)s in its forward hands each layer's gradients
//! over as soon as that layer's backward is done ([`DdpReport::early_gradients`]).
//!
#![warn(missing_docs, missing_debug_implementations)]

mod checkpoint;
mod components;
mod error;
mod item;
mod loader;
mod mid_epoch;
mod params;
mod renderer;
mod resume;
mod silent;
mod strategy;

/// The burn-train this crate is built on (`=0.21.0`, without its `ddp` feature), for
/// programs that need its exact version without naming it themselves.
pub use burn_train;
pub use checkpoint::resume_epoch;
pub use components::DdpComponents;
pub use error::{DdpTrainError, Result};
pub use item::DistributedItem;
pub use loader::DistributedLoader;
pub use mid_epoch::{ResumePoint, resume_point};
pub use renderer::ProgressRenderer;
pub use resume::latest_checkpoint;
pub use silent::SilentRenderer;
pub use strategy::{DdpReport, DdpStrategy, DistributedTrainingExt, MetricsSync};
