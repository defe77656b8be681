//! The errors of [`GradScaler`](super::GradScaler).

use ddp_comm::CommError;

/// Failures of loss scaling.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmpError {
    /// A [`GradScalerConfig`](super::GradScalerConfig) setting is out of range
    /// ([`GradScalerConfig::init`](super::GradScalerConfig::init)).
    #[error("invalid GradScalerConfig: {0}")]
    InvalidConfig(String),
    /// A state given to [`GradScaler::load_state`](super::GradScaler::load_state) cannot be
    /// a scaler's (a scale that is not a finite number above 0, or a growth tracker that is
    /// not below the growth interval).
    #[error("invalid GradScalerState: {0}; pass the state a GradScaler with this config saved")]
    InvalidState(String),
    /// A gradient is not f32 or f64: unscaling a half-precision gradient loses the small values
    /// loss scaling exists to keep (PyTorch refuses it too). Keep the parameters in f32 (the
    /// master weights) and cast them for the forward only ([`autocast`](super::autocast)).
    #[error(
        "the gradient of parameter {parameter} is {dtype}; loss scaling needs f32 (or f64) \
         master parameters: keep them f32 and cast for the forward with amp::autocast"
    )]
    HalfPrecisionGradient {
        /// The parameter's id.
        parameter: String,
        /// Its gradient's dtype.
        dtype: String,
    },
    /// All-reducing the found-inf flag failed (a peer died, stalled, or called another
    /// collective). The process group is then aborted, so the peers fail too.
    #[error("all-reducing the found-inf flag over the process group: {0}")]
    FoundInfAllReduce(#[source] CommError),
}
