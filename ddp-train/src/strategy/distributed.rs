//! `distributed()`: what makes a burn-train `SupervisedTraining` use [`DdpStrategy`], with
//! the resumed epoch passed on to burn-train and rank 0's renderer chosen (burn-train's
//! dashboard in a terminal outside the launcher, else [`ProgressRenderer`]); the other ranks
//! render and log nothing. Apart because it is the user-facing builder extension.

use super::DdpStrategy;
use crate::components::DdpComponents;
use crate::renderer::ProgressRenderer;
use crate::silent::SilentRenderer;
use burn_train::{SupervisedTraining, TrainingStrategy};
use ddp_core::progress::ProgressSetting;
use std::io::IsTerminal;
use std::sync::Arc;

/// Makes a burn-train `SupervisedTraining` distributed.
pub trait DistributedTrainingExt {
    /// Trains with `strategy` (see [`DdpStrategy`]). Rank 0 renders: burn-train's terminal
    /// dashboard when it runs in a terminal outside the launcher (with the `tui` feature, on by
    /// default, and `DDP_PROGRESS` unset or `auto`), else [`ProgressRenderer`] (the launcher's
    /// live bar, or its own bar or lines); call `.renderer(...)` afterwards for another. The
    /// other ranks draw nothing and install no experiment log file (rank 0 renders and logs for
    /// the whole job).
    fn distributed(self, strategy: &DdpStrategy) -> Self;
}

impl<LC: DdpComponents + 'static> DistributedTrainingExt for SupervisedTraining<LC> {
    fn distributed(self, strategy: &DdpStrategy) -> Self {
        let mut training =
            self.with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy.clone())));
        if let Some(point) = strategy.resume.filter(|p| p.epochs_done > 0) {
            // burn-train's view of the resumed epoch (its dashboard shows it).
            training = training.checkpoint(point.epochs_done);
        }
        if strategy.rank() == 0 {
            let dashboard = uses_dashboard(
                cfg!(feature = "tui"),
                std::io::stdout().is_terminal(),
                ddp_core::progress::claim_report_pipe(),
                ProgressSetting::from_env(),
            );
            if dashboard {
                // burn-train's default renderer: its dashboard, given the run's interrupter
                // (quitting it stops every rank at the next step) and resumed epoch.
                training
            } else {
                training.renderer(ProgressRenderer::new())
            }
        } else {
            training
                .renderer(SilentRenderer)
                .with_application_logger(None)
        }
    }
}

/// Whether rank 0 keeps burn-train's own renderer (its dashboard): only when it is built in
/// (`tui_built`), stdout is a terminal, the launcher gave this process no report pipe (under
/// the launcher, its bar shows progress above every rank's output) and `DDP_PROGRESS` does not
/// ask for bars or lines.
fn uses_dashboard(
    tui_built: bool,
    stdout_is_terminal: bool,
    under_launcher: bool,
    setting: ProgressSetting,
) -> bool {
    tui_built && stdout_is_terminal && !under_launcher && setting == ProgressSetting::Auto
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_is_drawn_only_in_a_terminal_outside_the_launcher_when_asked_for_nothing_else()
    {
        use ProgressSetting::{Auto, Bar, Lines};
        assert!(uses_dashboard(true, true, false, Auto));
        // Not built, not a terminal, under the launcher, or bars/lines asked for: ours.
        assert!(!uses_dashboard(false, true, false, Auto));
        assert!(!uses_dashboard(true, false, false, Auto));
        assert!(!uses_dashboard(true, true, true, Auto));
        assert!(!uses_dashboard(true, true, false, Bar));
        assert!(!uses_dashboard(true, true, false, Lines));
    }
}
