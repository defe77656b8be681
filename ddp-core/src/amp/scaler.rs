//! [`GradScaler`]: dynamic loss scaling whose skip decision and scale are the same on every
//! rank.

use super::config::GradScalerConfig;
use super::error::AmpError;
use super::state::GradScalerState;
use super::unscale::unscale_and_check;
use crate::{DistributedDataParallel, TapBackend};
use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ddp_comm::{ProcessGroup, ReduceOp};

/// PyTorch's `torch.amp.GradScaler` for DDP: multiplies the loss by a scale before backward so
/// small half-precision gradients do not flush to zero, divides it out of the gradients, skips
/// the optimizer step when any rank found an inf/NaN, and adapts the scale.
///
/// Build it with [`GradScalerConfig::init`]. Per step:
/// 1. `ddp.backward(scaler.scale(loss))?` ([`scale`](Self::scale));
/// 2. `scaler.step(&mut ddp, &mut optim, lr, grads)?` ([`step`](Self::step)): unscale, check,
///    all-reduce the found-inf flag (max), step or skip on every rank alike, update the scale
///    (PyTorch's `scaler.step(optim)` and `scaler.update()` in one call).
///
/// To clip or inspect the true gradients first, split step 2: [`unscale`](Self::unscale), work
/// on [`UnscaledGradients::grads_mut`], then [`step_unscaled`](Self::step_unscaled). Without
/// the DDP wrapper (a custom loop), call [`unscale`](Self::unscale), step your optimizer unless
/// [`found_inf`](UnscaledGradients::found_inf), then [`update`](Self::update).
///
/// # Why the flag is all-reduced
/// DDP averages gradients, so an inf on one rank usually reaches every rank. It does not with
/// [`LocalGradientsHook`](crate::zero::LocalGradientsHook) (ZeRO stage 2: each rank holds its
/// own gradients), with a hook that drops values (PowerSGD), or when an inf appears after the
/// reduction. One small collective per step (world size + 1 floats) makes every rank take the
/// same decision, so replicas stay bitwise equal, the scale stays identical everywhere, and
/// collectives inside the optimizer (ZeRO's broadcasts) are issued by all ranks or none. It
/// also carries each rank's failure to unscale, so a rank that cannot unscale its gradients
/// fails every rank at that point instead of leaving them waiting until the timeout.
#[derive(Debug)]
pub struct GradScaler {
    config: GradScalerConfig,
    state: GradScalerState,
    pg: ProcessGroup,
}

/// A step's gradients divided by the scale, and whether some rank found an inf/NaN in its
/// own: [`GradScaler::unscale`]'s result, for [`GradScaler::step_unscaled`].
#[derive(Debug)]
pub struct UnscaledGradients {
    grads: GradientsParams,
    found_inf: bool,
}

impl UnscaledGradients {
    /// Whether any rank's gradients held an inf/NaN (the same on every rank): the step is
    /// skipped.
    pub fn found_inf(&self) -> bool {
        self.found_inf
    }

    /// The unscaled gradients, e.g. to clip them.
    pub fn grads_mut(&mut self) -> &mut GradientsParams {
        &mut self.grads
    }

    /// The unscaled gradients.
    pub fn into_grads(self) -> GradientsParams {
        self.grads
    }
}

/// What [`GradScaler::step`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaledStep {
    /// The optimizer stepped (no rank found an inf/NaN).
    pub stepped: bool,
    /// The scale this step's loss was multiplied by.
    pub scale: f32,
    /// The scale for the next step.
    pub next_scale: f32,
}

/// The constructor lives with what it builds: the config is plain settings and does not
/// depend on the scaler (burn's `Config::init` pattern).
impl GradScalerConfig {
    /// A scaler over `pg` (the process group DDP uses: `ddp.process_group().clone()`), every
    /// rank with the same config.
    ///
    /// # Errors
    /// [`AmpError::InvalidConfig`] when a setting is out of range (PyTorch asserts the same).
    pub fn init(&self, pg: ProcessGroup) -> Result<GradScaler, AmpError> {
        self.validate()?;
        Ok(GradScaler {
            state: GradScalerState::new(self.init_scale),
            config: self.clone(),
            pg,
        })
    }
}

impl GradScaler {
    /// The configuration.
    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// Whether loss scaling is on ([`GradScalerConfig::enabled`]).
    pub fn is_enabled(&self) -> bool {
        self.config.enabled
    }

    /// The current scale (PyTorch's `get_scale()`); 1 when disabled.
    pub fn scale_factor(&self) -> f32 {
        if self.config.enabled {
            self.state.scale
        } else {
            1.0
        }
    }

    /// `loss * scale`, to pass to `ddp.backward` (the loss unchanged when disabled). With a
    /// power-of-two scale the product is exact, so only values that leave the dtype's range
    /// change.
    pub fn scale<B: Backend, const D: usize>(&self, loss: Tensor<B, D>) -> Tensor<B, D> {
        if self.config.enabled {
            loss.mul_scalar(self.state.scale)
        } else {
            loss
        }
    }

    /// Divides the scale out of `grads` (in f32: one multiplication by `1 / scale`) and
    /// agrees with every rank whether any of them holds an inf/NaN (one all-reduce, max, of a
    /// flag per rank). `module` is the one the gradients belong to: `ddp.module()` after
    /// `ddp.backward`, the module given to `step_on` after
    /// [`step_on`](crate::DistributedDataParallel::step_on).
    ///
    /// # Collective
    /// Every rank calls it at the same point (when enabled).
    ///
    /// # Errors
    /// [`AmpError::HalfPrecisionGradient`] or [`AmpError::ForeignGradients`] on a rank whose
    /// gradients cannot be unscaled, and [`AmpError::PeerUnscale`] on the others at the same
    /// point (the all-reduce carries the failure, so no rank waits for one that gave up);
    /// the gradients are dropped. [`AmpError::FoundInfAllReduce`], after which the process
    /// group is aborted.
    pub fn unscale<B, M>(
        &self,
        module: &M,
        mut grads: GradientsParams,
    ) -> Result<UnscaledGradients, AmpError>
    where
        B: burn::tensor::backend::AutodiffBackend,
        M: AutodiffModule<B>,
    {
        if !self.config.enabled {
            return Ok(UnscaledGradients {
                grads,
                found_inf: false,
            });
        }
        // f64 then f32, as PyTorch computes `inv_scale`; exact for a power of two.
        let inv_scale = (1.0 / self.state.scale as f64) as f32;
        let local = unscale_and_check::<B, M>(module, &mut grads, inv_scale);
        let local_inf = matches!(local, Ok(true));
        let found_inf = self.agree(local)?;
        if local_inf || found_inf {
            tracing::debug!(
                rank = self.pg.rank(),
                local = local_inf,
                scale = self.state.scale,
                "inf/NaN in the gradients: skipping this step"
            );
        }
        Ok(UnscaledGradients { grads, found_inf })
    }

    /// The max of every rank's flag (so any rank's inf counts everywhere), and every rank's
    /// unscaling failure: a rank that cannot unscale still joins the all-reduce, and all
    /// ranks return an error from it.
    fn agree(&self, local: Result<bool, AmpError>) -> Result<bool, AmpError> {
        let world = self.pg.world_size();
        if world == 1 {
            return local;
        }
        let rank = self.pg.rank();
        // [found inf, then one failure code per rank (0: none)].
        let mut flags = vec![0.0f32; 1 + world];
        match &local {
            Ok(inf) => flags[0] = f32::from(u8::from(*inf)),
            Err(e) => flags[1 + rank] = failure_code(e),
        }
        if let Err(e) = self.pg.all_reduce(&mut flags, ReduceOp::Max) {
            let reason = format!("GradScaler: all-reducing the found-inf flag: {e}");
            tracing::error!(rank, error = %reason, "aborting the process group");
            self.pg.abort(&reason);
            return Err(AmpError::FoundInfAllReduce(e));
        }
        // A rank that failed returns its own error, which names the parameter.
        local?;
        let failed: Vec<usize> = (0..world).filter(|&r| flags[1 + r] > 0.0).collect();
        if !failed.is_empty() {
            let mut reasons: Vec<&str> = failed
                .iter()
                .map(|&r| failure_reason(flags[1 + r]))
                .collect();
            reasons.sort_unstable();
            reasons.dedup();
            tracing::error!(
                rank,
                ?failed,
                "GradScaler: a peer could not unscale its gradients"
            );
            return Err(AmpError::PeerUnscale {
                ranks: failed,
                reason: reasons.join("; "),
            });
        }
        Ok(flags[0] > 0.0)
    }

    /// Updates the scale after a step, PyTorch's `scaler.update()`: backoff when `found_inf`,
    /// growth after `growth_interval` finite steps in a row. [`step`](Self::step) and
    /// [`step_unscaled`](Self::step_unscaled) call it; call it yourself only in a loop that
    /// steps its optimizer without them. Pass the agreed flag
    /// ([`UnscaledGradients::found_inf`]) so the scale stays identical on every rank.
    pub fn update(&mut self, found_inf: bool) {
        if !self.config.enabled {
            return;
        }
        let c = &self.config;
        let before = self.state.scale;
        self.state.update(
            found_inf,
            c.growth_factor,
            c.backoff_factor,
            c.growth_interval,
        );
        if self.state.scale != before {
            tracing::debug!(from = before, to = self.state.scale, "loss scale changed");
        }
    }

    /// Unscales `grads` (from `ddp.backward(scaler.scale(loss))`), steps `optimizer` through
    /// `ddp` unless some rank found an inf/NaN, and updates the scale. Works with any burn
    /// optimizer and with [`ZeroRedundancyOptimizer`](crate::zero::ZeroRedundancyOptimizer) (stage 1
    /// or 2: every rank skips alike, so its collectives stay matched).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`unscale`](Self::unscale); nothing is stepped and the scale is unchanged.
    pub fn step<B, M, O>(
        &mut self,
        ddp: &mut DistributedDataParallel<B, M>,
        optimizer: &mut O,
        lr: f64,
        grads: GradientsParams,
    ) -> Result<ScaledStep, AmpError>
    where
        B: TapBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let unscaled = self.unscale(ddp.module(), grads)?;
        Ok(self.step_unscaled(ddp, optimizer, lr, unscaled))
    }

    /// The second half of [`step`](Self::step), after [`unscale`](Self::unscale): steps
    /// `optimizer` through `ddp` unless [`found_inf`](UnscaledGradients::found_inf), then
    /// updates the scale. Local (no communication).
    pub fn step_unscaled<B, M, O>(
        &mut self,
        ddp: &mut DistributedDataParallel<B, M>,
        optimizer: &mut O,
        lr: f64,
        unscaled: UnscaledGradients,
    ) -> ScaledStep
    where
        B: TapBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let scale = self.scale_factor();
        let found_inf = unscaled.found_inf;
        if !found_inf {
            ddp.optimizer_step(optimizer, lr, unscaled.grads);
        }
        self.update(found_inf);
        ScaledStep {
            stepped: !found_inf,
            scale,
            next_scale: self.scale_factor(),
        }
    }

    /// The scale and growth tracker, for a checkpoint (see [`GradScalerState`]).
    pub fn state(&self) -> GradScalerState {
        self.state
    }

    /// Restores a [`state`](Self::state) saved by a scaler with this config (PyTorch's
    /// `load_state_dict`). Every rank loads the same state.
    ///
    /// # Errors
    /// [`AmpError::InvalidState`] when the scale is not a finite number above 0 or the growth
    /// tracker is not below `growth_interval`; the current state is kept.
    pub fn load_state(&mut self, state: GradScalerState) -> Result<(), AmpError> {
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(AmpError::InvalidState(format!(
                "scale is {}, not a finite number above 0",
                state.scale
            )));
        }
        if state.growth_tracker >= self.config.growth_interval {
            return Err(AmpError::InvalidState(format!(
                "growth_tracker is {} but growth_interval is {}: the state belongs to a \
                 scaler with a longer growth_interval",
                state.growth_tracker, self.config.growth_interval
            )));
        }
        self.state = state;
        Ok(())
    }
}

/// How a rank's unscaling failure travels in the found-inf all-reduce (0 is none).
fn failure_code(e: &AmpError) -> f32 {
    match e {
        AmpError::HalfPrecisionGradient { .. } => 1.0,
        AmpError::ForeignGradients { .. } => 2.0,
        _ => 3.0,
    }
}

/// What [`failure_code`]'s code says to a peer.
fn failure_reason(code: f32) -> &'static str {
    if code == 1.0 {
        "a gradient is not f32 or f64: keep the parameters f32 and cast them for the forward \
         with amp::autocast"
    } else if code == 2.0 {
        "gradients of another module were passed: pass the module they were computed for"
    } else {
        "an error unscaling them"
    }
}
