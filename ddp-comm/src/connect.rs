//! Connecting and being connected to.
//!
//! - [`retry_until`]: the one connect-retry loop: the store client and the rank-to-rank
//!   connections both start before their peer may be listening, so they try again until a
//!   deadline.
//! - [`raise_backlog`]: listeners (the store's, each rank's) that a thousand peers can reach
//!   at once.

use std::io;
use std::net::TcpListener;
use std::time::{Duration, Instant};

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
