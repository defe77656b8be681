//! The watchdog watching itself (PyTorch's heartbeat monitor): every timeout is checked by the
//! polling thread, so a probe call that never returns (a CUDA event query or
//! `ncclCommGetAsyncError` inside a hung driver) would leave every waiter waiting forever. The
//! polling thread marks each call it enters in a [`PollBeat`]; a second thread fails the group
//! with [`WatchdogCause::Stalled`](crate::failure::WatchdogCause::Stalled) once one call has
//! lasted longer than the [stall limit](super::WatchdogConfig::stall_limit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// [`PollBeat::inside`] when the polling thread is in none of the probes.
const IDLE: u64 = 0;
/// [`PollBeat::inside`] while it is in the async-error probe.
const ASYNC_ERROR: u64 = u64::MAX;

/// Which probe call the polling thread is in, and since when; lock-free, as it is written
/// twice per probe call.
#[derive(Debug)]
pub(super) struct PollBeat {
    origin: Instant,
    /// [`IDLE`], [`ASYNC_ERROR`], or the sequence number of the item whose probe it is in.
    inside: AtomicU64,
    /// When it entered that call, in nanoseconds since `origin`.
    entered_ns: AtomicU64,
}

/// A probe call that has lasted longer than the limit.
pub(super) struct Stall {
    /// The item whose probe it is; `None` for the async-error probe.
    pub(super) seq: Option<u64>,
    /// What the call is, for the error.
    pub(super) inside: String,
    /// How long it has lasted.
    pub(super) waited: Duration,
}

impl PollBeat {
    pub(super) fn new() -> Self {
        PollBeat {
            origin: Instant::now(),
            inside: AtomicU64::new(IDLE),
            entered_ns: AtomicU64::new(0),
        }
    }

    /// The polling thread enters the completion probe of item `seq`.
    pub(super) fn enter_item(&self, seq: u64) {
        self.enter(seq);
    }

    /// The polling thread enters the async-error probe.
    pub(super) fn enter_async_error(&self) {
        self.enter(ASYNC_ERROR);
    }

    /// The polling thread has returned from the call it entered.
    pub(super) fn leave(&self) {
        self.inside.store(IDLE, Ordering::Release);
    }

    fn enter(&self, what: u64) {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // The time first: the checker reads `inside`, then the time it was entered.
        self.entered_ns.store(now, Ordering::Release);
        self.inside.store(what, Ordering::Release);
    }

    /// The call the polling thread has been inside for longer than `limit`, if any.
    pub(super) fn stalled(&self, limit: Duration) -> Option<Stall> {
        let inside = self.inside.load(Ordering::Acquire);
        if inside == IDLE {
            return None;
        }
        let entered = Duration::from_nanos(self.entered_ns.load(Ordering::Acquire));
        let waited = self.origin.elapsed().saturating_sub(entered);
        if waited <= limit {
            return None;
        }
        // A call entered and left between the two loads reads as the old one: check again.
        if self.inside.load(Ordering::Acquire) != inside {
            return None;
        }
        Some(match inside {
            ASYNC_ERROR => Stall {
                seq: None,
                inside: "the communicator's async-error probe".into(),
                waited,
            },
            seq => Stall {
                seq: Some(seq),
                inside: format!("the completion probe of collective #{seq}"),
                waited,
            },
        })
    }
}

/// How often the stall checker looks: a quarter of the limit, between 1 ms and 1 s.
pub(super) fn check_interval(limit: Duration) -> Duration {
    (limit / 4).clamp(Duration::from_millis(1), Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_report_only_a_call_that_lasts_past_the_limit() {
        let beat = PollBeat::new();
        assert!(
            beat.stalled(Duration::ZERO).is_none(),
            "idle is never stalled"
        );
        beat.enter_item(7);
        std::thread::sleep(Duration::from_millis(5));
        let stall = beat.stalled(Duration::from_millis(1)).expect("stalled");
        assert_eq!(stall.seq, Some(7));
        assert!(stall.inside.contains("#7"), "{}", stall.inside);
        assert!(beat.stalled(Duration::from_secs(3600)).is_none());
        beat.leave();
        assert!(beat.stalled(Duration::ZERO).is_none());
        beat.enter_async_error();
        std::thread::sleep(Duration::from_millis(5));
        let stall = beat.stalled(Duration::from_millis(1)).expect("stalled");
        assert_eq!(stall.seq, None);
        assert!(stall.inside.contains("async-error"), "{}", stall.inside);
    }
}
