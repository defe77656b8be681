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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Everything needed to abort a transport without touching it; cheap to keep for its lifetime.
#[derive(Debug, Default)]
pub(crate) struct AbortHandle {
    shm: Vec<ShmAbort>,
    live: Vec<Arc<LiveStreams>>,
}

/// The sockets of a transport that connects on demand: its connections so far, and any made
/// later. Once aborted, every socket added afterwards is shut down at once, and the transport
/// sees [`LiveStreams::aborted`] while it waits for a connection.
#[derive(Debug, Default)]
pub(crate) struct LiveStreams {
    aborted: AtomicBool,
    streams: Mutex<Vec<TcpStream>>,
}

impl LiveStreams {
    /// Registers a duplicate of `stream` (shut down now if already aborted).
    ///
    /// # Errors
    /// Duplicating the socket failed (out of file descriptors).
    pub(crate) fn add(&self, stream: &TcpStream) -> std::io::Result<()> {
        let dup = stream.try_clone()?;
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if self.aborted.load(Ordering::SeqCst) {
            let _ = dup.shutdown(Shutdown::Both);
        }
        streams.push(dup);
        Ok(())
    }

    /// Forgets the duplicate [`LiveStreams::add`] registered for `stream` (an attempt given up
    /// on, about to be dropped), so a retried connection does not leave a descriptor behind.
    /// Matched by the connection's two addresses, which one open socket and its duplicates
    /// share and no other open socket does.
    pub(crate) fn remove(&self, stream: &TcpStream) {
        let key = |s: &TcpStream| (s.local_addr().ok(), s.peer_addr().ok());
        let target = key(stream);
        if target.0.is_none() {
            return;
        }
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = streams.iter().position(|s| key(s) == target) {
            streams.swap_remove(i);
        }
    }

    /// Whether [`LiveStreams::abort`] was called.
    pub(crate) fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Shuts every registered socket down, and every one registered later.
    pub(crate) fn abort(&self) {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        self.aborted.store(true, Ordering::SeqCst);
        for s in streams.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl AbortHandle {
    /// A handle over this shared-memory slot.
    pub(crate) fn from_shm(shm: ShmAbort) -> AbortHandle {
        AbortHandle {
            shm: vec![shm],
            ..AbortHandle::default()
        }
    }

    /// A handle over a transport's connections, present and future.
    pub(crate) fn from_live(live: Arc<LiveStreams>) -> AbortHandle {
        AbortHandle {
            live: vec![live],
            ..AbortHandle::default()
        }
    }

    /// Adds what `other` aborts to what this handle aborts.
    pub(crate) fn merge(mut self, other: AbortHandle) -> AbortHandle {
        self.shm.extend(other.shm);
        self.live.extend(other.live);
        self
    }

    /// Marks the shared-memory slots aborted and shuts every socket down (both directions).
    /// Peers and this rank's own communication thread see it at once. Idempotent.
    pub(crate) fn abort(&self) {
        for s in &self.shm {
            s.abort();
        }
        for l in &self.live {
            l.abort();
        }
    }
}
