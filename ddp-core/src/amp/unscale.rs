//! Unscaling a step's gradients and finding inf/NaN among them (PyTorch's
//! `_amp_foreach_non_finite_check_and_unscale_`), one parameter at a time through the module.

use super::error::AmpError;
use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Tensor};
use std::collections::HashSet;

/// Multiplies every gradient of `module`'s parameters in `grads` by `inv_scale` (in the
/// gradient's own f32/f64) and says whether any unscaled value is inf or NaN, on this rank.
///
/// The check looks at the unscaled values, so it also catches a gradient that only overflows
/// when a scale below 1 is divided out (PyTorch checks the scaled values and would let that
/// inf through to the optimizer).
///
/// # Errors
/// [`AmpError::HalfPrecisionGradient`]; [`AmpError::ForeignGradients`] when some gradient
/// belongs to no parameter of `module` (it would reach the optimizer still scaled).
pub(crate) fn unscale_and_check<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    inv_scale: f32,
) -> Result<bool, AmpError> {
    let total = grads.len();
    let mut visit = Unscale::<B::InnerBackend> {
        grads,
        inv_scale,
        non_finite: Vec::new(),
        done: HashSet::new(),
        error: None,
    };
    module.visit(&mut visit);
    if let Some(e) = visit.error {
        return Err(e);
    }
    // `done` holds unique ids of gradients found in `grads`, so it cannot exceed `total`.
    if visit.done.len() < total {
        return Err(AmpError::ForeignGradients {
            unscaled: visit.done.len(),
            total,
        });
    }
    Ok(any_true(visit.non_finite))
}

/// One `[1]` flag per gradient, read back together: one device synchronisation per step.
fn any_true<I: Backend>(flags: Vec<Tensor<I, 1, Bool>>) -> bool {
    if flags.is_empty() {
        return false;
    }
    Tensor::cat(flags, 0)
        .any()
        .into_data()
        .iter::<bool>()
        .next()
        .unwrap_or(false)
}

struct Unscale<'a, I: Backend> {
    grads: &'a mut GradientsParams,
    inv_scale: f32,
    non_finite: Vec<Tensor<I, 1, Bool>>,
    /// The parameters already unscaled: a tied parameter (one `Param` in two fields) is
    /// visited once per field but has one gradient, which must be divided once.
    done: HashSet<ParamId>,
    error: Option<AmpError>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unscale<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.error.is_some() || self.done.contains(&param.id) {
            return;
        }
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return; // unused this step, or not trainable
        };
        self.done.insert(param.id);
        let dtype = grad.dtype();
        if !matches!(dtype, DType::F32 | DType::F64) {
            self.error = Some(AmpError::HalfPrecisionGradient {
                parameter: param.id.to_string(),
                dtype: format!("{dtype:?}"),
            });
            self.grads.register::<B::InnerBackend, D>(param.id, grad);
            return;
        }
        let grad = if self.inv_scale == 1.0 {
            grad
        } else {
            grad.mul_scalar(self.inv_scale)
        };
        self.non_finite
            .push(grad.clone().is_finite().bool_not().any());
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}
