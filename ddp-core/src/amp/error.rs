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
    /// master weights) and cast them for the forward only ([`autocast`](fn@super::autocast)).
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
    /// Some gradients belong to no parameter of the module given to
    /// [`GradScaler::unscale`](super::GradScaler::unscale): they would reach the optimizer
    /// still multiplied by the scale. Gradients are keyed by the `ParamId`s of the module they
    /// were computed for; after [`step_on`](crate::DistributedDataParallel::step_on) that is
    /// the module given to `step_on`, not `ddp.module()`.
    #[error(
        "GradScaler::unscale: {unscaled} of the {total} gradients belong to parameters of the \
         module it was given; the others belong to another module and would reach the \
         optimizer still scaled. Pass the module the gradients were computed for (after \
         DistributedDataParallel::step_on, the module you gave step_on, not ddp.module())"
    )]
    ForeignGradients {
        /// Gradients found among the module's parameters (and unscaled).
        unscaled: usize,
        /// Gradients given.
        total: usize,
    },
    /// Another rank could not unscale its gradients ([`AmpError::HalfPrecisionGradient`] or
    /// [`AmpError::ForeignGradients`] there). Every rank returns an error from the same
    /// found-inf all-reduce, so none waits for a peer that has given up; the failing rank's
    /// own error says what to change.
    #[error(
        "GradScaler: {} gradients ({reason}); see the error there. Every rank stops here so \
         that none waits for the others",
        could_not_unscale(.ranks)
    )]
    PeerUnscale {
        /// The ranks that failed.
        ranks: Vec<usize>,
        /// What went wrong there.
        reason: String,
    },
    /// All-reducing the found-inf flag failed (a peer died, stalled, or called another
    /// collective). The process group is then aborted, so the peers fail too.
    #[error("all-reducing the found-inf flag over the process group: {0}")]
    FoundInfAllReduce(#[source] CommError),
}

/// "rank 1 could not unscale its" or "ranks 0, 2 could not unscale their".
fn could_not_unscale(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match ranks {
        [one] => format!("rank {one} could not unscale its"),
        _ => format!("ranks {} could not unscale their", list.join(", ")),
    }
}
