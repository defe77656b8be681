//! [`GradScalerConfig`]: the settings of [`GradScaler`](super::GradScaler), PyTorch's defaults.
//! Its constructor, [`GradScalerConfig::init`], is in `scaler.rs`: plain settings do not
//! depend on the scaler they configure.

use super::error::AmpError;
use burn::config::Config;

/// Settings of dynamic loss scaling, as PyTorch's `torch.amp.GradScaler(init_scale,
/// growth_factor, backoff_factor, growth_interval, enabled)`:
/// `GradScalerConfig::new().with_init_scale(1024.0).with_growth_interval(100)`.
#[derive(Config, Debug, PartialEq)]
pub struct GradScalerConfig {
    /// The scale the loss is multiplied by at the first step. Keep it a power of two: scaling
    /// and unscaling are then exact in f32.
    #[config(default = 65536.0)]
    pub init_scale: f32,
    /// The scale is multiplied by this after `growth_interval` consecutive steps without an
    /// inf/NaN gradient (must be above 1).
    #[config(default = 2.0)]
    pub growth_factor: f32,
    /// The scale is multiplied by this on a step whose gradients hold an inf/NaN (must be
    /// between 0 and 1, excluded).
    #[config(default = 0.5)]
    pub backoff_factor: f32,
    /// Consecutive finite steps before the scale grows (at least 1).
    #[config(default = 2000)]
    pub growth_interval: u64,
    /// Off: `scale` returns the loss unchanged and `step` always steps (no inf check, no
    /// collective), so one code path trains with or without loss scaling.
    #[config(default = true)]
    pub enabled: bool,
}

impl GradScalerConfig {
    /// Checks every setting is in range (PyTorch asserts the same); [`GradScalerConfig::init`]
    /// calls it before building a scaler.
    pub(super) fn validate(&self) -> Result<(), AmpError> {
        let invalid = |what: String| Err(AmpError::InvalidConfig(what));
        if !(self.init_scale.is_finite() && self.init_scale > 0.0) {
            return invalid(format!(
                "init_scale is {}; it must be a finite number above 0 (PyTorch's default: 65536)",
                self.init_scale
            ));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return invalid(format!(
                "growth_factor is {}; it must be above 1 (PyTorch's default: 2)",
                self.growth_factor
            ));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return invalid(format!(
                "backoff_factor is {}; it must be between 0 and 1, excluded (PyTorch's default: 0.5)",
                self.backoff_factor
            ));
        }
        if self.growth_interval == 0 {
            return invalid(
                "growth_interval is 0; it must be at least 1 (PyTorch's default: 2000)".into(),
            );
        }
        Ok(())
    }
}
