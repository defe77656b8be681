//! [`NodeSync`]: what the supervisor of one attempt needs from the other nodes' launchers,
//! whichever rendezvous joined them (static, or an elastic round).

use crate::summary::FailureCause;

/// Failures crossing nodes during one attempt.
pub(crate) trait NodeSync {
    /// A failure (or, elastic, another reason to stop) published by another node during
    /// `attempt`; cheap to call often (implementations rate-limit their reads).
    fn poll_failure(&mut self, attempt: u32) -> Option<FailureCause>;

    /// Publishes this node's failure; `abort` asks the other nodes not to restart (static) —
    /// an elastic job re-forms without this node instead.
    fn report_failure(&mut self, attempt: u32, description: &str, abort: bool);
}
