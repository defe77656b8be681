//! [`RendezvousBackend`]: what the elastic rounds need from the service the launchers share.
//!
//! The round protocol ([`super::round`]) is written once over these few operations, so a
//! backend only maps them onto its service: the c10d store hosted by the first launcher
//! (`store_backend`), or an etcd cluster, with no single point of failure in the job
//! (`etcd_backend`, feature `etcd`: heartbeats are keys with a lease).

use crate::signals::SignalGuard;
use std::fmt;

/// A failed operation on the rendezvous service: it is unreachable, or refused the request.
#[derive(Debug, Clone)]
pub(crate) struct BackendError(pub(crate) String);

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key-value service with atomic counters and compare-and-set, plus heartbeats. Keys are
/// already scoped to the job (`--rdzv-id`). Every operation returns promptly (no waiting for
/// keys), so the caller can keep checking for signals.
pub(crate) trait RendezvousBackend: Send {
    /// Adds `delta` to the counter `key` (missing counts as 0); returns the new value.
    fn add(&mut self, key: &str, delta: i64) -> Result<i64, BackendError>;

    /// Sets `key` to `value` unless it is set already; returns the value it holds afterwards
    /// (so every caller learns the first writer's value). A [`compare_set`](Self::compare_set)
    /// from empty, which matches a missing key only: the values the rounds write are never empty.
    fn set_once(&mut self, key: &str, value: &[u8]) -> Result<Vec<u8>, BackendError> {
        self.compare_set(key, b"", value)
    }

    /// Sets `key` to `desired` if it holds `expected` (an empty `expected`: if it is missing, as
    /// the c10d store); returns the value afterwards.
    fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, BackendError>;

    /// The value of `key`, `None` if it is not set.
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, BackendError>;

    /// Starts sending this node's heartbeats (in the background, until the backend is dropped).
    fn start_heartbeat(&mut self, node_id: &str) -> Result<(), BackendError>;

    /// Those of `node_ids` whose heartbeat stopped for longer than the heartbeat timeout
    /// (judged from this node's observations since it first asked about them).
    fn dead_nodes(&mut self, node_ids: &[String]) -> Result<Vec<String>, BackendError>;

    /// The address of this node as the other nodes reach it (for the workers' store).
    fn advertised_host(&self) -> String;

    /// Leaves the rendezvous: stops the heartbeat, and a backend hosted by this node keeps the
    /// service up until the other nodes have left (bounded; a signal in `signals` ends the
    /// wait at once).
    fn close(self: Box<Self>, signals: &SignalGuard);
}
