//! The communication thread: owns a group's transport and runs its collectives in issue order.
//!
//! After any failure the thread reports it to the store (`failure/<rank>`, and
//! `failure/<rank>/blame` with the rank it blames), closes every connection so blocked peers
//! fail at once, and answers every later call with [`CommError::Aborted`]. Errors that blame a
//! peer are completed with what that peer reported, following the chain of blame (a rank that
//! blames a rank that blames another...), so every rank names the rank where the trouble
//! started even when it is several hops away (e.g. behind a host's leader).
//!
//! A launcher learns the same chain without the store (which lives in rank 0 and may be the
//! thing that hangs): with [`FAILURE_FILE_ENV`](crate::FAILURE_FILE_ENV) set, the first failure is also written to that
//! file, before any store call that could block.

use super::abort::Abort;
use crate::collective::Fingerprint;
use crate::error::{CommError, Result};
use crate::failure::FailureReport;
use crate::store::Store;
use crate::transport::Transport;
use crate::work::{JobThread, Work, serve};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// How long a failing rank waits for the blamed peer's own report.
const REPORT_WAIT: Duration = Duration::from_secs(2);
/// How long it waits for each further report along the chain of blame (those ranks failed
/// before the one we blame, so their reports are usually there already).
const CHAIN_WAIT: Duration = Duration::from_millis(500);
/// The most a failing rank spends following the chain of blame through the store.
const CHAIN_DEADLINE: Duration = Duration::from_secs(4);
/// The most a failing rank waits for the store to take its own report.
const PUBLISH_DEADLINE: Duration = Duration::from_secs(1);

/// What jobs run against on the communication thread.
pub(crate) struct TransportState {
    transport: Box<dyn Transport>,
    reporter: Option<Store>,
    my_rank: usize,
    failed: Option<String>,
    abort: Arc<Abort>,
}

impl TransportState {
    /// Runs one collective unless the group already failed; turns a failure into a report.
    pub(crate) fn run<R>(
        &mut self,
        fp: &Fingerprint,
        f: impl FnOnce(&mut dyn Transport) -> Result<R>,
    ) -> Result<R> {
        if let Some(e) = self.abort.error() {
            return Err(e);
        }
        if let Some(first) = &self.failed {
            return Err(CommError::Aborted(first.clone()));
        }
        let _span = tracing::trace_span!(
            "collective",
            op = fp.kind.name(),
            seq = fp.seq,
            count = fp.count
        )
        .entered();
        match f(self.transport.as_mut()) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn fail(&mut self, e: CommError) -> CommError {
        if let Some(aborted) = self.abort.error() {
            // The abort closed our connections under this collective: its error (a "closed"
            // peer) is a consequence, and the abort already published the reason.
            tracing::debug!(rank = self.my_rank, error = %e, "collective ended by abort");
            self.transport.abort();
            self.failed = Some(aborted.to_string());
            return aborted;
        }
        // First complete the error with what the blamed peer reported (a peer reports before
        // it closes its connections, so in a cascade its report is already there), then report
        // our own error, then close: every rank's error carries the chain back to the rank
        // where the trouble started, each link read once from its own report. (Publishing the
        // completed error instead would double the text at every hop: a reader following the
        // chain appends every report, and each would already hold all those behind it.) The
        // store lives in rank 0, which may be the rank that stalled: every store call here
        // runs on a helper thread with a deadline, so a frozen store delays this rank's exit
        // by seconds, not by the store's reply timeout.
        let own_report = e.to_string();
        let e = match (&self.reporter, e.peer()) {
            (Some(store), Some(peer)) => {
                let (store, me) = (store.clone(), self.my_rank);
                let detail = bounded("ddp-comm-blame", CHAIN_DEADLINE, move || {
                    // On a connection of its own: a lookup still waiting on a slow store when
                    // its deadline passes would otherwise hold the shared connection, and the
                    // publish below (1 s) would give up behind it and lose this rank's own
                    // report. The publish keeps the connection already made: it has the
                    // shorter deadline, and no hello to say first.
                    store
                        .duplicate()
                        .map(|lookup| peer_reports(&lookup, me, peer))
                })
                .and_then(Result::ok)
                .unwrap_or_default();
                with_detail(e, detail)
            }
            _ => e,
        };
        write_failure_file(&e);
        if let Some(store) = &self.reporter {
            let (store, me, peer, report) = (store.clone(), self.my_rank, e.peer(), own_report);
            let published = bounded("ddp-comm-report", PUBLISH_DEADLINE, move || {
                // The blame goes first: a peer that reads our report then follows it at once.
                if let Some(peer) = peer {
                    store.set(&format!("failure/{me}/blame"), peer.to_string().as_bytes())?;
                }
                store.set(&format!("failure/{me}"), report.as_bytes())
            });
            if !matches!(published, Some(Ok(()))) {
                tracing::warn!(
                    rank = self.my_rank,
                    "could not publish the failure report in the store"
                );
            }
        }
        self.transport.abort();
        tracing::error!(rank = self.my_rank, error = %e, "collective failed; the process group is now unusable");
        self.failed = Some(e.to_string());
        e
    }
}

/// What the ranks along the chain of blame from `peer` reported, as `; rank R reported: ...`
/// for each (empty if `peer` reported nothing in time).
fn peer_reports(store: &Store, my_rank: usize, peer: usize) -> String {
    let mut detail = String::new();
    let mut visited = vec![my_rank];
    let mut next = Some(peer);
    while let Some(p) = next.take().filter(|p| !visited.contains(p)) {
        let wait = if visited.len() == 1 {
            REPORT_WAIT
        } else {
            CHAIN_WAIT
        };
        let Ok(report) = store.get_timeout(&format!("failure/{p}"), wait) else {
            break;
        };
        detail.push_str(&format!(
            "; rank {p} reported: {}",
            String::from_utf8_lossy(&report)
        ));
        visited.push(p);
        let blame = format!("failure/{p}/blame");
        if store.check(&[blame.as_str()]).unwrap_or(false) {
            next = store
                .get(&blame)
                .ok()
                .and_then(|b| String::from_utf8_lossy(&b).parse::<usize>().ok());
        }
    }
    detail
}

/// `e` with `detail` (what the blamed ranks reported) appended, for errors that blame a peer.
fn with_detail(e: CommError, detail: String) -> CommError {
    if detail.is_empty() {
        return e;
    }
    match e {
        CommError::PeerClosed { op, peer, .. } => CommError::PeerClosed { op, peer, detail },
        CommError::PeerGone {
            op, peer, reason, ..
        } => CommError::PeerGone {
            op,
            peer,
            reason,
            detail,
        },
        CommError::Timeout {
            op, peer, timeout, ..
        } => CommError::Timeout {
            op,
            peer,
            timeout,
            detail,
        },
        other => other,
    }
}

/// Runs `f` on a helper thread and waits at most `deadline` for its result; `None` if it did
/// not finish in time (the thread is left to finish or to die with the process).
fn bounded<T: Send + 'static>(
    name: &str,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tx.send(f());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(deadline).ok(),
        Err(e) => {
            tracing::warn!(%e, "cannot start {name}");
            None
        }
    }
}

/// Writes `e` to the launcher's failure file (the first failure of any group in this process
/// is the one that counts).
fn write_failure_file(e: &CommError) {
    FailureReport {
        blame: e.peer(),
        message: e.to_string(),
    }
    .write_to_env_file();
}

/// Handle to the communication thread; dropping it lets the queue drain and joins the thread.
pub(crate) struct TransportThread {
    thread: JobThread<TransportState>,
    abort: Arc<Abort>,
}

impl std::fmt::Debug for TransportThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportThread").finish_non_exhaustive()
    }
}

impl TransportThread {
    pub(crate) fn start(
        transport: Box<dyn Transport>,
        reporter: Option<Store>,
        my_rank: usize,
        name: String,
    ) -> Result<TransportThread> {
        let abort = Arc::new(Abort::new(
            transport.abort_handle()?,
            reporter.clone(),
            my_rank,
        ));
        let state = TransportState {
            transport,
            reporter,
            my_rank,
            failed: None,
            abort: Arc::clone(&abort),
        };
        // Dropping the state when the queue closes closes the transport's connections.
        let thread = JobThread::spawn(name, move |rx| drop(serve(rx, state)))
            .map_err(|e| CommError::io("starting the communication thread", e))?;
        Ok(TransportThread { thread, abort })
    }

    /// Fails the group at once from any thread: publishes `reason` in the store, then closes
    /// the connections, even under a running collective. Only the first call acts.
    pub(crate) fn abort(&self, reason: &str) {
        self.abort.abort(reason);
    }

    /// The error every call returns once the group was aborted.
    pub(crate) fn aborted(&self) -> Option<CommError> {
        self.abort.error()
    }

    /// Queues a job that owns its data; its result arrives through the returned [`Work`].
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut TransportState) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        self.thread.submit(move |s| run_catching(s, job))
    }

    /// Runs a job that borrows the caller's buffers, blocking until it has finished.
    pub(crate) fn run_blocking<'a, R: Send + 'a>(
        &self,
        job: impl FnOnce(&mut TransportState) -> Result<R> + Send + 'a,
    ) -> Result<R> {
        self.thread.run_blocking(move |s| run_catching(s, job))
    }

    /// Stops accepting work, lets queued collectives finish, and joins the thread.
    pub(crate) fn shutdown(&self) {
        self.thread.shutdown();
    }
}

/// Runs a job, turning a panic inside it (a bug) into a failure of the group with its message,
/// so the caller gets an error and the peers are told, instead of a dead thread.
fn run_catching<R>(
    s: &mut TransportState,
    job: impl FnOnce(&mut TransportState) -> Result<R>,
) -> Result<R> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| job(s))) {
        Ok(r) => r,
        Err(panic) => {
            let msg = crate::error::panic_message(&*panic);
            Err(s.fail(CommError::Aborted(format!(
                "communication thread panicked: {msg}"
            ))))
        }
    }
}
