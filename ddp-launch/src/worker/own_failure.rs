//! A worker whose training function failed says so before its peers can notice.
//!
//! Dropping a rank's process group closes its connections, and its peers then fail ("rank 0
//! closed its connection") and exit, often before this rank has printed its error: the
//! launcher saw the peer exit first, blamed it, and stopped this rank before its error reached
//! any log (issue 45, item 4). So [`run_worker`](crate::worker) keeps the group open until the
//! error is printed and written to this rank's failure file ([`ddp_comm::FAILURE_FILE_ENV`],
//! `blame none`: its own failure); the launcher then finds the peers' reports blaming this
//! rank and names it as the first failure. Under torchrun, the error also goes to torchrun's
//! error file ([`torchelastic_error`](super::torchelastic_error)).

use crate::note::noteln;

/// Prints `error` on stderr and records it as this rank's own failure, unless a communication
/// failure was recorded first (that one names the rank to blame, and wins).
pub(crate) fn report_own_failure(error: &dyn std::fmt::Display) {
    noteln!("ddp worker: {error}; closing the process group");
    super::torchelastic_error::write_error_file(error);
    ddp_comm::FailureReport {
        blame: None,
        message: error.to_string(),
    }
    .write_to_env_file();
}
