//! Heartbeats in the store, so that a rank whose process died or froze is named long before
//! the collective timeout. NCCL itself often never notices a dead peer (a peer on the same
//! host, over shared memory or NVLink), and without a launcher to see the process exit the
//! others would wait out the whole timeout (600 s by default). Each rank's store thread bumps
//! `<scope>beat/<rank>` every [`heartbeat_interval`](super::WatchdogConfig::heartbeat_interval);
//! while this rank's progress has not moved for two intervals with a collective in flight, it
//! reads every rank's beat each interval, and a rank whose beat has not changed for
//! [`silence_limit`](super::WatchdogConfig::silence_limit) is reported silent. A rank that is
//! only slow (stuck in compute, a long data load) keeps beating: its store thread runs on.

use crate::store::Store;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Ranks' beats read per `multi_get` (as the failure report's progress reads).
const READ_CHUNK: usize = 1024;

/// The store key of `rank`'s heartbeat counter in a run's scope.
pub(super) fn beat_key(scope: &str, rank: usize) -> String {
    format!("{scope}beat/{rank}")
}

/// What the peers' beats have shown since this rank got stuck.
#[derive(Debug, Default)]
pub(super) struct SilenceTracker {
    /// Per rank: the last beat read, and when it was first read with that value.
    seen: HashMap<usize, (Vec<u8>, Instant)>,
}

/// Ranks that have been silent for the limit, and for how long (the shortest among them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Silence {
    pub(crate) ranks: Vec<usize>,
    pub(crate) silent_for: Duration,
}

impl SilenceTracker {
    /// Forgets what was seen: this rank made progress, so nobody is waited for now.
    pub(super) fn reset(&mut self) {
        self.seen.clear();
    }

    /// Reads every rank's beat but `me`'s and returns the ranks whose beat has not changed for
    /// `limit`. A rank that never beat counts from the first read (it may not have started
    /// its watchdog yet; silent for the limit, it is as good as dead).
    ///
    /// # Errors
    /// The store's, on any read.
    pub(super) fn check(
        &mut self,
        store: &Store,
        scope: &str,
        world_size: usize,
        me: usize,
        limit: Duration,
    ) -> crate::error::Result<Option<Silence>> {
        let now = Instant::now();
        let mut silent = Vec::new();
        let mut shortest = Duration::MAX;
        for start in (0..world_size).step_by(READ_CHUNK) {
            let ranks: Vec<usize> = (start..world_size.min(start + READ_CHUNK))
                .filter(|&r| r != me)
                .collect();
            let keys: Vec<String> = ranks.iter().map(|&r| beat_key(scope, r)).collect();
            let names: Vec<&str> = keys.iter().map(String::as_str).collect();
            for (rank, value) in ranks.into_iter().zip(store.multi_get(&names)?) {
                let value = value.unwrap_or_default();
                let since = match self.seen.get(&rank) {
                    Some((last, since)) if *last == value => *since,
                    _ => {
                        self.seen.insert(rank, (value, now));
                        now
                    }
                };
                let quiet = now.duration_since(since);
                if quiet >= limit {
                    silent.push(rank);
                    shortest = shortest.min(quiet);
                }
            }
        }
        Ok((!silent.is_empty()).then_some(Silence {
            ranks: silent,
            silent_for: shortest,
        }))
    }
}
