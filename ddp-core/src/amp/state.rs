//! [`GradScalerState`]: the scale and growth tracker, and PyTorch's rule that updates them.

use serde::{Deserialize, Serialize};

/// What a [`GradScaler`](super::GradScaler) learned: save it with a checkpoint and give it back
/// with [`GradScaler::load_state`](super::GradScaler::load_state), so a resumed run scales as
/// the interrupted one would have (PyTorch's `scaler.state_dict()`, minus the config, which
/// the code that builds the scaler already has).
///
/// It is the same on every rank (the found-inf flag is all-reduced), so rank 0's is the one to
/// save. The natural place is [`TrainingState`](crate::checkpoint::TrainingState)'s user payload:
/// `TrainingState::new(epoch, step).with_user(&scaler.state())?` when saving, and
/// `resumed.state.user::<GradScalerState>()?` ([`Resumed`](crate::checkpoint::Resumed)) handed to
/// `load_state` on every rank when resuming (wrap it in your own struct when the payload
/// carries more). A run resumed without it restarts at `init_scale`, which costs a few skipped
/// steps while the scale backs off again.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GradScalerState {
    /// The current loss scale (f32, as PyTorch keeps it).
    pub scale: f32,
    /// Consecutive steps without an inf/NaN since the scale last changed (PyTorch's
    /// `_growth_tracker`).
    pub growth_tracker: u64,
}

impl GradScalerState {
    /// The state before the first step: `init_scale`, no finite steps yet.
    pub fn new(init_scale: f32) -> Self {
        GradScalerState {
            scale: init_scale,
            growth_tracker: 0,
        }
    }

    /// One step's update, PyTorch's `_amp_update_scale_`: on inf/NaN multiply the scale by
    /// `backoff_factor` and reset the tracker; otherwise count the step, and after
    /// `growth_interval` finite steps in a row multiply the scale by `growth_factor` (unless
    /// that overflows f32, then it stays) and reset the tracker.
    pub(crate) fn update(
        &mut self,
        found_inf: bool,
        growth_factor: f32,
        backoff_factor: f32,
        growth_interval: u64,
    ) {
        if found_inf {
            self.scale *= backoff_factor;
            self.growth_tracker = 0;
            return;
        }
        let successful = self.growth_tracker + 1;
        if successful == growth_interval {
            let grown = self.scale * growth_factor;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.growth_tracker = 0;
        } else {
            self.growth_tracker = successful;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state of `scale` and `growth_tracker`, to compare with.
    fn at(scale: f32, growth_tracker: u64) -> GradScalerState {
        GradScalerState {
            scale,
            growth_tracker,
        }
    }

    /// PyTorch's defaults.
    fn step(state: &mut GradScalerState, found_inf: bool, interval: u64) {
        state.update(found_inf, 2.0, 0.5, interval);
    }

    #[test]
    fn should_halve_the_scale_and_reset_the_tracker_on_inf() {
        let mut s = GradScalerState::new(65536.0);
        step(&mut s, false, 2000);
        step(&mut s, false, 2000);
        assert_eq!(s.growth_tracker, 2);
        step(&mut s, true, 2000);
        assert_eq!(s, at(32768.0, 0));
        step(&mut s, true, 2000);
        assert_eq!(s.scale, 16384.0);
    }

    #[test]
    fn should_double_the_scale_after_growth_interval_finite_steps() {
        let mut s = GradScalerState::new(8.0);
        for k in 1..3 {
            step(&mut s, false, 3);
            assert_eq!(s, at(8.0, k));
        }
        step(&mut s, false, 3);
        assert_eq!(s, at(16.0, 0));
        // An inf in the middle of the next interval restarts the count.
        step(&mut s, false, 3);
        step(&mut s, true, 3);
        step(&mut s, false, 3);
        step(&mut s, false, 3);
        assert_eq!(s, at(8.0, 2));
        step(&mut s, false, 3);
        assert_eq!(s, at(16.0, 0));
    }

    #[test]
    fn should_grow_every_step_with_interval_1() {
        let mut s = GradScalerState::new(1.0);
        for _ in 0..4 {
            step(&mut s, false, 1);
        }
        assert_eq!(s, at(16.0, 0));
    }

    #[test]
    fn should_keep_the_scale_when_growing_would_overflow_f32() {
        let mut s = GradScalerState::new(f32::MAX / 1.5);
        step(&mut s, false, 1);
        assert_eq!(s, at(f32::MAX / 1.5, 0));
    }

    #[test]
    fn should_match_a_pytorch_trace() {
        // torch.amp.GradScaler(init_scale=4., growth_factor=2., backoff_factor=.5,
        // growth_interval=2) fed found_inf = [0,0,1,0,0,0,1,1,0]: get_scale() after each
        // update, worked by hand through PyTorch's `amp_update_scale_cuda_kernel`
        // (aten/src/ATen/native/cuda/AmpKernels.cu; the CPU kernel is the same rule). No
        // PyTorch on this machine to run it.
        let found = [false, false, true, false, false, false, true, true, false];
        let expected = [4.0, 8.0, 4.0, 4.0, 8.0, 8.0, 4.0, 2.0, 2.0];
        let mut s = GradScalerState::new(4.0);
        for (inf, want) in found.into_iter().zip(expected) {
            step(&mut s, inf, 2);
            assert_eq!(s.scale, want);
        }
    }
}
