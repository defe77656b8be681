//! [`AbortHandle`]: closes a transport's connections from any thread.
//!
//! A transport is owned by its group's communication thread, which may be blocked inside a
//! collective for as long as the timeout. Aborting must not wait behind it, so the handle holds
//! its own references to what the transport waits on: duplicates of the TCP sockets (shutting
//! a socket down through any of its descriptors wakes every `poll` and `recv` on it, here and
//! at the peer) and the shared-memory slot (marked aborted, with a futex wake for every rank of
//! the host that sleeps on the segment, this one included).

use super::shm::ShmAbort;
use std::net::{Shutdown, TcpStream};

/// Everything needed to abort a transport without touching it; cheap to keep for its lifetime.
#[derive(Debug, Default)]
pub(crate) struct AbortHandle {
    streams: Vec<TcpStream>,
    shm: Vec<ShmAbort>,
}

impl AbortHandle {
    /// A handle over duplicates of these sockets.
    pub(crate) fn from_streams(streams: Vec<TcpStream>) -> AbortHandle {
        AbortHandle {
            streams,
            shm: Vec::new(),
        }
    }

    /// A handle over this shared-memory slot.
    pub(crate) fn from_shm(shm: ShmAbort) -> AbortHandle {
        AbortHandle {
            streams: Vec::new(),
            shm: vec![shm],
        }
    }

    /// Adds what `other` aborts to what this handle aborts.
    pub(crate) fn merge(mut self, other: AbortHandle) -> AbortHandle {
        self.streams.extend(other.streams);
        self.shm.extend(other.shm);
        self
    }

    /// Marks the shared-memory slots aborted and shuts every socket down (both directions).
    /// Peers and this rank's own communication thread see it at once. Idempotent.
    pub(crate) fn abort(&self) {
        for s in &self.shm {
            s.abort();
        }
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}
