//! The store server: a key-value map behind a TCP listener, served by one event loop.
//!
//! Rank 0 hosts it for the job. The server runs a single-threaded tokio runtime on its own
//! thread: every client is a task on it, never a thread, so thousands of ranks (or strangers)
//! cost a few kilobytes each. A connection must first complete the hello (`auth`: both sides
//! prove the job token); one that sends anything else, cannot prove the token, or later sends
//! a frame over the limit is disconnected and logged, and the others keep being served.
//!
//! Until a connection has proved the token it is *pending*: it must finish its hello within
//! [`StoreConfig::hello_timeout`] in total (a `tokio::time` deadline on the whole hello,
//! however slowly its bytes arrive), and the hellos running at once are capped with a grace
//! period (`auth::pending`, shared with the mesh listener). Idle or dripping strangers
//! therefore cannot exhaust the server nor lock real ranks out.
//!
//! Shutdown stops the event loop and drops every task with it: each client's socket closes,
//! including those waiting in `get` or `wait`, so no waiter can sleep through it.

use super::config::StoreConfig;
use super::session::{Served, serve};
use super::state::State;
use crate::auth::PendingHellos;
use crate::connect::EventLoop;
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A running store server. Dropping it disconnects every client and stops its thread.
pub struct StoreServer {
    /// Kept for its drop, which stops and joins the loop; first, so that happens before the
    /// rest is dropped.
    _running: EventLoop,
    addr: SocketAddr,
    served: Arc<Served>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .field("clients", &self.served.clients.load(Ordering::Relaxed))
            .finish()
    }
}

impl StoreServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving.
    ///
    /// # Errors
    /// [`CommError::Bind`] when the address is in use or cannot be bound.
    pub fn bind(addr: impl Into<String>, config: StoreConfig) -> Result<StoreServer> {
        let addr = addr.into();
        let listener = TcpListener::bind(&addr).map_err(|source| CommError::Bind {
            addr: addr.clone(),
            source,
        })?;
        Self::from_listener(listener, config)
    }

    /// Serves on an already bound listener.
    ///
    /// # Errors
    /// A token longer than [`MAX_TOKEN_BYTES`](crate::MAX_TOKEN_BYTES); I/O errors configuring
    /// the listener or starting the event loop's thread.
    pub fn from_listener(listener: TcpListener, config: StoreConfig) -> Result<StoreServer> {
        Self::from_listener_seeded(listener, config, [])
    }

    /// Serves on an already bound listener a map that holds `entries` before the first client
    /// is served, so no client can write those keys first: the host of an elastic rendezvous
    /// seeds its own settings this way and every other node is checked against them.
    ///
    /// # Errors
    /// As [`StoreServer::from_listener`].
    pub fn from_listener_seeded(
        listener: TcpListener,
        config: StoreConfig,
        entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    ) -> Result<StoreServer> {
        crate::auth::check_token("store token", &config.token)?;
        let served = Arc::new(Served {
            state: State::with_entries(entries.into_iter().collect()),
            config,
            clients: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        });
        let s = served.clone();
        let (local, running) = EventLoop::start(listener, "store", "ddp-store", |l, stop| {
            accept_loop(l, s, stop)
        })?;
        tracing::debug!(%local, "store server listening");
        Ok(StoreServer {
            _running: running,
            addr: local,
            served,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Number of authenticated clients currently connected.
    pub fn num_clients(&self) -> usize {
        self.served.clients.load(Ordering::SeqCst)
    }

    /// Number of connections refused so far at the hello: they could not prove the token, sent
    /// something else, or were too slow (each is also logged, rate-limited, at warn).
    pub fn num_refused(&self) -> usize {
        self.served.refused.load(Ordering::SeqCst)
    }

    /// Waits until at most `keep` clients remain connected, or `timeout` passes. Rank 0 calls
    /// this before shutting the store down, so slower ranks can finish their last store calls.
    pub fn wait_for_clients(&self, keep: usize, timeout: Duration) -> bool {
        let deadline = deadline_after(timeout);
        while self.num_clients() > keep {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    served: Arc<Served>,
    mut stop: oneshot::Receiver<()>,
) {
    let pending = PendingHellos::new("store");
    // At the cap, `accept` waits for a hello to end, or pushes out the oldest once it had its
    // grace.
    while let Ok((stream, peer)) = pending.accept(&listener, &mut stop).await {
        let _ = stream.set_nodelay(true);
        let deadline = tokio::time::Instant::from_std(deadline_after(served.config.hello_timeout));
        let served = served.clone();
        pending.spawn(move |slot| serve(served, stream, peer, deadline, move || drop(slot)));
    }
}
