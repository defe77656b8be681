//! # ddp-core
//!
//! Distributed data-parallel training for burn: the crate users depend on.
//!
//! - [`DistributedDataParallel`] wraps any `AutodiffModule` on any `Autodiff<B>` backend:
//!   rank-0 sync at construction, gradient taps, buckets all-reduced while backward runs,
//!   `backward_no_sync` for accumulation, communication hooks, a Chrome-trace timeline. Its
//!   semantics are PyTorch's: buffers follow rank 0, parameters no rank used get no gradient,
//!   errors abort the group so every rank fails fast (see its docs).
//!
//! ## Where things are
//! The root holds DDP itself: [`DistributedDataParallel`], [`DdpConfig`] (with [`Collectives`]
//! and [`HostStaging`]), [`DdpError`], [`StepStats`], [`TapBackend`], [`layer_boundary`], and
//! the two ways into a job, [`init_from_env`] and [`launch()`]. Everything else has one path,
//! in one module:
//!
//! | module | what |
//! |---|---|
//! | [`hooks`] | how a bucket is averaged: fp16/bf16 compression, PowerSGD, your own [`hooks::CommHook`] |
//! | [`comm`] | process groups and collectives (the `ddp-comm` crate): [`comm::ProcessGroup`], [`comm::init_process_group`], the store, NCCL |
//! | [`data`] | the sampler and loader (the `ddp-data` crate): [`data::DistributedSamplerConfig`], [`data::DistributedDataLoaderBuilder`], [`data::ExactShard`] |
//! | [`launcher`] | the launcher (the `ddp-launch` crate): [`launcher::LaunchArgs`], [`launcher::WorkerEnv`], the `ddp-run` binary |
//! | [`checkpoint`] | [`checkpoint::FullCheckpointer`] (rank 0 writes the whole model) and [`checkpoint::sharded::ShardedCheckpointer`] (every rank its shard) |
//! | [`zero`] | [`zero::ZeroRedundancyOptimizer`]: ZeRO stages 1 and 2 |
//! | [`fsdp`] | [`fsdp::FullyShardedDataParallel`]: fully sharded parameters (ZeRO stage 3, FSDP2's idea) |
//! | [`amp`] | mixed precision: [`amp::GradScaler`], [`amp::autocast`] |
//! | [`nn`] | layers that talk to the group: [`nn::SyncBatchNorm`] |
//! | [`metrics`] | evaluation totals over all ranks: [`metrics::EvalTotals`] |
//! | [`progress`] | a per-epoch progress bar on rank 0: [`progress::EpochProgress`] |
//!
//! In words:
//! - [`hooks`]: [`DistributedDataParallel::register_comm_hook`] replaces the exact average with
//!   fp16/bf16 compression, PowerSGD, or your own hook.
//! - [`DdpConfig::uneven_inputs`] and [`DistributedDataParallel::join`]: ranks with different
//!   numbers of batches (PyTorch's `Join`).
//! - [`layer_boundary`]: opt-in marks in a model's forward so each layer's gradients leave
//!   as soon as that layer's backward is done.
//! - [`checkpoint`]: [`checkpoint::FullCheckpointer`] writes model (safetensors), optimizer and
//!   training state atomically on rank 0 after a barrier; every rank resumes from the latest
//!   valid checkpoint, bitwise exactly on CPU.
//! - [`launcher`]: [`launch()`] makes a training binary launch itself once per rank
//!   (torchrun for `cargo run`), and the `ddp-run` binary is the torchrun-style CLI; both
//!   supervise the workers, stop them all on a failure and restart the group with
//!   `--max-restarts`.
//! - [`zero`]: [`zero::ZeroRedundancyOptimizer`] shards any optimizer's state across the ranks
//!   (ZeRO stage 1, and stage 2 with reduce-scattered gradients), with checkpoints that resume
//!   at another world size.
//! - [`fsdp`]: [`fsdp::FullyShardedDataParallel`] shards the parameters too: between steps each
//!   rank holds `1/world` of every unit's parameters, gradients and optimizer state.
//! - [`amp`]: [`amp::GradScaler`], dynamic loss scaling (PyTorch's `GradScaler`) whose found-inf
//!   flag is all-reduced, so every rank skips the same steps and keeps the same scale.
//! - [`metrics`]: evaluation without padding: [`data::ExactShard`] puts each test sample on
//!   exactly one rank and [`metrics::EvalTotals`] all-reduces the counts, so accuracy covers the
//!   test set once.
//! - [`nn`]: [`nn::SyncBatchNorm`], batch norm over the global batch with gradients through the
//!   statistics.
//! - [`progress`]: a per-epoch progress bar on rank 0 with the loss averaged across ranks.
//! - [`TapBackend`]: the backends DDP can tap (every `Autodiff<B>`).
//!
//! ## Features
//! - `cuda`: burn's CUDA backend and NCCL through cudarc; `comm::cuda_driver_present()` (with
//!   the feature) checks for a driver before the first GPU tensor operation.
//! - `test-hooks`: crash points and other test-only hooks, for this project's own tests; never
//!   in a release.
//! - `ndarray`: burn's NdArray CPU backend; DDP, ZeRO, FSDP and checkpoints on
//!   `Autodiff<NdArray>`.
//! - `tch`: burn's LibTorch backend (`burn::backend::LibTorch`: PyTorch's own kernels through the
//!   `tch` crate). DDP, ZeRO 1 and 2, FSDP and checkpoints work on `Autodiff<LibTorch>` as on
//!   Flex (the tests: `cargo test -p ddp-core --features tch --test tch_backend`), and
//!   [`nn::SyncBatchNorm`] takes `LibTorch` too. Gradients go through host memory (NCCL
//!   reduces only burn's CUDA backend's buffers). Off by default: building it needs libtorch
//!   2.9.0, the version burn 0.21's `burn-tch` (tch 0.22) is built against. The simplest is
//!   PyPI's PyTorch:
//!
//!   ```text
//!   python3 -m pip install torch==2.9.0
//!   LIBTORCH_USE_PYTORCH=1 cargo test -p ddp-core --features tch --test tch_backend
//!   ```
//!
//!   (in a virtualenv, activate it first: tch's build runs `python` there, `python3` outside
//!   one), or `LIBTORCH=/path/to/libtorch` for an unpacked libtorch. Without either, tch's
//!   build tries to download libtorch and fails where download.pytorch.org is unreachable. This
//!   crate's tests and examples, and ddp-examples' binaries, get an rpath to libtorch's
//!   directory (their `build.rs`); a program of your own either sets `LD_LIBRARY_PATH` to it
//!   (`python3 -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")'`) or adds
//!   the same rpath in a build script. A LibTorch rank's intra-op threads are PyTorch's: it
//!   reads `OMP_NUM_THREADS`, which the launcher sets (cores / local ranks) next to
//!   `RAYON_NUM_THREADS`.
//!
//! ## One step, as data flows
//! 1. `ddp.forward(|m| ...)` (`ddp/wrapper/mod.rs`): a copy of the module whose trainable
//!    parameters pass through taps (`engine/tap/mod.rs`; one step's passes in
//!    `engine/tap/passes.rs`) runs your forward.
//! 2. `ddp.backward(loss)`: rank 0's buffers start travelling (`ddp/buffers.rs`); burn's
//!    backward reaches each tap, which hands the gradient to the reducer (`engine/reducer/mod.rs`, the
//!    bucket bookkeeping); a full bucket is launched, in order, through the bucket reduction
//!    (`engine/reducer/reduction.rs`: how a bucket is reduced, over ddp-comm).
//! 3. After backward the reducer launches what is left, agrees on which parameters some rank
//!    used, waits for the buckets and returns `GradientsParams`; the buffers land.
//! 4. `ddp.optimizer_step(..)` applies your optimizer.
//!
//! ## GPUs
//! On `Autodiff<Cuda>` with one GPU per rank, buckets are concatenated on the device and
//! averaged in place by NCCL, each gradient a slice of its bucket ([`Collectives::Auto`]; the
//! ranks agree, and fall back to host staging, one copy per bucket, where NCCL cannot run).
//! [`Collectives::Nccl`] forces NCCL, [`Collectives::Host`] the CPU transports. Bucket layouts
//! are compared across ranks before the first bucket, so a mismatch is
//! [`DdpError::BucketLayoutMismatch`], not a hang inside NCCL. The NCCL engine's protocol
//! (issuing thread, bucket order, ready fences, watchdog, abort) is written once over a device
//! seam; [`Collectives::StandIn`] runs it on a CPU stand-in (host buffers, a communicator of its
//! own over the CPU transports), which is how it is tested at worlds 2-8 without GPUs. The same
//! seam carries ZeRO stage 2's reduce-scatters and all-gathers
//! ([`ZeroRedundancyOptimizer::with_collectives`](zero::ZeroRedundancyOptimizer::with_collectives))
//! and FSDP's ([`FsdpConfig::with_collectives`](fsdp::FsdpConfig::with_collectives)): on a device
//! communicator their gradients and parameters stay tensors on the device.
//!
//! ## A training loop
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::{SgdConfig, Optimizer};
//! use burn::tensor::{Tensor, backend::Backend};
//! use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env};
//!
//! type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Default::default();
//! let pg = init_from_env()?; // set by ddp-run, torchrun, srun or mpirun
//! let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new())?;
//! let mut optim = SgdConfig::new().init();
//! for _step in 0..10 {
//!     let x = Tensor::<B, 2>::ones([8, 4], &device); // this rank's shard of the batch
//!     let y = Tensor::<B, 2>::zeros([8, 1], &device);
//!     let pred = ddp.forward(|m| m.forward(x))?;
//!     let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
//!     let grads = ddp.backward(loss)?; // averaged over all ranks
//!     ddp.optimizer_step(&mut optim, 0.1, grads);
//! }
//! # Ok(()) }
//! ```
//!
//! ## Overlap
//! burn runs backward by node depth, deepest first, and a plain tap sits right above its
//! parameter, so plain taps all fire at the end of backward and no bucket can leave earlier.
//! With [`DdpConfig::automatic_overlap`] (on by default; `with_automatic_overlap(false)` turns
//! it off) each tap is created at its parameter's first use in the forward; the first backward
//! learns, with probes in every level, how deep each
//! tap's consumers are, and from the second step on each tap is anchored (through a chain of
//! free, untracked identity nodes) one level below its shallowest consumer. Backward then
//! reaches it right after the layer that used the parameter, and every other node keeps its
//! depth, so backward runs the same operations in the same order: results are bitwise those of
//! plain taps (tested, with fan-outs, shared layers and graphs that change; the whole DDP suite
//! runs in this mode). A step whose
//! forward uses parameters in another order gets plain taps from the first difference on; when
//! that happens, or the loss's depth differs from the learned one, the next backward learns
//! again. Bucket order and the collectives are unaffected (buckets always launch in order), so
//! no shape of model can make ranks disagree. [`step_on`](DistributedDataParallel::step_on) cannot learn (the loss stays inside its
//! closure): it uses what a `forward`/`backward` step learned, else plain taps.
//!
//! Buckets are laid out from arrival order: after the first synchronised backward (the learning
//! step, whose plain taps arrive in an order that mixes layers), and once more after the first
//! backward whose taps were anchored on every rank (the ranks agree through one byte of the
//! used-parameters all-reduce), so each bucket then holds neighbouring layers and leaves right
//! after them. Only once, as PyTorch rebuilds its buckets once: a graph learned again later
//! keeps the layout (communication hooks such as PowerSGD key their state by bucket).
//!
//! Taps that fire early only help if the buckets they fill can leave early: a bucket is
//! launched when its last gradient arrives, so the bucket holding the first layer always
//! waits for the end of backward. With PyTorch's caps alone (1 MiB first bucket, 25 MiB after)
//! a model of up to ~25 MiB of gradients is one or two buckets and hides almost nothing. So
//! both caps are lowered to a quarter of a small model's gradient bytes
//! ([`DdpConfig::min_buckets`], default 4, not below 16 KiB; `with_min_buckets(1)` keeps the
//! caps as configured). The layout depends only on the model, so runs still reproduce bit for
//! bit; on shared memory, which adds every element in rank order, the values are also those
//! of one bucket (tested); only when each bucket leaves changes.
//!
//! [`layer_boundary`] marks in the model still work: a boundary hands over every tap that is
//! complete when backward passes it. [`StepStats::overlap_fraction`] reports how much
//! communication ran during backward, [`StepStats::bucket_ready`] when each bucket was ready
//! relative to the end of backward, and [`StepStats::anchored_taps`] how many taps were anchored.
//!
//! Measured with the `ddp_step` bench (`--overlap-only --overlap-steps 100`, world 2 over
//! shared memory, DDP's default configuration, the 2-core machine, two runs; README,
//! "Benchmarks"): share of all-reduce time hidden behind backward by default 56-62% (MLP),
//! 90-91% (transformer), 99% (CNN); with overlap off 13-15%, 6-7%, 74%. The default's step time
//! over overlap off's (median of per-round paired ratios) was 0.977-1.002 at world 2, each
//! with a 95% interval reaching 1.00 or below, and 0.997-1.020 at world 1.
//!
//! ## Memory traffic
//! A bucket is reduced as one coalesced collective over its gradients' own buffers
//! ([`ProcessGroup::all_reduce_coalesced_async`](comm::ProcessGroup::all_reduce_coalesced_async)): on shared memory they are read into the
//! transport's staging buffers and the result is written straight back, and those buffers
//! become the returned gradient tensors, so no bucket buffer is packed or unpacked. On CPU
//! backends burn allocates its per-step buffers afresh, and glibc's default `malloc` settings
//! hand large freed buffers back to the kernel, so they page-fault in again every step. DDP,
//! ZeRO and FSDP construction therefore raise glibc's mmap and trim thresholds once per process
//! unless the environment sets them ([`cpu_fast_path::keep_freed_buffers`]; the launcher gives
//! workers the same values, [`launcher::ALLOCATOR_ENV`]). That is what reaches LibTorch, whose
//! tensors come from `malloc`; on Flex and NdArray use mimalloc as the global allocator too, as
//! the examples do (README, "CPU step time"): [`use_fast_allocator!`] declares it, and each
//! rank says at construction when it is missing ([`cpu_fast_path`]).
#![warn(missing_docs, missing_debug_implementations)]

mod ddp;
mod engine;
mod error;
mod renamed;

pub mod amp;
pub mod checkpoint;
pub mod cpu_fast_path;
pub mod fsdp;
pub mod kernel_cache;
pub mod metrics;
pub mod nn;
pub mod zero;

pub use ddp::timeline::StepStats;
pub use ddp::{DdpConfig, DistributedDataParallel};
pub use engine::boundary::layer_boundary;
pub use engine::hooks;
pub use engine::tap::TapBackend;
pub use engine::{Collectives, HostStaging};
pub use error::DdpError;

/// Process groups, collectives, the rendezvous store and NCCL: the `ddp-comm` crate.
pub use ddp_comm as comm;
/// The distributed sampler and data loader: the `ddp-data` crate.
pub use ddp_data as data;
/// The launcher (`ddp-run`, [`launch()`], the worker environment): the `ddp-launch` crate.
pub use ddp_launch as launcher;
pub use ddp_launch::init_from_env;
#[cfg(feature = "launch")]
pub use ddp_launch::launch;
/// Training progress: rank 0's per-epoch bar with the loss averaged across ranks
/// ([`progress::EpochProgress`]), shown by rank 0 or by the launcher (ddp-launch's module).
pub use ddp_launch::progress;

// The launcher module's first path, renamed `launcher` so that the documented `launch` is one
// thing, the function; `ddp_core::launch::LaunchArgs` still compiles for one release. Hidden
// rather than deprecated: `use ddp_core::launch;`, which imports the function, would import
// this module too and warn about it.
#[doc(hidden)]
pub use ddp_launch as launch;

// The old crate-root paths, deprecated (see `renamed.rs`); hidden from the docs, which show
// each type at its one path.
#[doc(hidden)]
#[allow(deprecated)]
pub use renamed::*;
