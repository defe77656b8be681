//! [`WatchdogConfig`]: which group and rank a watchdog supervises, and how often it looks.

use crate::deadline::check_timeout;
use crate::error::{CommError, Result};
use crate::setters::setters;
use std::time::Duration;

/// Settings of a [`Watchdog`](super::Watchdog), in burn's config style:
/// `WatchdogConfig::new("world", rank, world_size, Duration::from_secs(600))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogConfig {
    /// The supervised group's name, part of the store keys (`watchdog/<group>/<rank>` on its
    /// first start on a store; see [`Watchdog::generation`](super::Watchdog::generation)).
    pub group: String,
    /// This process's rank in the group.
    pub rank: usize,
    /// Number of ranks in the group.
    pub world_size: usize,
    /// How long an item may stay incomplete after it was issued before the group is failed.
    pub timeout: Duration,
    /// How often in-flight items and the async-error probe are polled. Defaults to 2 ms.
    pub poll_interval: Duration,
    /// Least time between two progress publications in the store (failures are published at
    /// once). Defaults to 100 ms.
    pub publish_interval: Duration,
    /// How long, after a failure, the watchdog waits for the peers' progress from the store
    /// before it reports without it. Defaults to 900 ms.
    pub report_budget: Duration,
    /// How often the store is checked for a peer's failure of the group
    /// (`watchdog/<group>/failed`): a rank whose watchdog failed publishes it, and the others
    /// abort too instead of waiting for their own timeout. Defaults to 1 s.
    pub peer_check_interval: Duration,
    /// How long the polling thread may stay inside one call (a completion probe, for NCCL a
    /// CUDA event query, or the async-error probe) before a second thread fails the group with
    /// [`WatchdogCause::Stalled`](crate::watchdog::WatchdogCause::Stalled): while that call
    /// hangs no timeout can fire (PyTorch's heartbeat monitor). Defaults to the
    /// [`timeout`](Self::timeout).
    pub stall_limit: Duration,
    /// How often this rank bumps its heartbeat in the store (`<scope>beat/<rank>`, from the
    /// watchdog's store thread, which runs on while the rank computes). Defaults to 5 s.
    pub heartbeat_interval: Duration,
    /// How long a peer's heartbeat may stand still, while this rank waits on a collective, before
    /// the group is failed with
    /// [`WatchdogCause::PeerSilent`](crate::watchdog::WatchdogCause::PeerSilent) naming it:
    /// its process died or froze, which NCCL often never reports. Defaults to 60 s (a shorter
    /// [`timeout`](Self::timeout) fires first).
    pub silence_limit: Duration,
}

impl WatchdogConfig {
    /// A watchdog for `rank` of the `world_size` ranks of `group`, failing items after
    /// `timeout`.
    pub fn new(
        group: impl Into<String>,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Self {
        WatchdogConfig {
            group: group.into(),
            rank,
            world_size,
            timeout,
            poll_interval: Duration::from_millis(2),
            publish_interval: Duration::from_millis(100),
            report_budget: Duration::from_millis(900),
            peer_check_interval: Duration::from_secs(1),
            stall_limit: timeout,
            heartbeat_interval: Duration::from_secs(5),
            silence_limit: Duration::from_secs(60),
        }
    }

    setters! {
        /// Sets the poll interval.
        pub fn with_poll_interval(interval: Duration) => poll_interval;
        /// Sets the least time between progress publications.
        pub fn with_publish_interval(interval: Duration) => publish_interval;
        /// Sets how long a failure report waits for the peers' progress.
        pub fn with_report_budget(budget: Duration) => report_budget;
        /// Sets how often the store is checked for a peer's failure.
        pub fn with_peer_check_interval(interval: Duration) => peer_check_interval;
        /// Sets how long the polling thread may stay inside one call.
        pub fn with_stall_limit(limit: Duration) => stall_limit;
        /// Sets how often this rank's heartbeat is bumped.
        pub fn with_heartbeat_interval(interval: Duration) => heartbeat_interval;
        /// Sets how long a peer's heartbeat may stand still before it is named silent.
        pub fn with_silence_limit(limit: Duration) => silence_limit;
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.group.is_empty() {
            return Err(CommError::config(
                "watchdog group",
                "the group name is empty; give the group a name",
            ));
        }
        CommError::check_rank("watchdog rank", self.rank, self.world_size)?;
        check_timeout("watchdog timeout", self.timeout)?;
        for (what, d) in [
            ("watchdog poll interval", self.poll_interval),
            ("watchdog publish interval", self.publish_interval),
            ("watchdog report budget", self.report_budget),
            ("watchdog peer check interval", self.peer_check_interval),
            ("watchdog heartbeat interval", self.heartbeat_interval),
        ] {
            if d.is_zero() || d > Duration::from_secs(60) {
                return Err(CommError::config(
                    what,
                    format!("{d:?} is not between 1 ns and 60 s"),
                ));
            }
        }
        if self.silence_limit < self.heartbeat_interval * 2 {
            return Err(CommError::config(
                "watchdog silence limit",
                format!(
                    "{:?} is less than two heartbeat intervals ({:?} each); a live peer could be taken for dead",
                    self.silence_limit, self.heartbeat_interval
                ),
            ));
        }
        if self.stall_limit <= self.poll_interval {
            return Err(CommError::config(
                "watchdog stall limit",
                format!(
                    "{:?} is not longer than the poll interval of {:?}; give it more than one poll",
                    self.stall_limit, self.poll_interval
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why `config` is refused; fails the test when it is accepted.
    fn refusal(config: &WatchdogConfig) -> String {
        match config.validate() {
            Ok(()) => panic!("accepted {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn should_reject_a_rank_outside_the_world_and_a_zero_interval() {
        let ok = WatchdogConfig::new("g", 1, 2, Duration::from_secs(1));
        assert!(ok.validate().is_ok());
        let refused = [
            (
                WatchdogConfig::new("g", 2, 2, Duration::from_secs(1)),
                "rank 2 is outside 0..2",
            ),
            (ok.clone().with_poll_interval(Duration::ZERO), ""),
            (WatchdogConfig::new("", 0, 1, Duration::from_secs(1)), ""),
            (
                ok.clone().with_stall_limit(Duration::from_millis(2)),
                "not longer than the poll interval",
            ),
            (
                ok.clone().with_silence_limit(Duration::from_secs(9)),
                "less than two heartbeat intervals",
            ),
        ];
        for (config, reason) in &refused {
            let e = refusal(config);
            assert!(e.contains(reason), "{e}");
        }
    }
}
