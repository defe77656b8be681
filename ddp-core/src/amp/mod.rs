//! Mixed precision: dynamic loss scaling ([`GradScaler`], PyTorch's `torch.amp.GradScaler`)
//! that keeps every rank's decisions identical.
//!
//! Half-precision gradients flush small values to zero. Loss scaling multiplies the loss by a
//! large scale (65536 to start) before backward, so gradients are scaled by the same factor,
//! then divides it out of the f32 gradients before the optimizer sees them. If the scale was
//! too large, some gradient overflows to inf/NaN: the step is skipped and the scale halved.
//! After `growth_interval` (2000) clean steps in a row it doubles.
//!
//! In DDP the skip must be collective: [`GradScaler`] all-reduces its found-inf flag (max)
//! every step, so when one rank sees an inf every rank skips that step and halves its scale,
//! and replicas stay bitwise equal.
//!
//! | PyTorch | here |
//! |---|---|
//! | `GradScaler(init_scale, growth_factor, backoff_factor, growth_interval, enabled)` | [`GradScalerConfig`]`::new().with_…`, [`GradScalerConfig::init`]`(pg)` |
//! | `scaler.scale(loss).backward()` | `ddp.backward(scaler.scale(loss))` |
//! | `scaler.unscale_(optim)` | [`GradScaler::unscale`] |
//! | `scaler.step(optim); scaler.update()` | [`GradScaler::step`] (or [`GradScaler::step_unscaled`]) |
//! | `scaler.get_scale()` | [`GradScaler::scale_factor`] |
//! | `state_dict()` / `load_state_dict()` | [`GradScaler::state`] / [`GradScaler::load_state`] ([`GradScalerState`]) |
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::AdamConfig;
//! use burn::tensor::Tensor;
//! use ddp_core::amp::GradScalerConfig;
//! use ddp_core::{DdpConfig, DistributedDataParallel, init_from_env};
//!
//! type B = Autodiff<Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Default::default();
//! let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! let mut ddp = DistributedDataParallel::new(model, init_from_env()?, DdpConfig::new())?;
//! let mut optim = AdamConfig::new().init();
//! let mut scaler = GradScalerConfig::new().init(ddp.process_group().clone())?;
//! for _step in 0..10 {
//!     let x = Tensor::<B, 2>::ones([8, 4], &device);
//!     let pred = ddp.forward(|m| m.forward(x))?;
//!     let loss = MseLoss::new().forward(pred, Tensor::zeros([8, 1], &device), Reduction::Mean);
//!     let grads = ddp.backward(scaler.scale(loss))?;
//!     let step = scaler.step(&mut ddp, &mut optim, 1e-3, grads)?; // skipped on every rank, or none
//!     if !step.stepped {
//!         println!("inf/NaN: step skipped, scale now {}", step.next_scale);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Limits
//! - The gradients must be f32 (or f64): keep the parameters in f32, the master weights
//!   ([`AmpError::HalfPrecisionGradient`] otherwise, as PyTorch refuses to unscale f16
//!   gradients).
//! - The found-inf check reads the unscaled values, so an overflow caused by dividing out a
//!   scale below 1 is caught too; PyTorch checks the scaled values.
//! - One all-reduce of one f32 per step (when enabled and the world size is above 1).

mod config;
mod error;
mod scaler;
mod state;
mod unscale;

pub use config::GradScalerConfig;
pub use error::AmpError;
pub use scaler::{GradScaler, ScaledStep, UnscaledGradients};
pub use state::GradScalerState;
