//! ZeRO stage 1: [`ZeroRedundancyOptimizer`] shards any burn optimizer's state across the
//! ranks, as PyTorch's `torch.distributed.optim.ZeroRedundancyOptimizer` does.
//!
//! With Adam every replica holds two extra copies of the model (the moments); sharded, each
//! rank holds those of its own shard, about `1/world` of them. DDP still averages every
//! gradient; each rank then steps only the parameters it owns and broadcasts them.
//!
//! Tied parameters (one parameter in two places of the module, such as an embedding shared
//! with the output layer) are refused at the first step with [`ZeroError::TiedParameter`],
//! naming the second place: each tensor gets one owner, and a tied one would get two. Train
//! tied weights with plain DDP and an unsharded optimizer.
//!
//! - `partition.rs`: who owns which parameter (by size, largest first).
//! - `module_tensors.rs`: the module's tensors and the gradients of one shard.
//! - `optimizer.rs`: the wrapper (step, broadcast, checkpoints).
//! - `config.rs`: [`ZeroConfig`], the same settings as a burn config (saved and loaded as JSON).
//! - `consolidate.rs`: gathering the shards' state on rank 0 for a checkpoint.
//! - `stage2.rs`: stage 2's reduce-scatter of gradients and all-gather of parameters.
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::AdamConfig;
//! use burn::tensor::Tensor;
//! use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env, zero::ZeroRedundancyOptimizer};
//!
//! type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Default::default();
//! let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! let mut ddp = DistributedDataParallel::new(model, init_from_env()?, DdpConfig::new())?;
//! let adam = AdamConfig::new().init::<B, Linear<B>>();
//! let mut optim = ZeroRedundancyOptimizer::new(adam, ddp.process_group().clone());
//! let x = Tensor::<B, 2>::ones([8, 4], &device);
//! let pred = ddp.forward(|m| m.forward(x))?;
//! let loss = MseLoss::new().forward(pred, Tensor::zeros([8, 1], &device), Reduction::Mean);
//! let grads = ddp.backward(loss)?;
//! ddp.optimizer_step(&mut optim, 1e-3, grads); // steps this rank's shard, shares the others
//! # Ok(()) }
//! ```
//!
//! # Stage 2
//!
//! [`ZeroRedundancyOptimizer::stage2`] shards the gradients too (DeepSpeed's stage 2). DDP,
//! given [`LocalGradientsHook`], returns each rank's own gradients; the optimizer's step then
//! 1. reduce-scatters them (`Avg`, over flat buffers of `world` equal blocks, block `r`
//!    holding rank `r`'s tensors), so each rank keeps the averaged gradients of the parameters
//!    it owns only ([`ZeroRedundancyOptimizer::gradient_bytes`]);
//! 2. steps its shard with the wrapped optimizer;
//! 3. all-gathers the updated parameters (instead of stage 1's broadcast per rank), byte for
//!    byte, so replicas stay bitwise identical.
//!
//! Both go in groups of consecutive tensors of at most
//! [`ZeroRedundancyOptimizer::with_bucket_bytes`] per rank (32 MiB by default), one collective
//! per group, so no buffer holds the whole model: each gradient leaves burn's map as its
//! group is packed, and each group's parameters are written as they arrive.
//!
//! ```no_run
//! # use burn::backend::{Autodiff, Flex};
//! # use burn::nn::{Linear, LinearConfig};
//! # use burn::optim::AdamConfig;
//! # use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env, zero::ZeroRedundancyOptimizer};
//! # type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let model: Linear<B> = LinearConfig::new(4, 1).init(&Default::default());
//! let mut ddp = DistributedDataParallel::new(model, init_from_env()?, DdpConfig::new())?;
//! let adam = AdamConfig::new().init::<B, Linear<B>>();
//! let mut optim = ZeroRedundancyOptimizer::stage2(adam, &mut ddp)?; // before the first forward
//! // forward, `let grads = ddp.backward(loss)?;` (local), `ddp.optimizer_step(&mut optim, lr, grads);`
//! # Ok(()) }
//! ```
//!
//! Equivalence: the result equals plain DDP + the same optimizer. At world 1 and 2 it is
//! bitwise: an average of two numbers rounds the same in either order, and both DDP's
//! all-reduce and this reduce-scatter sum then divide by the world size once. From world 3 on
//! the order of the additions matters: the shared-memory transport adds in rank order in both
//! collectives, but the TCP ring's order depends on where an element sits, so the sums may
//! round differently in the last bit (tested within 1e-6 after several Adam steps).
//!
//! Not overlapped: the reduce-scatter runs in the optimizer step, after backward. DDP builds
//! its buckets in gradient-ready order and materialises every parameter's gradient, so until
//! the step every rank holds its full local gradient once (as with DDP), and only the averaged
//! gradients are sharded. Overlapping would need DDP's reducer to lay buckets out by owner
//! (or shard each bucket among the ranks), reduce-scatter each bucket as it fills, and hand
//! back only the owner's gradients, dropping the rest as soon as they are sent.
//!
//! Limits: f32 parameters only (others are refused with [`ZeroError::Unsupported`]); not with
//! uneven inputs (`join`, untested).
//!
//! On a device communicator ([`ZeroRedundancyOptimizer::with_collectives`]; [`stage2`] takes
//! DDP's: NCCL on GPUs, or its CPU stand-in) the groups are assembled and taken apart as tensors
//! on the model's device and reduce-scattered and all-gathered there, through the device seam
//! DDP's buckets use; nothing is read to the host.
//!
//! [`stage2`]: ZeroRedundancyOptimizer::stage2
//!
//! Checkpoints: save with [`ZeroRedundancyOptimizer::save_checkpoint`] (rank 0 gathers the
//! shards into one record, the one plain Adam would have); resume with
//! [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest) into the wrapper, at any
//! world size.

mod config;
mod consolidate;
mod device;
mod error;
mod optimizer;
mod sharded_checkpoint;
mod stage2;
mod stage2_device;

pub use config::ZeroConfig;
pub use error::ZeroError;
pub use optimizer::ZeroRedundancyOptimizer;
pub use stage2::{DEFAULT_ZERO_BUCKET_BYTES, LocalGradientsHook, ZeroStage};
