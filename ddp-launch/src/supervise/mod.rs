//! The supervising side: spawning workers ([`spawn`]), their output and the progress bar
//! ([`output`], [`live`]), failure blame ([`blame`]), one job's run ([`run`]) and the elastic
//! agents ([`elastic`]).
//!
//! The supervisor shared by [`launch`](crate::launch) and `ddp-run`: starts this node's workers,
//! waits for them, stops them all when one fails or a signal arrives, prints the failure
//! summary, and restarts the group while restarts are left.
//!
//! Stopping means: the signal (SIGTERM after a failure, the received signal after an
//! interruption) to every worker's process group, up to `--grace-period` for them to exit, then
//! SIGKILL to every group. A second signal to the launcher skips the grace period.
//!
//! What outlives what (Linux): the launcher is a child subreaper, so after each attempt it
//! SIGKILLs, besides every worker's process group, any process a worker left behind outside its
//! group (reparented to the launcher). Workers get `PR_SET_PDEATHSIG` = SIGKILL, so they die
//! with the launcher even when it is SIGKILLed; what a worker started dies then only if it is
//! still in the worker's process group and something kills that group (or it dies with its
//! parent on its own): a SIGKILLed launcher cannot clean up.

pub(crate) mod blame;
pub(crate) mod elastic;
pub(crate) mod live;
pub(crate) mod output;
pub(crate) mod run;
pub(crate) mod spawn;

use crate::error::LaunchError;
use crate::node_sync::NodeSync;
use crate::note::{note, noteln};
use crate::plan::LaunchPlan;
use crate::rendezvous::{Rendezvous, single_node_port};
use crate::signal_names::signal_name;
use crate::signals::SignalGuard;
use crate::summary::{FailureCause, FailureSummary, RankFailure, WorkerExit};
use crate::supervise::blame::{FailureDir, trace_root};
use crate::supervise::live::Console;
use crate::supervise::spawn::{
    AttemptFiles, ExitEvent, Worker, kill_orphans, own_children, reap_exited_orphans, spawn_worker,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// How often the supervisor checks for signals while waiting for workers.
const TICK: Duration = Duration::from_millis(50);
/// How often the launcher reaps exited processes the workers left behind.
const REAP_EVERY: Duration = Duration::from_secs(1);
/// How long to wait for workers (and, before them, the processes they left behind) to be
/// reaped after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(30);
/// How long a worker that reported a communication failure may take to exit on its own before
/// the launcher stops the job: its group is unusable, but as the host of the workers' store
/// rank 0 would otherwise wait up to a whole timeout for a stalled peer to disconnect.
const REPORT_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for the output threads to drain the pipes once every worker is gone.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// How one attempt ended.
pub(crate) enum Outcome {
    Succeeded,
    Failed(FailureSummary),
    Interrupted(i32),
}

/// A job with fixed node ranks (one node, or `--rdzv-backend static`): runs attempts until one
/// succeeds or no restarts are left. The caller installed the signal handlers.
pub(crate) fn run_fixed(plan: &LaunchPlan, signals: &SignalGuard) -> Result<(), LaunchError> {
    let mut rdzv = if plan.is_multi_node() {
        Some(Rendezvous::connect(plan, signals)?)
    } else {
        None
    };
    // Every node's workers get node 0's launch id.
    let adopted;
    let plan = match &rdzv {
        Some(r) if r.launch_id() != plan.launch_id => {
            adopted = LaunchPlan {
                launch_id: r.launch_id().to_string(),
                ..plan.clone()
            };
            &adopted
        }
        _ => plan,
    };
    let console = Console::from_env();
    let result = run_attempts(plan, signals, &console, rdzv.as_mut());
    if let Some(rdzv) = rdzv {
        rdzv.close(signals);
    }
    result
}

fn run_attempts(
    plan: &LaunchPlan,
    signals: &SignalGuard,
    console: &Arc<Console>,
    mut rdzv: Option<&mut Rendezvous>,
) -> Result<(), LaunchError> {
    // A launcher that took a dead one's place joins the attempt the other nodes start next.
    // One that took the place of a launcher whose workers already succeeded has nothing to run.
    let mut restart_count = match rdzv.as_deref().map(Rendezvous::first_attempt) {
        None => 0,
        Some(Some(attempt)) => attempt,
        Some(None) => return Ok(()),
    };
    let mut previous_port = None;
    loop {
        let port = match rdzv.as_deref_mut() {
            Some(r) => r.begin(restart_count, signals)?,
            None => single_node_port(plan, previous_port)?,
        };
        previous_port = Some(port);
        let log_dir = attempt_log_dir(plan, restart_count)?;
        tracing::info!(
            attempt = restart_count,
            workers = plan.nproc_per_node,
            world_size = plan.world_size(),
            master = %format!("{}:{port}", plan.master_addr),
            program = %plan.command.program.display(),
            "starting workers"
        );
        let outcome = run_attempt(
            plan,
            restart_count,
            port,
            log_dir,
            signals,
            console,
            rdzv.as_deref_mut().map(|r| r as &mut dyn NodeSync),
        )?;
        let summary = match outcome {
            Outcome::Interrupted(signal) => return Err(LaunchError::Interrupted { signal }),
            Outcome::Succeeded => match rdzv.as_deref_mut() {
                None => return Ok(()),
                Some(r) => match r.finish(restart_count, signals)? {
                    None => return Ok(()),
                    Some(cause) => FailureSummary {
                        cause,
                        restart_count,
                        max_restarts: plan.max_restarts,
                        others: Vec::new(),
                        root_cause: None,
                        rounds: Vec::new(),
                    },
                },
            },
            Outcome::Failed(summary) => summary,
        };
        note!("{}", summary.report());
        let lost = matches!(summary.cause, FailureCause::LostRendezvous { .. });
        let aborted = rdzv.as_deref().is_some_and(Rendezvous::aborted);
        if let Some(signal) = signals.take() {
            // Arrived while the failed attempt was being stopped: do not restart.
            return Err(LaunchError::Interrupted { signal });
        }
        if restart_count < plan.max_restarts && !lost && !aborted {
            restart_count += 1;
            noteln!(
                "ddp launcher: restarting every worker (restart {restart_count} of {})",
                plan.max_restarts
            );
            continue;
        }
        return Err(LaunchError::WorkerFailed(Box::new(summary)));
    }
}

/// `--log-dir/<launch id>/attempt_<n>`, created. A directory per launch (torchrun's
/// `log_dir/<run id>_<random>`), so a later launch with the same `--log-dir` does not overwrite
/// this one's logs; every node of a job shares the launch id, so on a shared file system a job's
/// logs sit together.
pub(crate) fn attempt_log_dir(
    plan: &LaunchPlan,
    restart_count: u32,
) -> Result<Option<PathBuf>, LaunchError> {
    let Some(dir) = &plan.log_dir else {
        return Ok(None);
    };
    let path = dir
        .join(path_component(&plan.launch_id))
        .join(format!("attempt_{restart_count}"));
    std::fs::create_dir_all(&path).map_err(|source| LaunchError::LogDir {
        path: path.clone(),
        source,
    })?;
    tracing::info!(
        "workers' output of attempt {restart_count} also goes to {}/rank_<R>.log",
        path.display()
    );
    Ok(Some(path))
}

/// `id` as one file name: a launch id set in the environment may hold anything, and `/` or
/// `..` would put the logs outside `--log-dir`.
fn path_component(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .collect();
    match safe.as_str() {
        "" | "." | ".." => safe.replace('.', "_") + "_",
        _ => safe,
    }
}

/// The workers of one attempt and how far each got.
struct Group {
    workers: Vec<Worker>,
    exits: Vec<Option<WorkerExit>>,
    events: Receiver<ExitEvent>,
    /// The launcher's children that are not this attempt's: never killed as orphans.
    keep: Vec<u32>,
}

impl Group {
    fn running(&self) -> usize {
        self.exits.iter().filter(|e| e.is_none()).count()
    }

    fn record(&mut self, event: ExitEvent) -> WorkerExit {
        let exit = match event.status {
            Ok(status) => WorkerExit::from_status(status),
            Err(e) => {
                tracing::error!(local_rank = event.local_rank, %e, "cannot wait for worker");
                WorkerExit::Code(-1)
            }
        };
        if let Some(slot) = self.exits.get_mut(event.local_rank) {
            *slot = Some(exit);
        }
        exit
    }

    /// Records exits until none is running, `deadline` passes, or `stop_early` says so.
    fn wait_until(&mut self, deadline: Instant, stop_early: impl Fn() -> bool) {
        while self.running() > 0 && !stop_early() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.events.recv_timeout(left.min(TICK)) {
                Ok(ev) => {
                    self.record(ev);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// `sig` to every group, the grace period, then SIGKILL to every group and wait for all to
    /// be reaped. The grace period ends early once the launcher has received `cut_short_at`
    /// signals in total (its second signal after an interruption, any signal otherwise).
    fn stop(&mut self, sig: i32, grace: Duration, signals: &SignalGuard, cut_short_at: usize) {
        if self.running() > 0 {
            tracing::info!(signal = %signal_name(sig), running = self.running(), "stopping workers");
            for w in &self.workers {
                let _ = w.signal_group(sig);
                // A stopped worker (SIGSTOP, a debugger's detach...) acts on the signal only
                // once continued; without this it would sit out the whole grace period.
                let _ = w.signal_group(libc::SIGCONT);
            }
            self.wait_until(Instant::now() + grace, || {
                signals.received() >= cut_short_at
            });
        }
        self.kill_all();
        let pids: Vec<u32> = self.workers.iter().map(|w| w.pid).collect();
        let orphans = kill_orphans(&pids, &self.keep, KILL_WAIT);
        if orphans > 0 {
            tracing::info!(orphans, "killed processes the workers left behind");
        }
        // The last signal to the groups: from here the workers may be reaped (and their pids
        // reused), so nothing signals them again.
        for w in &mut self.workers {
            w.release();
        }
        self.wait_until(Instant::now() + KILL_WAIT, || false);
        if self.running() > 0 {
            tracing::error!(
                running = self.running(),
                "workers survived SIGKILL for {KILL_WAIT:?}"
            );
        }
    }

    /// SIGKILL to every worker's process group, exited or not, so nothing a worker started
    /// outlives the attempt. No worker is reaped before this (see [`Worker::release`]), so
    /// every group id is still the worker's.
    fn kill_all(&self) {
        for w in &self.workers {
            let _ = w.signal_group(libc::SIGKILL);
        }
    }

    /// Reaps what the workers' helpers left behind and has exited (see
    /// [`reap_exited_orphans`]).
    fn reap_exited_orphans(&self) {
        let pids: Vec<u32> = self.workers.iter().map(|w| w.pid).collect();
        let reaped = reap_exited_orphans(&pids, &self.keep);
        if reaped > 0 {
            tracing::debug!(
                reaped,
                "reaped processes the workers left behind that had exited"
            );
        }
    }

    /// Waits for the output threads to reach end of file, so tails and logs are complete.
    fn drain(&mut self) {
        let deadline = Instant::now() + DRAIN_WAIT;
        for w in &mut self.workers {
            for h in std::mem::take(&mut w.readers) {
                while !h.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if h.is_finished() {
                    let _ = h.join();
                } else {
                    tracing::warn!(
                        rank = w.rank,
                        "output still open after the worker ended; not waiting for it"
                    );
                }
            }
        }
    }
}

/// The local rank whose own failure (a report blaming nobody) is at the end of the chain of
/// blame that starts at local rank `exited`, if that is another rank of this node.
fn own_failure_behind(group: &Group, failures: &FailureDir, exited: usize) -> Option<usize> {
    let reports = failures.read(group.workers.iter().map(|w| w.rank));
    let root = trace_root(group.workers.get(exited)?.rank, &reports)?;
    root.own_report.as_ref()?;
    group.workers.iter().position(|w| w.rank == root.rank)
}

/// Runs one attempt of this node's workers, with `rdzv` linking it to the other nodes.
pub(crate) fn run_attempt(
    plan: &LaunchPlan,
    restart_count: u32,
    port: u16,
    log_dir: Option<PathBuf>,
    signals: &SignalGuard,
    console: &Arc<Console>,
    mut rdzv: Option<&mut dyn NodeSync>,
) -> Result<Outcome, LaunchError> {
    let failures = FailureDir::create(restart_count)?;
    let (tx, events) = channel();
    let mut group = Group {
        workers: Vec::with_capacity(plan.nproc_per_node),
        exits: vec![None; plan.nproc_per_node],
        events,
        // Before any worker of this attempt starts (the previous attempt's orphans are gone).
        keep: own_children(),
    };
    for local_rank in 0..plan.nproc_per_node {
        match spawn_worker(
            plan,
            local_rank,
            restart_count,
            port,
            AttemptFiles {
                log_dir: log_dir.as_deref(),
                failures: &failures,
            },
            console,
            tx.clone(),
        ) {
            Ok(w) => group.workers.push(w),
            Err(e) => {
                // Only the started ones count.
                group.exits.truncate(group.workers.len());
                group.stop(
                    libc::SIGTERM,
                    plan.grace_period,
                    signals,
                    signals.received() + 1,
                );
                group.drain();
                if let Some(r) = rdzv.as_deref_mut() {
                    r.report_failure(
                        restart_count,
                        &format!("node {}: {e}", plan.node_rank),
                        true,
                    );
                }
                return Err(e);
            }
        }
    }
    drop(tx);

    let mut first: Option<(usize, WorkerExit)> = None;
    let mut remote: Option<FailureCause> = None;
    let mut interrupted: Option<i32> = None;
    // The first running worker that wrote a failure report, and when it was seen.
    let mut reported: Option<(usize, Instant)> = None;
    let mut stopped_for_report: Option<usize> = None;
    let mut next_reap = Instant::now() + REAP_EVERY;
    while group.running() > 0 {
        if Instant::now() >= next_reap {
            group.reap_exited_orphans();
            next_reap = Instant::now() + REAP_EVERY;
        }
        match group.events.recv_timeout(TICK) {
            Ok(ev) => {
                let local_rank = ev.local_rank;
                let exit = group.record(ev);
                if exit.success() {
                    tracing::debug!(rank = plan.global_rank(local_rank), "worker finished");
                } else {
                    first = Some((local_rank, exit));
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if let Some(sig) = signals.take() {
            interrupted = Some(sig);
            break;
        }
        if let Some(cause) = rdzv
            .as_deref_mut()
            .and_then(|r| r.poll_failure(restart_count))
        {
            remote = Some(cause);
            break;
        }
        match reported {
            None => {
                reported = group
                    .workers
                    .iter()
                    .zip(&group.exits)
                    .find(|(w, exit)| exit.is_none() && failures.has_report(w.rank))
                    .map(|(w, _)| (w.local_rank, Instant::now()));
            }
            Some((local_rank, since)) if since.elapsed() >= REPORT_GRACE => {
                stopped_for_report = Some(local_rank);
                break;
            }
            Some(_) => {}
        }
    }

    // The rank that exited first may have failed only because another one did: the first
    // failure is the one at the end of the chain of blame, when that rank reported a failure
    // of its own (it printed its error before its peers could notice).
    if let Some((exited, _)) = first
        && let Some(cause) = own_failure_behind(&group, &failures, exited)
    {
        tracing::info!(
            exited = group.workers[exited].rank,
            failed = group.workers[cause].rank,
            "the first rank to exit failed because of another one"
        );
        let since = Instant::now();
        while group.exits[cause].is_none() && since.elapsed() < REPORT_GRACE {
            match group.events.recv_timeout(TICK) {
                Ok(ev) => {
                    group.record(ev);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        match group.exits[cause] {
            Some(exit) => first = Some((cause, exit)),
            None => {
                first = None;
                stopped_for_report = Some(cause);
            }
        }
    }
    // The launcher's own messages follow: no bar under them (rank 0's report reader clears it
    // too, once rank 0 is gone).
    console.clear();
    // Tell the other nodes first, so they stop while we do.
    if let Some(r) = rdzv {
        if let Some(sig) = interrupted {
            let what = format!(
                "node {} was interrupted by {}",
                plan.node_rank,
                signal_name(sig)
            );
            r.report_failure(restart_count, &what, true);
        } else if let Some((local_rank, exit)) = first {
            let what = format!(
                "rank {} (local rank {local_rank} on node {}) {exit}",
                plan.global_rank(local_rank),
                plan.node_rank
            );
            r.report_failure(restart_count, &what, false);
        } else if let Some(local_rank) = stopped_for_report {
            let what = format!(
                "rank {} (local rank {local_rank} on node {}) reported a communication failure",
                plan.global_rank(local_rank),
                plan.node_rank
            );
            r.report_failure(restart_count, &what, false);
        }
    }
    if let Some((local_rank, exit)) = first {
        tracing::error!(rank = plan.global_rank(local_rank), %exit, "worker failed; stopping the others");
    }
    let stop_signal = interrupted.unwrap_or(libc::SIGTERM);
    // After an interruption, a second signal (counted since the handlers were installed, so
    // two signals in quick succession count too) skips the grace period; after a failure, any.
    let cut_short_at = match interrupted {
        Some(_) => 2,
        None => signals.received() + 1,
    };
    group.stop(stop_signal, plan.grace_period, signals, cut_short_at);
    group.drain();

    if let Some(sig) = interrupted {
        return Ok(Outcome::Interrupted(sig));
    }
    // A worker that reported a failure and did not exit in time counts as the first failure,
    // with however it ended when stopped.
    let first = first.or_else(|| {
        stopped_for_report.map(|l| (l, group.exits[l].unwrap_or(WorkerExit::Code(-1))))
    });
    let others = |skip: Option<usize>| -> Vec<(usize, WorkerExit)> {
        group
            .workers
            .iter()
            .zip(&group.exits)
            .filter(|(w, _)| Some(w.local_rank) != skip)
            .filter_map(|(w, e)| e.map(|e| (w.rank, e)))
            .collect()
    };
    let cause = match (first, remote) {
        (Some((local_rank, exit)), _) => {
            let w = &group.workers[local_rank];
            FailureCause::Rank(RankFailure {
                rank: w.rank,
                local_rank,
                node_rank: plan.node_rank,
                pid: w.pid,
                exit,
                tail: w.tail.lines(),
                log_file: w.log_file.clone(),
            })
        }
        (None, Some(cause)) => cause,
        (None, None) => return Ok(Outcome::Succeeded),
    };
    let (skip, root_cause) = match &cause {
        FailureCause::Rank(r) => {
            let reports = failures.read(group.workers.iter().map(|w| w.rank));
            (Some(r.local_rank), trace_root(r.rank, &reports))
        }
        _ => (None, None),
    };
    if let Some(root) = &root_cause {
        tracing::error!(root = root.rank, first = ?first.map(|(l, _)| plan.global_rank(l)), "root cause of the failure");
    }
    Ok(Outcome::Failed(FailureSummary {
        cause,
        restart_count,
        max_restarts: plan.max_restarts,
        others: others(skip),
        root_cause,
        rounds: Vec::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::path_component;

    #[test]
    fn a_launch_id_becomes_one_file_name_inside_the_log_dir() {
        assert_eq!(path_component("6fddd67a54b8"), "6fddd67a54b8");
        assert_eq!(path_component("job-7.run_2"), "job-7.run_2");
        assert_eq!(path_component("/etc/x"), "_etc_x");
        assert_eq!(path_component(".."), "___");
        assert_eq!(path_component("."), "__");
        assert_eq!(path_component(""), "_");
        assert_eq!(path_component("a b\u{e9}"), "a_b_");
    }
}
