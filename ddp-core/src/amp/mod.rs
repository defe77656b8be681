//! Mixed precision: half-precision compute with f32 master weights ([`autocast`](fn@autocast)),
//! and dynamic loss scaling ([`GradScaler`], PyTorch's `torch.amp.GradScaler`) that keeps every
//! rank's decisions identical.
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
//! | `with torch.autocast(dtype=torch.bfloat16): out = model(x)` | `autocast(m.clone(), FloatDType::BF16).forward(x.cast(FloatDType::BF16))` |
//! | `scaler.get_scale()` | [`GradScaler::scale_factor`] |
//! | `state_dict()` / `load_state_dict()` | [`GradScaler::state`] / [`GradScaler::load_state`] ([`GradScalerState`]) |
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig, loss::MseLoss, loss::Reduction};
//! use burn::optim::AdamConfig;
//! use burn::tensor::{FloatDType, Tensor};
//! use ddp_core::amp::{GradScalerConfig, autocast};
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
//!     // bf16 forward; the f32 parameters stay the masters and get f32 gradients.
//!     let pred = ddp.forward(|m| {
//!         autocast(m.clone(), FloatDType::BF16)
//!             .forward(x.cast(FloatDType::BF16))
//!             .cast(FloatDType::F32)
//!     })?;
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
//! # Mixed precision on burn 0.21
//! [`autocast`](fn@autocast) returns a copy of the module whose parameters are cast to bf16 or f16
//! through burn's `Tensor::cast`, an autodiff operation: burn-autodiff's `float_cast` backward
//! casts the gradient back to the input's dtype (`burn-autodiff-0.21.0/src/ops/tensor.rs`,
//! `float_cast`), so the forward and its backward run in half precision while the f32
//! parameters, the optimizer state and DDP's buckets stay f32. Tested: the output is bf16,
//! the f32 parameters get f32 gradients within bf16's precision of the f32 ones but not equal
//! to them, and training under DDP with the scaler converges like f32 training with replicas
//! bitwise equal.
//!
//! # Limits
//! - **No speed-up on the CPU backend.** Flex has bf16 and f16 tensors, but computes a bf16
//!   matmul by converting both operands to f32 and the result back
//!   (`burn-flex-0.21.0/src/ops/matmul.rs`, `matmul_bf16`), and casts through f64
//!   (`src/ops/float.rs`, `float_cast`): on Flex, mixed precision reproduces half-precision
//!   numerics and costs extra conversions. The memory and speed gains need a GPU backend.
//! - **One dtype per operation.** Flex does not promote: an f32 operand meeting a bf16 one
//!   panics (`matmul: dtype mismatch`, `burn-flex-0.21.0/src/ops/matmul.rs:84`). Cast the
//!   inputs of the autocast region to its dtype and its output back to f32, and keep layers
//!   with buffers (batch norm, whose statistics [`autocast`](fn@autocast) leaves in f32) outside
//!   it.
//! - **Per module, not per operation.** PyTorch's autocast picks a dtype per operation
//!   (softmax and losses in f32); here you choose which modules run in half precision.
//! - **Gradients travel in f32.** DDP reduces the masters' f32 gradients; to halve the bytes
//!   on the wire register a compression hook as well
//!   ([`Fp16CompressHook`](crate::hooks::Fp16CompressHook) or
//!   [`Bf16CompressHook`](crate::hooks::Bf16CompressHook)).
//! - The scaler needs f32 (or f64) gradients: keep the parameters in f32
//!   ([`AmpError::HalfPrecisionGradient`] otherwise, as PyTorch refuses to unscale f16
//!   gradients). bf16 has f32's exponent range, so its gradients rarely underflow; loss
//!   scaling matters for f16 (tested: a tiny loss's f16 gradients are all zero unscaled and
//!   within 1e-2 of the f32 ones scaled).
//! - The found-inf check reads the unscaled values, so an overflow caused by dividing out a
//!   scale below 1 is caught too; PyTorch checks the scaled values.
//! - One all-reduce of world size + 1 f32s per step (when enabled and the world size is above
//!   1): the found-inf flag, and each rank's failure to unscale (a half-precision gradient,
//!   gradients of another module), so that every rank returns an error together.
//! - A tied parameter (one `Param` in two fields) has one gradient and is unscaled once.

mod autocast;
mod config;
mod error;
mod scaler;
mod state;
mod unscale;

pub use autocast::autocast;
pub use config::GradScalerConfig;
pub use error::AmpError;
pub use scaler::{GradScaler, ScaledStep, UnscaledGradients};
pub use state::GradScalerState;
