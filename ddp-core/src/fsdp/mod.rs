//! Fully sharded parameters: [`FullyShardedDataParallel`], the idea of PyTorch FSDP2's
//! `fully_shard` (ZeRO stage 3) for burn modules.
//!
//! Between steps each rank holds `1/world` of every unit's trainable parameters (a flat f32
//! chunk), the gradient of that chunk after `backward`, and the optimizer state of that chunk:
//! model state per rank is about `1/world` of DDP's. Frozen parameters stay whole on every rank.
//!
//! - `config.rs`: [`FsdpConfig`], the units (module path prefixes).
//! - `layout.rs`: which unit each parameter belongs to and where it sits in the unit's buffer.
//! - `wrapper/`: the wrapper (gather, reduce-scatter, step, the whole model on demand), with
//!   `backward.rs` (each unit's reduce-scatter started as soon as its gradients are complete,
//!   through `unit_reducer.rs` here; the taps and the depth plan are the engine's, shared with
//!   DDP) and `checkpoint.rs` (sharded checkpoints that reshard on load).
//! - `state.rs`: the optimizer state cut from chunks into parameters and joined back.
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::AdamConfig;
//! use burn::tensor::Tensor;
//! use ddp_core::init_from_env;
//! use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
//!
//! type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Default::default();
//! let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! // One unit per marked prefix; here the whole (tiny) model is the root unit.
//! let mut fsdp = FullyShardedDataParallel::new(model, init_from_env()?, FsdpConfig::new())?;
//! let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
//! let x = Tensor::<B, 2>::ones([8, 4], &device);
//! let pred = fsdp.forward(|m| m.forward(x))?; // all-gathers the units
//! let loss = MseLoss::new().forward(pred, Tensor::zeros([8, 1], &device), Reduction::Mean);
//! let grads = fsdp.backward(loss)?; // releases them, reduce-scatters the gradients
//! fsdp.optimizer_step(&mut adam, 1e-3, grads)?; // steps this rank's chunks
//! let whole = fsdp.full_module()?; // for evaluation or a checkpoint (collective)
//! # Ok(()) }
//! ```
//!
//! # Equivalence
//! The result equals DDP with the same element-wise optimizer: each chunk's gradient is the
//! average of the ranks' gradients, as DDP's all-reduce computes it (bitwise at world 1 and 2,
//! where an average of two numbers rounds the same in either order; from world 3 the order of
//! the sums may differ in the last bit, as with ZeRO-2). A unit no rank used gets no gradient,
//! so the optimizer leaves it and its state alone (DDP's rule for a parameter no rank used);
//! inside a unit some rank used, a parameter nobody used gets a zero gradient (the unit is
//! stepped as one chunk). Buffers (batch norm's running statistics) follow rank 0 after every
//! backward, as under DDP.
//!
//! # What burn 0.21 allows, and the limits
//! FSDP2 frees a unit's gathered parameters after the unit's forward and gathers them again
//! for its backward. burn 0.21 cannot: its autodiff graph keeps every tensor a backward step
//! needs until that step runs. Matmul is registered `compute_bound().stateful()` and saves both
//! operands (`prep.checkpoint(&rhs)` in burn-autodiff's `float_matmul`), so a linear layer's
//! weight lives until its backward whatever the module does with it; and gradient
//! checkpointing (`BalancedCheckpointing`) only re-runs operations marked memory-bound from
//! their saved inputs, never a compute-bound matmul, and has no hook to re-gather a leaf. So:
//! - from `forward` to `backward` every rank holds the whole gathered model (as burn keeps it
//!   anyway), plus activations;
//! - `backward` drops the module's references before the reduce-scatters, so the gathered
//!   parameters go as soon as the graph is gone;
//! - the reduce-scatters overlap backward: DDP's gradient taps (anchored as its automatic
//!   overlap anchors them, learned on the first step) hand each gathered parameter's gradient
//!   over as soon as backward produces it, and a unit's reduce-scatter starts once all its
//!   parameters have theirs and the units before it in the launch order have started (a fixed
//!   order, the same on every rank: after the first anchored step, the order rank 0's units
//!   completed in). [`FullyShardedDataParallel::last_step_stats`] says how many started
//!   during backward. The gradients themselves are not freed any earlier: burn hands them over
//!   as backward produces them, and the taps copy them into the unit's buffer;
//! - between steps a rank holds its chunks only: that is where the memory goes down (bench
//!   `zero_memory`).
//!
//! Not supported with FSDP: DDP's communication hooks, `no_sync` accumulation, Join, parameter
//! dtypes other than f32 (frozen ones are fine), tied parameters (refused), gradient clipping
//! by norm inside the optimizer (it would clip each chunk, not each tensor), and loss scaling
//! ([`GradScaler`](crate::amp::GradScaler) steps a `DistributedDataParallel`, and the sharded
//! gradients are not exposed to unscale): for mixed precision use bf16
//! ([`autocast`](crate::amp::autocast)`(m, FloatDType::BF16)`), whose f32 exponent range needs
//! no scaler. Between steps a sharded parameter is a zero-element tensor; that is tested on the
//! CPU backend only.
//!
//! # Checkpoints
//! [`FullyShardedDataParallel::save_checkpoint`] writes a
//! [`ShardedCheckpointer`](crate::checkpoint::sharded::ShardedCheckpointer) checkpoint: each
//! rank writes its part, rank 0 commits once all are written, so a crash at any point leaves
//! the previous checkpoint the latest (tested with a SIGKILL at each phase). The optimizer
//! state is stored per parameter, as DDP's optimizer holds it: FSDP's optimizers act element
//! by element, so each rank's chunk of a state tensor (Adam's moments, SGD's velocity) is a
//! range of the unit's flat buffer, and the chunks of every rank, joined, cut at the
//! parameters' offsets, give each parameter's state (through the record's serde form, so any
//! burn `SimpleOptimizer` works; state that is not per element, such as Adam's step count,
//! must be equal across ranks, and is). [`FullyShardedDataParallel::load_checkpoint`] does the
//! reverse at the current world size. So a checkpoint saved at 4 ranks resumes at 4 (bitwise
//! the uninterrupted run), 2 or 3 (within 1e-5: the average of the same global batch rounds
//! differently), under plain DDP with [`ShardedCheckpointer::load_latest`](crate::checkpoint::sharded::ShardedCheckpointer::load_latest), and
//! [`convert_to_full`](crate::checkpoint::sharded::convert_to_full) makes a rank-0 checkpoint
//! of it. A save or load holds the whole model for its duration, and one unit's whole
//! optimizer state at a time.
//!
//! ```no_run
//! # use burn::backend::{Autodiff, Flex};
//! # use burn::nn::{Linear, LinearConfig};
//! # use burn::optim::AdamConfig;
//! # use ddp_core::checkpoint::{CheckpointConfig, LoadOutcome, TrainingState};
//! # use ddp_core::checkpoint::sharded::ShardedCheckpointer;
//! # use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
//! # type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pg = ddp_core::init_from_env()?;
//! # let model: Linear<B> = LinearConfig::new(4, 1).init(&Default::default());
//! let mut fsdp = FullyShardedDataParallel::new(model, pg.clone(), FsdpConfig::new())?;
//! let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
//! let ckpt = ShardedCheckpointer::new(CheckpointConfig::new("runs/fsdp"), pg)?;
//! if let LoadOutcome::Resumed(r) = fsdp.load_checkpoint(&ckpt, &mut adam)? {
//!     println!("resuming at step {}", r.state.global_step);
//! }
//! // ... train ...
//! fsdp.save_checkpoint(&ckpt, &adam, &TrainingState::new(1, 100))?;
//! # Ok(()) }
//! ```

mod config;
mod device;
mod error;
mod layout;
mod state;
mod unit_reducer;
mod wrapper;

pub use config::FsdpConfig;
pub use error::FsdpError;
pub use unit_reducer::FsdpStepStats;
pub use wrapper::{FullyShardedDataParallel, ShardedGradients, ShardedParams};
