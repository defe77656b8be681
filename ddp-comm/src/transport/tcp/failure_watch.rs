//! Whether the peers a rank waits for have reported a failure (`failure/<rank>` in the group's
//! store namespace), read on a thread of its own: the store is rank 0's, and a rank 0 that
//! died or froze would otherwise hold the communication thread in a store call for the
//! store's timeout, past the collective's deadline and out of an abort's reach. One read at a
//! time per rank, so a slow store is never asked twice over.

use crate::store::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a rank waiting for a connection reads whether those peers reported a failure.
pub(super) const FAILURE_POLL: Duration = Duration::from_millis(250);

/// State shared with the reading threads.
#[derive(Debug, Default)]
struct Shared {
    /// A read is under way.
    in_flight: AtomicBool,
    /// The store connection of the last read, kept for the next one.
    conn: Mutex<Option<Store>>,
    /// The first global rank a read found with a report.
    found: Mutex<Option<usize>>,
}

/// Reads failure reports in the background while a mesh waits for peers to connect.
#[derive(Debug)]
pub(super) struct FailureWatch {
    /// The group's namespace, where a failed rank publishes `failure/<global rank>`.
    group_store: Store,
    shared: Arc<Shared>,
    next_read: Instant,
}

impl FailureWatch {
    pub(super) fn new(group_store: Store) -> Self {
        FailureWatch {
            group_store,
            shared: Arc::default(),
            next_read: Instant::now(),
        }
    }

    /// The one of `peers` (group ranks; `ranks` maps them to global ones) that reported a
    /// failure, as far as the reads so far found; starts another read when one is due and none
    /// is under way. Never blocks on the store.
    pub(super) fn reported(&mut self, peers: &[usize], ranks: &[usize]) -> Option<usize> {
        let found = *lock(&self.shared.found);
        if let Some(p) = found.and_then(|g| peers.iter().copied().find(|&p| ranks[p] == g)) {
            return Some(p);
        }
        let now = Instant::now();
        if peers.is_empty() || now < self.next_read {
            return None;
        }
        if self.shared.in_flight.swap(true, Ordering::AcqRel) {
            return None; // the last read has not come back: the store is slow
        }
        self.next_read = now + FAILURE_POLL;
        let peers: Vec<usize> = peers.iter().map(|&p| ranks[p]).collect();
        let (store, shared) = (self.group_store.clone(), self.shared.clone());
        let spawned = std::thread::Builder::new()
            .name("ddp-comm-failure-watch".into())
            .spawn(move || {
                read_reports(&store, &shared, &peers);
                shared.in_flight.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            // No verdict on the peers: the wait goes on to its deadline.
            tracing::debug!(error = %e, "tcp: could not start a failure-report read");
            self.shared.in_flight.store(false, Ordering::Release);
        }
        None
    }
}

/// One read of `peers`' (global ranks) reports over the kept connection (opened if there is none; dropped
/// after an error, so the next read opens a new one). A store that does not answer is not a
/// verdict on the peers.
fn read_reports(store: &Store, shared: &Shared, peers: &[usize]) {
    let keys: Vec<String> = peers.iter().map(|p| format!("failure/{p}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut conn = lock(&shared.conn);
    let reports = match conn.take() {
        Some(c) => Ok(c),
        None => store.duplicate(),
    }
    .and_then(|c| Ok((c.multi_get(&keys)?, c)));
    match reports {
        Ok((reports, c)) => {
            *conn = Some(c);
            if let Some(&rank) = peers.iter().zip(reports).find_map(|(p, r)| r.map(|_| p)) {
                *lock(&shared.found) = Some(rank);
            }
        }
        Err(e) => tracing::debug!(error = %e, "tcp: could not read the peers' failure reports"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
