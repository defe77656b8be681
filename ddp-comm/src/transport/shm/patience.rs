//! How a waiting rank spends the moments before it sleeps on the segment's futex.
//!
//! Checking in a loop and yielding the CPU between checks answers a handoff within a few
//! microseconds, where a futex sleep and wake costs tens, and it lets a rank we wait for run
//! when ranks outnumber CPUs. But `sched_yield` gives the CPU to whatever else is runnable, and
//! on a host where other processes want the CPU (a data loader, a second job, a compile) the
//! scheduler hands it to one of them for a whole time slice, milliseconds, while the peer's
//! data sits ready: on the development machine, with two busy loops beside four ranks on two
//! cores, the collectives took 12-20x as long as on the idle machine. A futex sleep has no such
//! cost, since the wake from the peer puts the rank back on a CPU at once.
//!
//! So the rank watches its yields. A yield that kept the CPU away for [`STOLEN_YIELD`] gave it to
//! another process, and then the rank goes straight to the futex for every wait of the next
//! [`BUSY_HOST_BACKOFF`], after which it tries yielding again. (Where ranks outnumber CPUs,
//! long yields also come from peer ranks running; the futex serves there too, measured within
//! noise of yielding: world 4 on 2 cores, `cargo bench -p ddp-benches --bench collectives`.)

use crate::error::Result;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a waiting rank keeps checking before it sleeps on the futex.
const DEFAULT_SPIN: Duration = Duration::from_micros(100);
/// Environment variable overriding that time, in microseconds (tuning only).
const SPIN_ENV: &str = "DDP_SHM_SPIN_US";
/// Environment variable: `0` makes waiting ranks spin on the CPU between checks instead of
/// yielding it (tuning only).
const YIELD_ENV: &str = "DDP_SHM_YIELD";
/// A yield that kept the CPU away this long gave it to another process. (An idle yield takes
/// about a microsecond; losing the CPU to another process costs its time slice, milliseconds.)
pub(super) const STOLEN_YIELD: Duration = Duration::from_micros(500);
/// How long a rank that lost the CPU to another process sleeps on the futex at once.
pub(super) const BUSY_HOST_BACKOFF: Duration = Duration::from_millis(100);

/// How a rank waits before it sleeps on the futex, and what it has learnt about the host.
#[derive(Debug, Clone)]
pub(super) struct Patience {
    spin: Duration,
    /// Yield the CPU between checks (`sched_yield`) instead of spinning.
    yield_cpu: bool,
    /// Until when yielding is known to hand the CPU to other processes.
    busy_until: Cell<Option<Instant>>,
}

/// What one round of the spin phase found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spin {
    /// Keep checking.
    Again,
    /// Stop checking and sleep on the futex.
    Sleep,
}

impl Patience {
    /// [`SPIN_ENV`] and [`YIELD_ENV`], else the defaults.
    ///
    /// # Errors
    /// Either is set to something that is not a whole number (an error on every rank that has
    /// it, rather than a silent fallback on one).
    pub(super) fn from_env() -> Result<Patience> {
        Ok(Patience::new(
            crate::env::env_u64(SPIN_ENV)?.map_or(DEFAULT_SPIN, Duration::from_micros),
            crate::env::env_u64(YIELD_ENV)? != Some(0),
        ))
    }

    fn new(spin: Duration, yield_cpu: bool) -> Patience {
        Patience {
            spin,
            yield_cpu,
            busy_until: Cell::new(None),
        }
    }

    /// When the spin phase of a wait starting `now` ends: at once while the host is busy.
    pub(super) fn spin_end(&self, now: Instant) -> Instant {
        if self.host_busy(now) {
            now
        } else {
            now.checked_add(self.spin).unwrap_or(now)
        }
    }

    fn host_busy(&self, now: Instant) -> bool {
        self.busy_until.get().is_some_and(|until| now < until)
    }

    /// One round of the spin phase: yields the CPU (or spins briefly), and says whether to go
    /// on checking.
    pub(super) fn pause(&self) -> Spin {
        if !self.yield_cpu || self.host_busy(Instant::now()) {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            return Spin::Again;
        }
        let start = Instant::now();
        std::thread::yield_now();
        self.after_yield(start, Instant::now())
    }

    /// Learns from one yield that started at `start` and returned at `end`.
    fn after_yield(&self, start: Instant, end: Instant) -> Spin {
        if end.duration_since(start) >= STOLEN_YIELD {
            self.busy_until.set(end.checked_add(BUSY_HOST_BACKOFF));
            tracing::debug!(
                yielded_for = ?end.duration_since(start),
                "shm: another process took the CPU while this rank yielded; sleeping on the \
                 futex at once for the next {BUSY_HOST_BACKOFF:?}"
            );
            return Spin::Sleep;
        }
        Spin::Again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_yield_makes_waits_sleep_at_once_for_a_while() {
        let p = Patience::new(DEFAULT_SPIN, true);
        let t0 = Instant::now();
        assert_eq!(p.spin_end(t0), t0 + DEFAULT_SPIN);
        // A short yield: keep checking.
        let short = t0 + STOLEN_YIELD - Duration::from_micros(1);
        assert_eq!(p.after_yield(t0, short), Spin::Again);
        assert_eq!(p.spin_end(short), short + DEFAULT_SPIN);
        // A long one: another process had the CPU.
        let end = t0 + STOLEN_YIELD;
        assert_eq!(p.after_yield(t0, end), Spin::Sleep);
        assert_eq!(p.spin_end(end), end, "no spin phase while the host is busy");
        let later = end + BUSY_HOST_BACKOFF - Duration::from_millis(1);
        assert_eq!(p.spin_end(later), later);
        // After the back-off, yielding is tried again.
        let after = end + BUSY_HOST_BACKOFF;
        assert_eq!(p.spin_end(after), after + DEFAULT_SPIN);
    }

    #[test]
    fn with_yielding_off_a_rank_spins_and_keeps_checking() {
        let p = Patience::new(Duration::ZERO, false);
        assert_eq!(p.pause(), Spin::Again);
        let t0 = Instant::now();
        assert_eq!(p.spin_end(t0), t0);
    }
}
