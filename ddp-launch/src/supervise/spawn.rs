//! Starting one worker: its own process group, `PR_SET_PDEATHSIG`, piped output, and a thread
//! that waits for it and reports its exit.
//!
//! **No signal to a reaped group.** The worker's pid is its process-group id. Once a process is
//! reaped its pid can be reused, so `killpg` on it could reach an unrelated process group of
//! the same user. The waiter therefore learns of the exit with `waitid(WNOWAIT)`, which leaves
//! the worker a zombie: its pid, and so its group id, stays reserved. It reaps the worker only
//! when the supervisor [releases](Worker::release) it after its last signal to the group, and
//! [`Worker::signal_group`] refuses to signal a released worker.

use crate::error::LaunchError;
use crate::plan::LaunchPlan;
use crate::supervise::blame::FailureDir;
use crate::supervise::live::{Console, Stream, follow_reports};
use crate::supervise::output::{Sink, Tail, pump};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A worker's exit, sent by its waiter thread.
#[derive(Debug)]
pub(crate) struct ExitEvent {
    pub(crate) local_rank: usize,
    pub(crate) status: io::Result<ExitStatus>,
}

/// A started worker. Its `Child` lives in the waiter thread; we keep its pid, which is also its
/// process group id.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) rank: usize,
    pub(crate) local_rank: usize,
    pub(crate) pid: u32,
    pub(crate) tail: Arc<Tail>,
    pub(crate) log_file: Option<PathBuf>,
    pub(crate) readers: Vec<JoinHandle<()>>,
    /// Dropping it lets the waiter reap the worker (see the module docs); `None` once released.
    pub(crate) reap: Option<Sender<()>>,
    /// Whether [`release`](Self::release) was called: the pid may be reaped and reused.
    pub(crate) released: bool,
}

impl Worker {
    /// Sends `sig` to the worker's whole process group (it and anything it started); returns
    /// whether it did. A released worker is never signalled: its pid may have been reaped and
    /// reused by an unrelated process group.
    pub(crate) fn signal_group(&self, sig: i32) -> bool {
        if self.released {
            tracing::debug!(
                rank = self.rank,
                pid = self.pid,
                sig,
                "not signalling a released worker"
            );
            return false;
        }
        let Ok(pgid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: plain syscall; the group is the worker's own (setpgid in the child), and
        // its leader is not reaped before `release`, so the id cannot name another group.
        let rc = unsafe { libc::killpg(pgid, sig) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(rank = self.rank, pid = self.pid, sig, %err, "cannot signal worker");
            }
        }
        true
    }

    /// Lets the waiter reap the worker once it has exited. Call it after the last signal to
    /// its group; afterwards [`signal_group`](Self::signal_group) does nothing.
    pub(crate) fn release(&mut self) {
        self.released = true;
        self.reap = None;
    }
}

/// Waits until `pid` (a child) has exited, without reaping it: it stays a zombie, so its pid
/// and process-group id are not reused until it is reaped.
fn wait_exited_keep_zombie(pid: u32) -> io::Result<ExitStatus> {
    let id = libc::id_t::from(pid);
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid out-pointer; WNOWAIT leaves it waitable.
        let rc = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // SAFETY: waitid succeeded for an exited child, so si_status is the exit code or
        // signal according to si_code.
        let status = unsafe { info.si_status() };
        // The raw wait status `waitpid` would have given.
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_KILLED => status & 0x7f,
            libc::CLD_DUMPED => (status & 0x7f) | 0x80,
            other => {
                return Err(io::Error::other(format!(
                    "waitid reported si_code {other} for worker {pid}"
                )));
            }
        };
        return Ok(ExitStatus::from_raw(raw));
    }
}

/// Where one attempt's workers write: their logs (with `--log-dir`) and failure reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptFiles<'a> {
    /// `--log-dir/<launch id>/attempt_<n>`, if logging to files.
    pub(crate) log_dir: Option<&'a std::path::Path>,
    /// The failure reports (see [`crate::supervise::blame`]).
    pub(crate) failures: &'a FailureDir,
}

/// Starts local rank `local_rank` of attempt `restart_count`, its store on `master_port`, its
/// log and failure report in `files`; its output goes through `console`, and global rank 0 gets `console`'s report pipe if it is live.
///
/// Must be called on the thread that supervises the workers until they end: Linux delivers
/// `PR_SET_PDEATHSIG` when the *thread* that forked the child exits.
pub(crate) fn spawn_worker(
    plan: &LaunchPlan,
    local_rank: usize,
    restart_count: u32,
    master_port: u16,
    files: AttemptFiles<'_>,
    console: &Arc<Console>,
    events: Sender<ExitEvent>,
) -> Result<Worker, LaunchError> {
    let rank = plan.global_rank(local_rank);
    let program = plan.command.arg0.to_string_lossy().into_owned();
    let mut cmd = Command::new(&plan.command.program);
    cmd.arg0(&plan.command.arg0)
        .args(&plan.command.args)
        .envs(plan.worker_env(local_rank, restart_count, master_port))
        .env(ddp_comm::FAILURE_FILE_ENV, files.failures.file_for(rank))
        // Workers live in their own process groups: they would otherwise get SIGTTIN when
        // reading a terminal they do not own, so they read nothing.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: a terminal's Ctrl-C reaches only the launcher, which forwards it,
        // and killpg reaches whatever the worker started.
        .process_group(0)
        // Never pass on a report-pipe number this launcher inherited (a launcher started by a
        // worker): only the pipe set below, for rank 0, is meant for the worker.
        .env_remove(crate::progress::PROGRESS_FD_ENV);
    die_with_launcher(&mut cmd);
    // Rank 0's progress reports, when the launcher draws its bar. Both ends are close-on-exec;
    // only this child gets the write end, and the launcher's copy is closed once it started
    // (below), so the reader sees end of file when rank 0 is gone.
    let reports = match console.is_live() && rank == 0 {
        true => Some(io::pipe().map_err(|source| LaunchError::Spawn {
            rank,
            program: program.clone(),
            source,
        })?),
        false => None,
    };
    if let Some((_, writer)) = &reports {
        let fd = writer.as_raw_fd();
        cmd.envs(console.report_env(rank, fd));
        inherit_fd(&mut cmd, fd);
    }
    let spawned = cmd.spawn();
    let reports = reports.map(|(reader, _writer)| reader);
    let mut child = spawned.map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => LaunchError::ProgramNotFound {
            program: program.clone(),
            reason: "no such file, or its interpreter is missing".into(),
        },
        io::ErrorKind::PermissionDenied => LaunchError::ProgramNotExecutable {
            program: program.clone(),
            reason: source.to_string(),
        },
        _ => LaunchError::Spawn {
            rank,
            program: program.clone(),
            source,
        },
    })?;
    let pid = child.id();
    tracing::debug!(rank, local_rank, pid, "worker started");

    let tail = Arc::new(Tail::new(plan.tail_lines));
    let mut worker = Worker {
        rank,
        local_rank,
        pid,
        tail: tail.clone(),
        log_file: None,
        readers: Vec::new(),
        reap: None,
        released: false,
    };
    let fail = |worker: &Worker, source: io::Error| {
        let _ = worker.signal_group(libc::SIGKILL);
        LaunchError::Spawn {
            rank,
            program: program.clone(),
            source,
        }
    };

    let log = match files.log_dir {
        Some(dir) => {
            let path = dir.join(format!("rank_{rank}.log"));
            // Appended to, not truncated: a launch id set again on purpose in the launcher's
            // environment must not wipe that launch's earlier logs.
            match File::options().create(true).append(true).open(&path) {
                Ok(f) => {
                    worker.log_file = Some(path);
                    Some(Arc::new(Mutex::new(f)))
                }
                Err(source) => {
                    let _ = worker.signal_group(libc::SIGKILL);
                    let _ = child.wait();
                    return Err(LaunchError::LogDir { path, source });
                }
            }
        }
        None => None,
    };
    let prefix = format!("[rank {rank}]: ");
    let pipes = [
        (
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn io::Read + Send>),
            Stream::Stdout,
        ),
        (
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn io::Read + Send>),
            Stream::Stderr,
        ),
    ];
    for (pipe, stream) in pipes {
        let Some(pipe) = pipe else { continue };
        let sink = Sink {
            prefix: prefix.clone(),
            stream,
            console: console.clone(),
            log: log.clone(),
            tail: tail.clone(),
        };
        let name = format!(
            "ddp-out-{rank}-{}",
            if stream == Stream::Stdout { "o" } else { "e" }
        );
        match pump(name, pipe, sink) {
            Ok(h) => worker.readers.push(h),
            Err(e) => {
                let err = fail(&worker, e);
                let _ = child.wait();
                return Err(err);
            }
        }
    }
    if let Some(reader) = reports {
        match follow_reports(format!("ddp-progress-{rank}"), reader, console.clone()) {
            Ok(h) => worker.readers.push(h),
            Err(e) => {
                let err = fail(&worker, e);
                let _ = child.wait();
                return Err(err);
            }
        }
    }
    let (reap, reap_when) = channel::<()>();
    worker.reap = Some(reap);
    let waiter = std::thread::Builder::new()
        .name(format!("ddp-wait-{rank}"))
        .spawn(move || {
            let status = wait_exited_keep_zombie(child.id());
            // The supervisor may be gone (it only stops listening once every worker exited).
            let _ = events.send(ExitEvent { local_rank, status });
            // Keep the zombie (and its pid) until the supervisor sent its last signal to the
            // group: `release`, or the Worker dropped, disconnects the channel.
            let _ = reap_when.recv();
            if let Err(e) = child.wait() {
                tracing::warn!(rank, %e, "cannot reap worker");
            }
        });
    if let Err(e) = waiter {
        // The child moved into the failed closure and was dropped; kill it so it cannot linger.
        return Err(fail(&worker, e));
    }
    Ok(worker)
}

/// Lets the child keep descriptor `fd` across `exec` (it is close-on-exec in the launcher, so
/// no other child inherits it).
fn inherit_fd(cmd: &mut Command, fd: std::os::fd::RawFd) {
    // SAFETY: the closure runs between fork and exec and only calls fcntl, which is
    // async-signal-safe, on a descriptor the launcher keeps open until the spawn returned.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the worker receive SIGKILL when the launcher dies, even by SIGKILL:
/// `PR_SET_PDEATHSIG` in the child, then a `getppid()` check for a launcher that died before.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn die_with_launcher(cmd: &mut Command) {
    // SAFETY: getpid is async-signal-safe and read before the fork.
    let launcher = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
    // (prctl, getppid) and builds an io::Error from a raw code (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The launcher may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() != launcher {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Other Unixes have no parent-death signal: workers of a launcher killed by SIGKILL survive
/// there (every other way the launcher ends still stops them).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn die_with_launcher(_cmd: &mut Command) {}

/// Makes the launcher a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a process a worker
/// started that outlives its parent (for example one that left the worker's process group
/// with `setsid`) is reparented to the launcher instead of init, so [`kill_orphans`] can stop
/// it when the attempt ends. A failure only loses that guarantee (logged). The setting stays
/// for the rest of the process (harmless: it only changes who reaps orphans).
pub(crate) fn become_subreaper() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: plain prctl on this process.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            let err = io::Error::last_os_error();
            tracing::warn!(%err, "cannot become a child subreaper; orphans of workers that left their process group may outlive the launcher");
        }
    }
}

/// The pids of this process's children, from `/proc/self/task/*/children` (empty where that
/// is unavailable).
pub(crate) fn own_children() -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs and reaps every child of the launcher that is neither a worker in `workers` nor in
/// `keep` (the children it had before the attempt started): the orphans of workers that
/// reparented to it. Repeats while killing them orphans more (their own children). Each pid is
/// ours until we reap it, so it cannot be reused in between; workers are never reaped here
/// (their waiters do that).
///
/// Waits at most `wait` in all for the killed ones to die (past it, each round looks once): a
/// process stuck in the kernel (state `D`: a hung NFS mount, a wedged device) dies only when it
/// leaves it, and must not hold the launcher. Those still alive then are logged and left, never
/// signalled or waited for again.
pub(crate) fn kill_orphans(workers: &[u32], keep: &[u32], wait: Duration) -> usize {
    let deadline = Instant::now() + wait;
    let mut killed = 0;
    // Killed but not reaped in time: still our children, but not to be killed or waited again.
    let mut stuck: Vec<u32> = Vec::new();
    // Each round reaps one generation; a bounded number of rounds keeps a fork bomb finite.
    for _ in 0..64 {
        let orphans: Vec<libc::pid_t> = own_children()
            .into_iter()
            .filter(|p| !workers.contains(p) && !keep.contains(p) && !stuck.contains(p))
            .filter_map(|p| libc::pid_t::try_from(p).ok())
            .collect();
        if orphans.is_empty() {
            break;
        }
        for &pid in &orphans {
            tracing::warn!(pid, "killing a process a worker left behind");
            // SAFETY: `pid` is our child and not yet reaped, so it is that process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        killed += orphans.len();
        let survivors = reap_until(&orphans, deadline);
        if !survivors.is_empty() {
            tracing::warn!(
                pids = ?survivors,
                "processes a worker left behind survived SIGKILL for {wait:?} (stuck in the kernel?); not waiting for them"
            );
            stuck.extend(survivors.iter().filter_map(|&p| u32::try_from(p).ok()));
        }
    }
    killed
}

/// Reaps the launcher's children that are neither `workers` nor `keep` and have already
/// exited. As a child subreaper the launcher inherits what a worker's short-lived helpers
/// leave (`sh -c '(upload &)'`); unreaped, each would stay a zombie for the whole attempt and
/// count against the user's process limit. Never blocks nor signals: the running ones are
/// killed when the attempt ends ([`kill_orphans`]). Returns how many it reaped.
pub(crate) fn reap_exited_orphans(workers: &[u32], keep: &[u32]) -> usize {
    let mut reaped = 0;
    for pid in own_children() {
        if workers.contains(&pid) || keep.contains(&pid) {
            continue;
        }
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            continue;
        };
        let mut status = 0;
        // SAFETY: `pid` is our child (not a worker: those are waited by their own threads);
        // WNOHANG returns at once, reaping it only if it has exited.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            reaped += 1;
        }
    }
    reaped
}

/// Reaps the children `pids` as they exit, polling (never blocking) until all are reaped or
/// `deadline` passes; returns those not reaped.
fn reap_until(pids: &[libc::pid_t], deadline: Instant) -> Vec<libc::pid_t> {
    let mut left = pids.to_vec();
    loop {
        left.retain(|&pid| {
            let mut status = 0;
            loop {
                // SAFETY: polling our own child by pid; WNOHANG never blocks.
                let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // 0: still running; the pid: reaped; -1 (ECHILD): not ours to wait for.
                return rc == 0;
            }
        });
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(REAP_POLL);
    }
}

/// How often [`kill_orphans`] looks for the processes it killed to have exited.
const REAP_POLL: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LaunchArgs;

    /// The state letter of `pid` in /proc (`Z`: zombie), or `None` once it is gone.
    fn proc_state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) S ...`: the state follows the last ')'.
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// An exited worker stays a zombie (its pid, hence its process-group id, reserved) until it
    /// is released; after the release it is never signalled again and gets reaped.
    #[test]
    fn an_exited_worker_is_not_reaped_before_release_nor_signalled_after() {
        let plan = LaunchPlan::new(&LaunchArgs::new(), "sh", ["-c", "exit 3"]).expect("plan");
        let failures = FailureDir::create(0).expect("failure dir");
        let console = Arc::new(Console::new(false, indicatif::ProgressDrawTarget::hidden));
        let (tx, events) = channel();
        let files = AttemptFiles {
            log_dir: None,
            failures: &failures,
        };
        let mut worker = spawn_worker(&plan, 0, 0, 1, files, &console, tx).expect("spawn");
        let event = events
            .recv_timeout(Duration::from_secs(120))
            .expect("exit event");
        let status = event.status.expect("status");
        assert_eq!(status.code(), Some(3));
        // Reported but not reaped: still our zombie, so its group id cannot name another group.
        assert_eq!(proc_state(worker.pid), Some('Z'), "pid {}", worker.pid);
        assert!(
            worker.signal_group(0),
            "an unreleased worker's group is signalled"
        );

        worker.release();
        assert!(
            !worker.signal_group(libc::SIGKILL),
            "a released worker's group is never signalled"
        );
        // Reaped once released (generous: a loaded machine).
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while proc_state(worker.pid) == Some('Z') && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_ne!(proc_state(worker.pid), Some('Z'), "reaped after release");
    }

    /// `reap_until(pids, now + wait)` on another thread; `None` if it did not return within
    /// minutes (what a blocking `waitpid` on a process that does not die would do).
    fn reap_in_thread(pids: Vec<libc::pid_t>, wait: Duration) -> Option<Vec<libc::pid_t>> {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(reap_until(&pids, Instant::now() + wait));
        });
        rx.recv_timeout(Duration::from_secs(300)).ok()
    }

    /// The orphans' reaping never blocks on a process that does not die (one stuck in the
    /// kernel outlives SIGKILL; a process never signalled stands in for it here): it gives up
    /// at its deadline and names it. One that dies is reaped.
    #[test]
    fn reaping_gives_up_on_a_process_that_does_not_die_and_reaps_one_that_does() {
        let mut dying = Command::new("sleep").arg("1000").spawn().expect("spawn");
        let mut alive = Command::new("sleep").arg("1000").spawn().expect("spawn");
        let pid = |c: &std::process::Child| libc::pid_t::try_from(c.id()).expect("pid");
        let (dying_pid, alive_pid) = (pid(&dying), pid(&alive));
        // SAFETY: signalling our own, unreaped child.
        unsafe { libc::kill(dying_pid, libc::SIGKILL) };
        let reaped = reap_in_thread(vec![dying_pid], Duration::from_secs(120));
        let gave_up = reap_in_thread(vec![alive_pid], Duration::from_millis(200));
        let _ = alive.kill();
        let _ = alive.wait();
        assert_eq!(reaped, Some(Vec::new()), "the killed process is reaped");
        assert!(dying.try_wait().is_err(), "already reaped, so not waitable");
        assert_eq!(
            gave_up,
            Some(vec![alive_pid]),
            "gives up on the live one at its deadline"
        );
    }
}
