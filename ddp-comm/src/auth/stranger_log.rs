//! Warnings about strangers on a listening port (refused hellos, oversized or malformed
//! frames), rate-limited: each is worth a line in the rank's log, but a flood of them must not
//! bury everything else in it (or fill a disk). The first is logged at once; later ones at
//! most once per [`INTERVAL`] per listener, with how many were left out since.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shortest time between two warnings of one listener.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// One listener's limiter (a `static` per listener kind).
#[derive(Debug)]
pub(crate) struct StrangerLog {
    last: Mutex<Option<Instant>>,
    left_out: AtomicU64,
}

impl StrangerLog {
    pub(crate) const fn new() -> Self {
        StrangerLog {
            last: Mutex::new(None),
            left_out: AtomicU64::new(0),
        }
    }

    /// Whether to log an event seen at `now`: `Some(n)` with the `n` events left out since the
    /// last line, or `None` (this one is left out and counted).
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match *last {
            Some(t) if now.saturating_duration_since(t) < INTERVAL => {
                self.left_out.fetch_add(1, Ordering::Relaxed);
                None
            }
            _ => {
                *last = Some(now);
                Some(self.left_out.swap(0, Ordering::Relaxed))
            }
        }
    }

    /// How a stranger's hello on `listener` ("store", "rendezvous") ended: what it was admitted
    /// as, or `None` after a warning (rate-limited) that says why it was not: a refused hello,
    /// or none complete within `timeout`.
    pub(crate) fn hello_outcome<T, E: Display>(
        &self,
        listener: &str,
        peer: SocketAddr,
        timeout: Duration,
        outcome: Result<Result<T, E>, tokio::time::error::Elapsed>,
    ) -> Option<T> {
        match outcome {
            Ok(Ok(admitted)) => Some(admitted),
            Ok(Err(reason)) => {
                warn_stranger!(self, %peer, %reason, "{listener}: rejected a connection");
                None
            }
            Err(_) => {
                warn_stranger!(
                    self,
                    %peer,
                    ?timeout,
                    "{listener}: no complete hello before the deadline, dropping the connection"
                );
                None
            }
        }
    }
}

/// Logs a warning about a stranger on `$limiter`'s listener, rate-limited: the fields and
/// message of `tracing::warn!`, plus `left_out` (similar warnings not logged since the last).
macro_rules! warn_stranger {
    ($limiter:expr, $($rest:tt)+) => {
        if let Some(left_out) = $limiter.admit(std::time::Instant::now()) {
            tracing::warn!(left_out, $($rest)+);
        }
    };
}
pub(crate) use warn_stranger;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_gives_one_line_per_interval_with_the_count_left_out() {
        let log = StrangerLog::new();
        let t0 = Instant::now();
        assert_eq!(log.admit(t0), Some(0), "the first is logged");
        for i in 1..=100 {
            assert_eq!(log.admit(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(log.admit(t0 + INTERVAL), Some(100), "then with the count");
        assert_eq!(log.admit(t0 + INTERVAL), None);
        assert_eq!(log.admit(t0 + INTERVAL * 3), Some(1));
    }
}
