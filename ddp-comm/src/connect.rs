//! Connecting and being connected to.
//!
//! - [`retry_until`]: the one connect-retry loop: the store client and the rank-to-rank
//!   connections both start before their peer may be listening, so they try again until a
//!   deadline.
//! - [`raise_backlog`]: listeners (the store's, each rank's) that a thousand peers can reach
//!   at once.
//! - [`EventLoop`]: such a listener served by a tokio event loop on its own thread.

use crate::error::{CommError, Result};
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Listen backlog asked for (the kernel caps it at `net.core.somaxconn`).
const BACKLOG: libc::c_int = 4096;

/// Lets a thousand peers connect at once: the standard library listens with a backlog of 128,
/// and a connection beyond the backlog waits a whole second for its SYN to be retried.
/// Listening again on a listening socket only changes its backlog; failing is harmless.
pub(crate) fn raise_backlog(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid listening socket; `listen` reads no memory.
    let rc = unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "could not raise a listen backlog");
    }
}

/// A listener served by a single-threaded tokio runtime on its own thread; dropping it stops the
/// loop and joins the thread. The store server and each rank's mesh listener both run one, so
/// they share how it is set up and torn down.
#[derive(Debug)]
pub(crate) struct EventLoop {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EventLoop {
    /// Makes `listener` non-blocking with a raised backlog, and runs `serve(listener, stop)` on
    /// a thread named `thread_name`; `serve`'s future should end when `stop` fires. When it
    /// ends, the runtime is dropped with every task still on it, closing their sockets. Returns
    /// the listener's address too.
    ///
    /// # Errors
    /// I/O errors configuring the listener or starting the loop, prefixed with `what`
    /// ("store", "rendezvous").
    pub(crate) fn start<F>(
        listener: TcpListener,
        what: &str,
        thread_name: &str,
        serve: impl FnOnce(tokio::net::TcpListener, oneshot::Receiver<()>) -> F + Send + 'static,
    ) -> Result<(SocketAddr, EventLoop)>
    where
        F: Future<Output = ()>,
    {
        let ctx = |step: &str| format!("{what}: {step}");
        let addr = listener
            .local_addr()
            .map_err(|e| CommError::io(ctx("reading the listener's address"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io(ctx("configuring the listener"), e))?;
        raise_backlog(&listener);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| CommError::io(ctx("starting the event loop"), e))?;
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| CommError::io(ctx("registering the listener"), e))?
        };
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                runtime.block_on(serve(listener, stopped));
                // Dropping the runtime drops every task still running, closing its socket.
                drop(runtime);
            })
            .map_err(|e| CommError::io(ctx("starting the event loop's thread"), e))?;
        let event_loop = EventLoop {
            stop: Some(stop),
            thread: Some(thread),
        };
        Ok((addr, event_loop))
    }
}

impl Drop for EventLoop {
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

/// What one attempt gave instead of a connection.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Worth trying again (the peer does not listen yet).
    Retry(io::Error),
    /// Pointless to try again.
    GiveUp(io::Error),
}

/// Calls `attempt` until it succeeds, gives up, or `deadline` passes (then its last error),
/// pausing `pause` between attempts. It is always tried at least once.
///
/// # Errors
/// The last attempt's error.
pub(crate) fn retry_until<T>(
    deadline: Instant,
    pause: Duration,
    mut attempt: impl FnMut() -> Result<T, Attempt>,
) -> io::Result<T> {
    loop {
        match attempt() {
            Ok(v) => return Ok(v),
            Err(Attempt::GiveUp(e)) => return Err(e),
            Err(Attempt::Retry(e)) => {
                if Instant::now() >= deadline {
                    return Err(e);
                }
            }
        }
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_until_success_or_the_deadline() {
        let mut tries = 0;
        let r = retry_until(
            Instant::now() + Duration::from_secs(5),
            Duration::ZERO,
            || {
                tries += 1;
                if tries < 3 {
                    Err(Attempt::Retry(io::Error::other("not yet")))
                } else {
                    Ok(tries)
                }
            },
        );
        assert_eq!(r.ok(), Some(3));
        let r: io::Result<()> = retry_until(Instant::now(), Duration::ZERO, || {
            Err(Attempt::Retry(io::Error::other("never")))
        });
        assert_eq!(r.expect_err("deadline").to_string(), "never");
        let mut tries = 0;
        let r: io::Result<()> = retry_until(
            Instant::now() + Duration::from_secs(5),
            Duration::ZERO,
            || {
                tries += 1;
                Err(Attempt::GiveUp(io::Error::other("stop")))
            },
        );
        assert!(r.is_err());
        assert_eq!(tries, 1);
    }
}
