//! [`Abort`]: what [`ProcessGroup::abort`](crate::ProcessGroup::abort) does, shared between the
//! group's handles (any thread) and its communication thread.
//!
//! The communication thread may be blocked inside a collective, so an abort cannot be a job in
//! its queue. Instead the caller's thread publishes the reason in the store, then closes the
//! transport through its [`AbortHandle`]; the blocked collective fails, and the communication
//! thread, seeing the reason here, answers it and every later job with
//! [`CommError::Aborted`] carrying that reason.

use crate::error::CommError;
use crate::store::Store;
use crate::transport::AbortHandle;
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

/// How long an abort waits for its report to reach the store before it closes the connections
/// anyway: the report completes the peers' errors, but a hung store must not keep them waiting.
const PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// The abort state of one group on one rank.
#[derive(Debug)]
pub(crate) struct Abort {
    reason: OnceLock<String>,
    handle: AbortHandle,
    /// Where the failure report goes (`failure/<rank>` in the group's namespace, which peers
    /// read to complete their errors).
    reporter: Option<Store>,
    my_rank: usize,
}

impl Abort {
    pub(crate) fn new(handle: AbortHandle, reporter: Option<Store>, my_rank: usize) -> Abort {
        Abort {
            reason: OnceLock::new(),
            handle,
            reporter,
            my_rank,
        }
    }

    /// The reason given to the first [`Abort::abort`], if the group was aborted.
    pub(crate) fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// The error every call on an aborted group returns.
    pub(crate) fn error(&self) -> Option<CommError> {
        self.reason()
            .map(|r| CommError::Aborted(format!("this rank aborted the group: {r}")))
    }

    /// Publishes `reason` as this rank's failure report, then closes every connection. Only the
    /// first call acts; it returns within about [`PUBLISH_WAIT`] whatever the store does.
    pub(crate) fn abort(&self, reason: &str) {
        if self.reason.set(reason.to_string()).is_err() {
            tracing::debug!(rank = self.my_rank, reason, "process group already aborted");
            return;
        }
        tracing::error!(rank = self.my_rank, reason, "aborting the process group");
        if let Some(store) = &self.reporter {
            self.publish(store.clone(), reason);
        }
        self.handle.abort();
    }

    /// Sets `failure/<rank>` from a helper thread, waiting at most [`PUBLISH_WAIT`] for it (the
    /// store connection may be busy with the communication thread's own report, or the store
    /// may hang).
    fn publish(&self, store: Store, reason: &str) {
        let key = format!("failure/{}", self.my_rank);
        let report = format!("aborted: {reason}");
        let (tx, rx) = mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name(format!("ddp-comm-abort-{}", self.my_rank))
            .spawn(move || {
                let _ = tx.send(store.set(&key, report.as_bytes()));
            });
        let outcome = match spawned {
            Ok(_) => rx.recv_timeout(PUBLISH_WAIT).ok(),
            Err(e) => Some(Err(CommError::io("starting the abort report thread", e))),
        };
        match outcome {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(rank = self.my_rank, error = %e, "could not publish the abort reason")
            }
            None => tracing::warn!(
                rank = self.my_rank,
                "the store did not take the abort reason within {PUBLISH_WAIT:?}; closing anyway"
            ),
        }
    }
}
