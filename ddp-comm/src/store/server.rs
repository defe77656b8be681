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
//! however slowly its bytes arrive), and at most [`MAX_PENDING`] run at once. With that many
//! running, new connections wait in the listen backlog and the oldest hello is pushed out once
//! it has run [`PENDING_GRACE`] (a real rank says hello within milliseconds, so the oldest
//! pending connection is the likeliest to be a stranger; a real client pushed out in a storm
//! simply connects again). Idle or dripping strangers therefore cannot exhaust the server nor
//! lock real ranks out.
//!
//! Shutdown stops the event loop and drops every task with it: each client's socket closes,
//! including those waiting in `get` or `wait`, so no waiter can sleep through it.

use super::config::StoreConfig;
use super::session::{Served, serve};
use super::state::State;
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

/// Most connections kept at once that have not proved the token yet.
pub(crate) const MAX_PENDING: usize = 64;
/// How long a hello may run before, with [`MAX_PENDING`] running, it is pushed out to make
/// room: under a storm of real ranks every hello gets this long (the others wait in the
/// listen backlog meanwhile), and idle strangers still cannot hold the slots.
const PENDING_GRACE: Duration = Duration::from_millis(50);
/// How long the accept loop pauses after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running store server. Dropping it disconnects every client and stops its thread.
pub struct StoreServer {
    addr: SocketAddr,
    served: Arc<Served>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
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
        crate::auth::check_token("store token", &config.token)?;
        let local = listener
            .local_addr()
            .map_err(|e| CommError::io("store: reading the listener's address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io("store: configuring the listener", e))?;
        crate::connect::raise_backlog(&listener);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| CommError::io("store: starting the event loop", e))?;
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| CommError::io("store: registering the listener", e))?
        };
        let served = Arc::new(Served {
            state: State::new(),
            config,
            clients: AtomicUsize::new(0),
        });
        let (stop, stopped) = oneshot::channel();
        let s = served.clone();
        let thread = std::thread::Builder::new()
            .name("ddp-store".into())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, s, stopped));
                // Dropping the runtime drops every client task, closing its socket.
                drop(runtime);
            })
            .map_err(|e| CommError::io("store: starting the event loop's thread", e))?;
        tracing::debug!(%local, "store server listening");
        Ok(StoreServer {
            addr: local,
            served,
            stop: Some(stop),
            thread: Some(thread),
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

impl Drop for StoreServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The loop may already be gone (its thread panicked); then there is nothing to stop.
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connections still in their hello, oldest first: id, when accepted, the task.
#[derive(Debug, Default)]
struct Pending {
    tasks: VecDeque<(u64, tokio::time::Instant, AbortHandle)>,
}

fn lock(p: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    p.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    served: Arc<Served>,
    mut stop: oneshot::Receiver<()>,
) {
    let pending = Arc::new(Mutex::new(Pending::default()));
    let slot_freed = Arc::new(tokio::sync::Notify::new());
    let mut next_id = 0u64;
    loop {
        // At the cap: wait for a hello to end, or push out the oldest once it had its grace.
        loop {
            let oldest = {
                let p = lock(&pending);
                (p.tasks.len() >= MAX_PENDING)
                    .then(|| p.tasks.front().map(|(_, since, _)| *since))
                    .flatten()
            };
            let Some(since) = oldest else { break };
            tokio::select! {
                _ = &mut stop => return,
                _ = slot_freed.notified() => {}
                _ = tokio::time::sleep_until(since + PENDING_GRACE) => {
                    if let Some((_, _, task)) = lock(&pending).tasks.pop_front() {
                        tracing::warn!(
                            limit = MAX_PENDING,
                            "store: too many connections without a hello; dropping the oldest"
                        );
                        task.abort();
                    }
                }
            }
        }
        let accepted = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "store: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        next_id += 1;
        let id = next_id;
        let deadline = tokio::time::Instant::from_std(deadline_after(served.config.hello_timeout));
        let (p, freed) = (pending.clone(), slot_freed.clone());
        let task = tokio::spawn(serve(served.clone(), stream, peer, deadline, move || {
            lock(&p).tasks.retain(|(t, _, _)| *t != id);
            freed.notify_one();
        }));
        // The task cannot have run yet (this loop has not yielded), so it is listed before it
        // can take itself off the list.
        lock(&pending)
            .tasks
            .push_back((id, tokio::time::Instant::now(), task.abort_handle()));
    }
}
