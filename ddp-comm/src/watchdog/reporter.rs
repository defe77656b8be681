//! The thread that publishes a rank's progress and heartbeat in the store, watches the peers'
//! (a failure one of them published, a heartbeat that stopped: [`super::heartbeat`]) and, after
//! a failure, reads every rank's progress. Store calls happen here so that a slow store never
//! delays the watchdog's polling, and a report that takes too long is abandoned rather than
//! waited for.

use super::heartbeat::{Silence, SilenceTracker, beat_key};
use crate::failure::{PeerProgress, Progress, RankProgress, failed_key, key};
use crate::store::Store;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Ranks' keys read per `multi_get` in a report: one round trip per 1,024 ranks, each request
/// and reply far below the store's frame limit (progress values are a few bytes).
const READ_CHUNK: usize = 1024;
/// How long the thread sleeps when it has nothing left to publish.
const IDLE: Duration = Duration::from_secs(3600);

enum Message {
    Progress(Progress),
    Report {
        own: Progress,
        reply: SyncSender<PeerProgress>,
    },
    /// This rank failed the group: why, for `<scope>failed` (unless a peer was first).
    Failed(String),
}

/// Where the store thread leaves a peer's failure for the polling thread: what the first
/// failing rank published.
pub(crate) type PeerFailure = Arc<Mutex<Option<String>>>;

/// Where the store thread leaves the peers it found silent for the polling thread.
pub(crate) type PeerSilence = Arc<Mutex<Option<Silence>>>;

/// Handle to the publishing thread. Dropping it lets the thread publish the last progress and
/// exit on its own (it is not joined: a dead store could hold it up to the store's timeout).
#[derive(Debug)]
pub(crate) struct Reporter {
    tx: Sender<Message>,
}

/// What the thread needs to know.
pub(crate) struct ReporterSpec {
    pub(crate) store: Store,
    pub(crate) group: String,
    /// The run's key namespace (`failure::scope`): `watchdog/<group>/` on a first run.
    pub(crate) scope: String,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) interval: Duration,
    /// How often `<scope>failed` is checked.
    pub(crate) peer_check: Duration,
    pub(crate) peer_failure: PeerFailure,
    /// How often this rank's heartbeat is bumped.
    pub(crate) heartbeat: Duration,
    /// How long a peer's heartbeat may stand still, while this rank waits, before it is
    /// reported in `peer_silence`.
    pub(crate) silence_limit: Duration,
    pub(crate) peer_silence: PeerSilence,
}

impl Reporter {
    /// Starts the thread; it owns `spec.store` (a connection of its own).
    pub(crate) fn start(spec: ReporterSpec) -> std::io::Result<Reporter> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("ddp-watchdog-store-{}", spec.rank))
            .spawn(move || run(spec, rx))?;
        Ok(Reporter { tx })
    }

    /// Queues `p` for publication (throttled).
    pub(crate) fn progress(&self, p: Progress) {
        let _ = self.tx.send(Message::Progress(p));
    }

    /// Publishes why this rank failed the group, for the peers (not waited for).
    pub(crate) fn failed(&self, why: String) {
        let _ = self.tx.send(Message::Failed(why));
    }

    /// Publishes `own` at once and returns every rank's progress, or why it is unknown when the
    /// store does not answer within `budget`.
    pub(crate) fn report(&self, own: Progress, budget: Duration) -> PeerProgress {
        let (reply, answer) = mpsc::sync_channel(1);
        if self.tx.send(Message::Report { own, reply }).is_err() {
            return PeerProgress::Unknown("the store thread has exited".into());
        }
        match answer.recv_timeout(budget) {
            Ok(peers) => peers,
            Err(RecvTimeoutError::Timeout) => {
                PeerProgress::Unknown(format!("the store did not answer within {budget:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => {
                PeerProgress::Unknown("the store thread has exited".into())
            }
        }
    }
}

fn run(spec: ReporterSpec, rx: Receiver<Message>) {
    let own_key = key(&spec.scope, spec.rank);
    let failed = failed_key(&spec.scope);
    let mut watch = PeerWatch::default();
    let mut next_peer_check = Instant::now() + spec.peer_check;
    let mut latest = Progress::default();
    // When `latest` last changed, and what the peers' heartbeats showed since.
    let mut changed_at = Instant::now();
    let mut silence = SilenceTracker::default();
    let own_beat = beat_key(&spec.scope, spec.rank);
    let mut beats: u64 = 0;
    let mut next_beat = Instant::now();
    let mut beat_warned = false;
    let mut published = None;
    let mut last_time: Option<Instant> = None;
    let mut warned = false;
    let mut publish = |p: Progress,
                       published: &mut Option<Progress>,
                       last: &mut Option<Instant>| {
        *last = Some(Instant::now());
        match spec.store.set(&own_key, &p.encode()) {
            Ok(()) => *published = Some(p),
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(group = %spec.group, rank = spec.rank, error = %e, "the watchdog cannot publish this rank's progress in the store");
            }
            Err(_) => {}
        }
    };
    loop {
        let due = last_time.map_or(Duration::ZERO, |t| {
            spec.interval.saturating_sub(t.elapsed())
        });
        let mut wait = if published == Some(latest) { IDLE } else { due };
        if watch.active {
            wait = wait.min(next_peer_check.saturating_duration_since(Instant::now()));
        }
        wait = wait.min(next_beat.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(wait) {
            Ok(Message::Progress(p)) => {
                if p != latest {
                    changed_at = Instant::now();
                    silence.reset();
                }
                latest = p;
            }
            Ok(Message::Report { own, reply }) => {
                // Never publish less than was already sent: `own` was read when the failure
                // began, and a poll may have sent a later mark since.
                latest = Progress {
                    issued: latest.issued.max(own.issued),
                    completed: latest.completed.max(own.completed),
                };
                let own = latest;
                publish(own, &mut published, &mut last_time);
                let _ = reply.send(read_all(&spec));
                continue;
            }
            Ok(Message::Failed(why)) => {
                watch.active = false;
                // compare_set with an empty `expected` sets only a missing key: the first
                // failing rank's reason stays.
                if let Err(e) = spec.store.compare_set(&failed, b"", why.as_bytes()) {
                    tracing::warn!(group = %spec.group, rank = spec.rank, error = %e, "the watchdog cannot publish this rank's failure in the store");
                }
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if published != Some(latest) {
                    publish(latest, &mut published, &mut last_time);
                }
                return;
            }
        }
        if Instant::now() >= next_beat {
            beats += 1;
            next_beat = Instant::now() + spec.heartbeat;
            if let Err(e) = spec.store.set(&own_beat, beats.to_string().as_bytes())
                && !beat_warned
            {
                beat_warned = true;
                tracing::warn!(group = %spec.group, rank = spec.rank, error = %e, "the watchdog cannot publish this rank's heartbeat in the store");
            }
            // Waiting on the peers: this rank has a collective in flight and has made no
            // progress for two beats.
            let waiting =
                latest.issued > latest.completed && changed_at.elapsed() >= spec.heartbeat * 2;
            if watch.active && waiting {
                let silent = silence.check(
                    &spec.store,
                    &spec.scope,
                    spec.world_size,
                    spec.rank,
                    spec.silence_limit,
                );
                watch.record(
                    &spec,
                    silent,
                    &spec.peer_silence,
                    "read the peers' heartbeats from the store",
                );
            }
        }
        if watch.active && Instant::now() >= next_peer_check {
            next_peer_check = Instant::now() + spec.peer_check;
            let why = peer_failed(&spec.store, &failed);
            watch.record(
                &spec,
                why,
                &spec.peer_failure,
                "check the store for a peer's failure",
            );
        }
        let due = last_time.is_none_or(|t| t.elapsed() >= spec.interval);
        if published != Some(latest) && due {
            publish(latest, &mut published, &mut last_time);
        }
    }
}

/// Whether the thread still watches the peers, and whether it has warned that it cannot.
struct PeerWatch {
    /// Until a failure of the group is known (a peer's, or this rank's own).
    active: bool,
    /// A failed look at the store is warned about once.
    warned: bool,
}

impl Default for PeerWatch {
    fn default() -> PeerWatch {
        PeerWatch {
            active: true,
            warned: false,
        }
    }
}

impl PeerWatch {
    /// What one look at the store found about the peers: a finding (a peer's failure, the
    /// peers found silent) is left in `slot` for the polling thread and ends the watch; the
    /// first look that fails is warned about (the watchdog "cannot `what`"), later ones are not.
    fn record<T>(
        &mut self,
        spec: &ReporterSpec,
        found: crate::error::Result<Option<T>>,
        slot: &Mutex<Option<T>>,
        what: &str,
    ) {
        match found {
            Ok(Some(finding)) => {
                self.active = false;
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(finding);
            }
            Ok(None) => {}
            Err(e) if !self.warned => {
                self.warned = true;
                tracing::warn!(group = %spec.group, rank = spec.rank, error = %e, "the watchdog cannot {what}");
            }
            Err(_) => {}
        }
    }
}

/// What a peer published when it failed the group, if one did (one round trip).
fn peer_failed(store: &Store, failed: &str) -> crate::error::Result<Option<String>> {
    let why = store.multi_get(&[failed])?.into_iter().next().flatten();
    Ok(why.map(|why| String::from_utf8_lossy(&why).into_owned()))
}

/// Every rank's published progress, [`READ_CHUNK`] ranks per round trip; a rank without a
/// key never published.
fn read_all(spec: &ReporterSpec) -> PeerProgress {
    let mut peers = Vec::with_capacity(spec.world_size);
    for start in (0..spec.world_size).step_by(READ_CHUNK) {
        let ranks = start..spec.world_size.min(start + READ_CHUNK);
        let keys: Vec<String> = ranks.clone().map(|r| key(&spec.scope, r)).collect();
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = match spec.store.multi_get(&names) {
            Ok(values) => values,
            Err(e) => {
                let (first, last) = (ranks.start, ranks.end - 1);
                let k = key(&spec.scope, first);
                return PeerProgress::Unknown(format!(
                    "reading the progress of ranks {first} to {last} ('{k}', ...): {e}"
                ));
            }
        };
        for (rank, value) in ranks.zip(values) {
            let progress = value.and_then(|bytes| Progress::decode(&bytes));
            peers.push(RankProgress {
                rank,
                issued: progress.map(|p| p.issued),
                completed: progress.map(|p| p.completed),
            });
        }
    }
    PeerProgress::Known(peers)
}
