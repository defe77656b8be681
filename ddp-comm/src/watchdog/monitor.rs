//! [`Watchdog`]: the polling thread, issuing and waiting, and the failure path.

use super::bounded::{ABORT_WAIT, Bounded, run_bounded};
use super::config::WatchdogConfig;
use super::probe::{AbortFn, AsyncErrorProbe, CompletionProbe};
use super::reporter::{PeerFailure, PeerSilence, Reporter, ReporterSpec};
use super::stall::{PollBeat, check_interval};
use crate::error::{CommError, Result};
use crate::failure::{
    CollectiveLabel, PeerProgress, Progress, StuckWork, WatchdogCause, WatchdogFailure, scope,
    starts_key, with_own,
};
use crate::locked;
use crate::store::{Store, positive_count};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Supervises the collectives of one rank of a group; see the [module docs](super).
///
/// Dropping it stops the polling thread; waiters of items still in flight then get
/// [`CommError::Destroyed`]. Wait for them first ([`Watchdog::wait_idle`]).
#[derive(Debug)]
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The thread that fails the group when `thread` hangs in a probe ([`super::stall`]).
    stall_thread: Option<JoinHandle<()>>,
}

/// A work item under supervision; [`WatchedWork::wait`] blocks until it is done or the
/// watchdog failed the group.
#[derive(Debug)]
#[must_use = "a supervised item's outcome is only known after `wait`"]
pub struct WatchedWork {
    seq: u64,
    shared: Arc<Shared>,
}

struct Item {
    seq: u64,
    label: CollectiveLabel,
    bytes: usize,
    issued_at: Instant,
    probe: Arc<dyn CompletionProbe>,
    done: bool,
}

#[derive(Default)]
struct State {
    /// Last issued sequence number (0: none).
    issued: u64,
    /// Highest sequence number up to which everything has completed.
    completed: u64,
    inflight: VecDeque<Item>,
    /// Set when the failure path starts, before the abort callback runs.
    failing: bool,
    failure: Option<Arc<WatchdogFailure>>,
    stopped: bool,
}

impl State {
    fn progress(&self) -> Progress {
        Progress {
            issued: self.issued,
            completed: self.completed,
        }
    }

    fn is_done(&self, seq: u64) -> bool {
        !self.inflight.iter().any(|i| i.seq == seq && !i.done)
    }

    fn error(&self) -> Option<CommError> {
        self.failure.clone().map(CommError::Watchdog)
    }
}

struct Shared {
    config: WatchdogConfig,
    /// Which run of the group's watchdog on the store this is (1: the first).
    generation: u64,
    state: Mutex<State>,
    changed: Condvar,
    abort: Mutex<Option<AbortFn>>,
    reporter: Reporter,
    /// A peer's failure of the group, once the store thread has seen one.
    peer_failure: PeerFailure,
    /// Peers whose heartbeat stood still while this rank waited, once the store thread saw it.
    peer_silence: PeerSilence,
    /// Which probe the polling thread is in, for the stall checker.
    beat: PollBeat,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("group", &self.config.group)
            .field("rank", &self.config.rank)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until `outcome` gives the answer, re-checking each time the state changes;
    /// [`CommError::Destroyed`] once the watchdog has stopped without one. The wait of
    /// [`Watchdog::wait_idle`] and of [`WatchedWork::wait`].
    fn wait_until(&self, mut outcome: impl FnMut(&State) -> Option<Result<()>>) -> Result<()> {
        let mut state = self.lock();
        loop {
            if let Some(result) = outcome(&state) {
                return result;
            }
            if state.stopped {
                return Err(CommError::Destroyed);
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until a failure that has started is recorded. Bounded: the failure path waits at
    /// most [`ABORT_WAIT`] for the abort and the report budget for the store, and records a
    /// failure on every path (a panic in it included).
    fn settled<'a>(&'a self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while state.failing && state.failure.is_none() {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state
    }

    /// The failure path: runs once per group, on whichever thread gets here first; a second
    /// caller waits for the first's result. The report names the [`Culprit`].
    fn fail(&self, cause: WatchdogCause, culprit: Culprit) -> Arc<WatchdogFailure> {
        let (stuck, own) = {
            let mut state = self.lock();
            if state.failing {
                // settled() returns once the first caller has recorded its failure.
                if let Some(f) = &self.settled(state).failure {
                    return f.clone();
                }
                return Arc::new(self.failure(
                    cause,
                    None,
                    PeerProgress::Unknown("not read".into()),
                ));
            }
            state.failing = true;
            let stuck = state
                .inflight
                .iter()
                .find(|i| {
                    !i.done
                        && match culprit {
                            Culprit::Item(seq) => i.seq == seq,
                            Culprit::Oldest => true,
                            Culprit::None => false,
                        }
                })
                .map(|i| StuckWork {
                    seq: i.seq,
                    label: i.label,
                    bytes: i.bytes,
                    waited: i.issued_at.elapsed(),
                });
            (stuck, state.progress())
        };
        if !matches!(cause, WatchdogCause::PeerFailed(_)) {
            // Tell the peers first, before this rank's abort can break their collectives and
            // make one of them look like the first to fail.
            let unread = PeerProgress::Unknown("not read yet".into());
            let headline = self
                .failure(cause.clone(), stuck.clone(), unread)
                .headline();
            self.reporter.failed(headline);
        }
        let report = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.abort_and_report(cause.clone(), stuck.clone(), own)
        }));
        let failure = report.unwrap_or_else(|_| {
            let unread = PeerProgress::Unknown("the failure report panicked".into());
            Arc::new(self.failure(cause, stuck, unread))
        });
        let mut state = self.lock();
        state.failure = Some(failure.clone());
        self.changed.notify_all();
        failure
    }

    /// This rank's error on failing `cause`.
    fn failure(
        &self,
        cause: WatchdogCause,
        stuck: Option<StuckWork>,
        peers: PeerProgress,
    ) -> WatchdogFailure {
        WatchdogFailure {
            group: self.config.group.clone(),
            rank: self.config.rank,
            cause,
            stuck,
            peers,
        }
    }

    /// An error on this rank, outside any collective ([`Watchdog::fail`]).
    fn fail_here(&self, why: String) -> CommError {
        CommError::Watchdog(self.fail(WatchdogCause::Failed(why), Culprit::None))
    }

    /// The failure path after `failing` is set: aborts the communicator, reads the peers'
    /// progress and builds the report.
    fn abort_and_report(
        &self,
        cause: WatchdogCause,
        stuck: Option<StuckWork>,
        own: Progress,
    ) -> Arc<WatchdogFailure> {
        let c = &self.config;
        tracing::error!(group = %c.group, rank = c.rank, cause = ?cause, stuck = ?stuck, "collective watchdog: aborting the communicator");
        if let Some(abort) = locked::take(&self.abort) {
            run_abort(abort, c);
        }
        let peers = self.reporter.report(own, c.report_budget);
        let failure = Arc::new(self.failure(cause, stuck, with_own(peers, c.rank, own)));
        tracing::error!(error = %failure, "collective watchdog failed the group");
        failure
    }
}

/// Runs the abort callback, bounded ([`run_bounded`]); the group fails either way.
fn run_abort(abort: AbortFn, c: &WatchdogConfig) {
    let (group, rank) = (&c.group, c.rank);
    match run_bounded(format!("ddp-watchdog-abort-{rank}"), ABORT_WAIT, abort) {
        Bounded::Done(()) => {}
        Bounded::Panicked => {
            tracing::error!(%group, rank, "the watchdog's abort callback panicked")
        }
        Bounded::TimedOut => tracing::error!(
            %group,
            rank,
            "the communicator's abort has not returned after {ABORT_WAIT:?}; failing the group without it"
        ),
        Bounded::NotStarted(e) => {
            tracing::error!(%group, rank, error = %e, "could not start the thread that aborts the communicator")
        }
    }
}

impl Watchdog {
    /// Starts supervising `config.rank` of `config.group`: opens a connection of its own to
    /// `store` (for progress), and starts the polling thread. `abort` is called at most once,
    /// when the group fails; `async_error`, if any, is polled with the items.
    ///
    /// Each start of a group's watchdog on a store is a new run (its
    /// [generation](Watchdog::generation)) with keys of its own, so that a watchdog started
    /// again under the same name never quotes an earlier run's failure. Each rank counts its
    /// own starts: every rank must start the group's watchdogs on a store equally often.
    ///
    /// # Errors
    /// An invalid config; a store that cannot be reached; a thread that cannot be started.
    pub fn start(
        store: &Store,
        config: WatchdogConfig,
        abort: AbortFn,
        async_error: Option<AsyncErrorProbe>,
    ) -> Result<Watchdog> {
        config.validate()?;
        let generation = run_number(store, &config)?;
        let peer_failure = PeerFailure::default();
        let peer_silence = PeerSilence::default();
        let reporter = Reporter::start(ReporterSpec {
            store: store.duplicate()?,
            group: config.group.clone(),
            scope: scope(&config.group, generation),
            rank: config.rank,
            world_size: config.world_size,
            interval: config.publish_interval,
            peer_check: config.peer_check_interval,
            peer_failure: peer_failure.clone(),
            heartbeat: config.heartbeat_interval,
            silence_limit: config.silence_limit,
            peer_silence: peer_silence.clone(),
        })
        .map_err(|e| CommError::io("starting the watchdog's store thread", e))?;
        let shared = Arc::new(Shared {
            config,
            generation,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            abort: Mutex::new(Some(abort)),
            reporter,
            peer_failure,
            peer_silence,
            beat: PollBeat::new(),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ddp-watchdog-{}", shared.config.rank))
            .spawn(move || poll_loop(&thread_shared, async_error))
            .map_err(|e| CommError::io("starting the watchdog thread", e))?;
        // From here on, a failed start drops the watchdog, which stops the polling thread.
        let mut watchdog = Watchdog {
            shared,
            thread: Some(thread),
            stall_thread: None,
        };
        let stall_shared = watchdog.shared.clone();
        let stall_thread = std::thread::Builder::new()
            .name(format!(
                "ddp-watchdog-stall-{}",
                watchdog.shared.config.rank
            ))
            .spawn(move || stall_loop(&stall_shared))
            .map_err(|e| CommError::io("starting the watchdog's stall checker", e))?;
        watchdog.stall_thread = Some(stall_thread);
        Ok(watchdog)
    }

    /// Puts an item under supervision: it gets the next sequence number, and `timeout` runs from
    /// now. Call it right after the item was started (for NCCL: enqueued).
    ///
    /// # Errors
    /// [`CommError::Watchdog`] once the group has failed (the item is not supervised then).
    pub fn issue(
        &self,
        label: CollectiveLabel,
        bytes: usize,
        probe: Arc<dyn CompletionProbe>,
    ) -> Result<WatchedWork> {
        let state = self.shared.lock();
        let mut state = self.shared.settled(state);
        if let Some(e) = state.error() {
            return Err(e);
        }
        if state.stopped {
            return Err(CommError::Destroyed);
        }
        state.issued += 1;
        let seq = state.issued;
        state.inflight.push_back(Item {
            seq,
            label,
            bytes,
            issued_at: Instant::now(),
            probe,
            done: false,
        });
        self.shared.changed.notify_all();
        Ok(WatchedWork {
            seq,
            shared: self.shared.clone(),
        })
    }

    /// The group's failure, if it has failed (waits for a failure in progress to be recorded).
    ///
    /// # Errors
    /// [`CommError::Watchdog`] once the group has failed.
    pub fn check(&self) -> Result<()> {
        let state = self.shared.settled(self.shared.lock());
        state.error().map_or(Ok(()), Err)
    }

    /// Fails the group now, from the calling thread (an error the caller saw that the
    /// watchdog cannot, e.g. a failed enqueue): aborts, reports and returns the error every
    /// waiter gets. Returns the earlier failure if the group already failed. The error is
    /// this rank's own ([`WatchdogCause::Failed`]): it names no collective as stuck and no
    /// peer as behind.
    pub fn fail(&self, why: impl Into<String>) -> CommError {
        self.shared.fail_here(why.into())
    }

    /// A handle that fails the group from any thread ([`Watchdog::fail`]), for an owner that
    /// keeps the watchdog on a thread of its own (the NCCL group).
    #[cfg(feature = "cuda")]
    pub(crate) fn failer(&self) -> WatchdogFailer {
        WatchdogFailer(self.shared.clone())
    }

    /// Blocks until every issued item has completed, or returns the group's failure. Bounded:
    /// each item is failed at the latest `timeout` after it was issued.
    ///
    /// # Errors
    /// [`CommError::Watchdog`] when the group failed.
    pub fn wait_idle(&self) -> Result<()> {
        self.shared.wait_until(|state| {
            if let Some(e) = state.error() {
                return Some(Err(e));
            }
            (state.inflight.iter().all(|i| i.done) && !state.failing).then_some(Ok(()))
        })
    }

    /// The last issued sequence number (0: none yet).
    pub fn last_issued(&self) -> u64 {
        self.shared.lock().issued
    }

    /// The sequence number up to which every item has completed.
    pub fn last_completed(&self) -> u64 {
        self.shared.lock().completed
    }

    /// The settings it runs with.
    pub fn config(&self) -> &WatchdogConfig {
        &self.shared.config
    }

    /// Which start of its group's watchdog on this rank and store this is: 1 for the first,
    /// whose keys are `watchdog/<group>/...`; the `n`-th uses `watchdog@<n>/<group>/...`.
    pub fn generation(&self) -> u64 {
        self.shared.generation
    }
}

/// Counts this start of `config`'s group watchdog on this rank (see [`Watchdog::start`]).
fn run_number(store: &Store, config: &WatchdogConfig) -> Result<u64> {
    let key = starts_key(&config.group, config.rank);
    positive_count(&key, store.add(&key, 1)?, "watchdog starts")
}

/// See [`Watchdog::failer`].
#[cfg(feature = "cuda")]
#[derive(Debug, Clone)]
pub(crate) struct WatchdogFailer(Arc<Shared>);

#[cfg(feature = "cuda")]
impl WatchdogFailer {
    /// [`Watchdog::fail`].
    pub(crate) fn fail(&self, why: impl Into<String>) -> CommError {
        self.0.fail_here(why.into())
    }

    /// [`Watchdog::check`].
    pub(crate) fn check(&self) -> Result<()> {
        let state = self.0.settled(self.0.lock());
        state.error().map_or(Ok(()), Err)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopped = true;
            self.shared.changed.notify_all();
        }
        let group = &self.shared.config.group;
        if let Some(t) = self.stall_thread.take()
            && t.join().is_err()
        {
            tracing::error!(%group, "the watchdog's stall checker panicked");
        }
        let Some(t) = self.thread.take() else { return };
        // A polling thread stuck in a probe may never return: wait for it only as long as an
        // abort is waited for, and leave it behind after that (or at once when the group was
        // failed for that very stall).
        let stalled = matches!(
            self.shared.lock().failure.as_deref(),
            Some(WatchdogFailure {
                cause: WatchdogCause::Stalled { .. },
                ..
            })
        );
        let deadline = Instant::now() + if stalled { Duration::ZERO } else { ABORT_WAIT };
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if !t.is_finished() {
            tracing::error!(%group, "the watchdog thread is stuck in a probe; leaving it behind");
        } else if t.join().is_err() {
            tracing::error!(%group, "the watchdog thread panicked");
        }
    }
}

impl WatchedWork {
    /// The item's sequence number in the group (the first is 1).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether the item is done, or the group failed; never blocks.
    pub fn is_completed(&self) -> bool {
        let state = self.shared.lock();
        state.is_done(self.seq) || state.failure.is_some() || state.stopped
    }

    /// The caller saw the item finish itself (for NCCL: its end event completed) and need not
    /// wait for the watchdog's next poll: marks it done, unless the group has started failing.
    /// An aborted collective also "finishes" (NCCL's kernels exit), with garbage in its
    /// buffers; the abort only ever follows the start of a failure, so a completion seen
    /// before that is genuine and one seen after is not trusted.
    ///
    /// # Errors
    /// [`CommError::Watchdog`] when the group has started failing and the item was not
    /// recorded as done before that.
    pub fn finish_observed(self) -> Result<()> {
        let mut state = self.shared.lock();
        if state.is_done(self.seq) {
            return Ok(());
        }
        if state.failing {
            let state = self.shared.settled(state);
            return Err(state.error().unwrap_or(CommError::Destroyed));
        }
        mark_done(&mut state, &[self.seq]);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Blocks until the item has completed.
    ///
    /// # Errors
    /// [`CommError::Watchdog`] when the group failed before the item completed;
    /// [`CommError::Destroyed`] when the watchdog was dropped first.
    pub fn wait(self) -> Result<()> {
        self.shared.wait_until(|state| {
            if state.is_done(self.seq) {
                return Some(Ok(()));
            }
            state.error().map(Err)
        })
    }
}

/// Which in-flight item a failure report names as stuck.
#[derive(Clone, Copy)]
enum Culprit {
    /// The item that timed out or failed.
    Item(u64),
    /// The oldest unfinished one (the communicator failed as a whole).
    Oldest,
    /// None: the failure is not any collective's (an error the caller saw).
    None,
}

/// What the polling thread takes from an in-flight item.
struct Snapshot {
    seq: u64,
    issued_at: Instant,
    probe: Arc<dyn CompletionProbe>,
}

fn poll_loop(shared: &Shared, async_error: Option<AsyncErrorProbe>) {
    let timeout = shared.config.timeout;
    let mut sent = Progress::default();
    loop {
        let items: Vec<Snapshot> = {
            let state = shared.lock();
            if state.stopped || state.failing {
                return;
            }
            state
                .inflight
                .iter()
                .filter(|i| !i.done)
                .map(|i| Snapshot {
                    seq: i.seq,
                    issued_at: i.issued_at,
                    probe: i.probe.clone(),
                })
                .collect()
        };
        if let Some(why) = locked::take(&shared.peer_failure) {
            shared.fail(WatchdogCause::PeerFailed(why), Culprit::Oldest);
            return;
        }
        if let Some(silent) = locked::take(&shared.peer_silence) {
            let cause = WatchdogCause::PeerSilent {
                ranks: silent.ranks,
                silent_for: silent.silent_for,
            };
            shared.fail(cause, Culprit::Oldest);
            return;
        }
        if let Some(probe) = &async_error {
            shared.beat.enter_async_error();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(probe))
                .unwrap_or_else(|_| Err("the async-error probe panicked".into()));
            shared.beat.leave();
            if let Err(why) = outcome {
                shared.fail(WatchdogCause::AsyncError(why), Culprit::Oldest);
                return;
            }
        }
        let mut finished = Vec::new();
        for item in &items {
            shared.beat.enter_item(item.seq);
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| item.probe.poll()))
                .unwrap_or_else(|_| Err("the completion probe panicked".into()));
            shared.beat.leave();
            match outcome {
                Ok(true) => finished.push(item.seq),
                Ok(false) if item.issued_at.elapsed() >= timeout => {
                    drop(record(shared, &finished));
                    shared.fail(WatchdogCause::Timeout(timeout), Culprit::Item(item.seq));
                    return;
                }
                Ok(false) => {}
                Err(why) => {
                    drop(record(shared, &finished));
                    shared.fail(WatchdogCause::Failed(why), Culprit::Item(item.seq));
                    return;
                }
            }
        }
        let state = record(shared, &finished);
        let progress = state.progress();
        if progress != sent {
            sent = progress;
            shared.reporter.progress(progress);
        }
        // Sleeps the poll interval, or less when an item is issued or the watchdog stops.
        drop(
            shared
                .changed
                .wait_timeout(state, shared.config.poll_interval)
                .unwrap_or_else(PoisonError::into_inner),
        );
    }
}

/// The stall checker ([`super::stall`]): fails the group when the polling thread has been inside
/// one probe call for longer than the stall limit; returns once the watchdog stops or fails.
fn stall_loop(shared: &Shared) {
    let limit = shared.config.stall_limit;
    let every = check_interval(limit);
    let mut state = shared.lock();
    loop {
        if state.stopped || state.failing {
            return;
        }
        if let Some(stall) = shared.beat.stalled(limit) {
            drop(state);
            let c = &shared.config;
            tracing::error!(group = %c.group, rank = c.rank, inside = %stall.inside, waited = ?stall.waited, "collective watchdog: the polling thread is stuck in a probe");
            let culprit = stall.seq.map_or(Culprit::Oldest, Culprit::Item);
            let cause = WatchdogCause::Stalled {
                inside: stall.inside,
                waited: stall.waited,
            };
            shared.fail(cause, culprit);
            return;
        }
        state = shared
            .changed
            .wait_timeout(state, every)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Marks `finished` done and wakes the waiters, unless the group has started failing: its
/// abort makes unfinished collectives look finished, so what a poll saw may be the abort.
fn record<'a>(shared: &'a Shared, finished: &[u64]) -> MutexGuard<'a, State> {
    let mut state = shared.lock();
    if finished.is_empty() || state.failing {
        return state;
    }
    mark_done(&mut state, finished);
    shared.changed.notify_all();
    state
}

/// Marks `finished` done and advances the completed mark past every done item at the front.
fn mark_done(state: &mut State, finished: &[u64]) {
    for item in state.inflight.iter_mut() {
        if finished.contains(&item.seq) {
            item.done = true;
        }
    }
    while state.inflight.front().is_some_and(|i| i.done) {
        if let Some(i) = state.inflight.pop_front() {
            state.completed = i.seq;
        }
    }
}
