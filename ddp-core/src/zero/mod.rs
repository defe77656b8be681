//! ZeRO stage 1: [`ZeroRedundancyOptimizer`] shards any burn optimizer's state across the
//! ranks, as PyTorch's `torch.distributed.optim.ZeroRedundancyOptimizer` does.
//!
//! With Adam every replica holds two extra copies of the model (the moments); sharded, each
//! rank holds those of its own shard, about `1/world` of them. DDP still averages every
//! gradient; each rank then steps only the parameters it owns and broadcasts them.
//!
//! - `partition.rs`: who owns which parameter (by size, largest first).
//! - `layout.rs`: the module's tensors and the gradients of one shard.
//! - `optimizer.rs`: the wrapper (step, broadcast, checkpoints).
//! - `consolidate.rs`: gathering the shards' state on rank 0 for a checkpoint.
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::AdamConfig;
//! use burn::tensor::Tensor;
//! use ddp_core::{DdpConfig, DistributedDataParallel, ZeroRedundancyOptimizer, init_from_env};
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
//! Checkpoints: save with [`ZeroRedundancyOptimizer::save_checkpoint`] (rank 0 gathers the
//! shards into one record, the one plain Adam would have); resume with
//! [`Checkpointer::load_latest`](crate::Checkpointer::load_latest) into the wrapper, at any
//! world size.

mod consolidate;
mod error;
mod layout;
mod optimizer;
mod partition;

pub use error::ZeroError;
pub use optimizer::ZeroRedundancyOptimizer;
