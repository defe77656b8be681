//! [`LaunchPlan::run`]: the launcher's entry point, choosing the supervision the plan needs
//! (fixed node ranks, or elastic rounds), so neither depends on the other.

use crate::error::LaunchError;
use crate::plan::LaunchPlan;
use crate::signals::SignalGuard;
use crate::supervise::elastic::run_elastic;
use crate::supervise::live::Console;
use crate::supervise::run_fixed;
use crate::supervise::spawn::become_subreaper;

impl LaunchPlan {
    /// Starts the workers of this node, supervises them (restarting the group up to
    /// `max_restarts` times; an elastic job re-forms in rendezvous rounds) and returns when
    /// they all succeeded, or with the failure.
    ///
    /// Call it from a thread that lives until it returns (normally `main`): workers get
    /// SIGKILL when the thread that started them ends. Installs handlers for SIGINT, SIGTERM,
    /// SIGHUP and SIGQUIT while running (forwarded to every worker) and restores the previous
    /// ones; one of them that was ignored (`nohup`) is left ignored, here and in the workers.
    ///
    /// # Errors
    /// [`LaunchError::WorkerFailed`] (the summary was printed to stderr),
    /// [`LaunchError::Interrupted`], [`LaunchError::PortInUse`], [`LaunchError::Spawn`], ...
    pub fn run(&self) -> Result<(), LaunchError> {
        let signals = SignalGuard::install()?;
        // Orphans of workers reparent to the launcher, which kills them after each attempt.
        become_subreaper();
        match &self.elastic {
            Some(settings) => run_elastic(self, settings, &signals, &Console::from_env()),
            None => run_fixed(self, &signals),
        }
    }
}
