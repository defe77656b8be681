//! Starting one worker: its own process group, `PR_SET_PDEATHSIG`, piped output, and a thread
//! that waits for it and reports its exit.

use super::blame::FailureDir;
use super::error::LaunchError;
use super::live::{Console, Stream, follow_reports};
use super::output::{Sink, Tail, pump};
use super::plan::LaunchPlan;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
}

impl Worker {
    /// Sends `sig` to the worker's whole process group (it and anything it started).
    pub(crate) fn signal_group(&self, sig: i32) {
        let Ok(pgid) = libc::pid_t::try_from(self.pid) else {
            return;
        };
        // SAFETY: plain syscall; the group is the worker's own (setpgid in the child), so this
        // cannot reach the launcher or unrelated processes.
        let rc = unsafe { libc::killpg(pgid, sig) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(rank = self.rank, pid = self.pid, sig, %err, "cannot signal worker");
            }
        }
    }
}

/// Where one attempt's workers write: their logs (with `--log-dir`) and failure reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptFiles<'a> {
    /// `--log-dir/attempt_<n>`, if logging to files.
    pub(crate) log_dir: Option<&'a std::path::Path>,
    /// The failure reports (see [`super::blame`]).
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
        .process_group(0);
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
    };
    let fail = |worker: &Worker, source: io::Error| {
        worker.signal_group(libc::SIGKILL);
        LaunchError::Spawn {
            rank,
            program: program.clone(),
            source,
        }
    };

    let log = match files.log_dir {
        Some(dir) => {
            let path = dir.join(format!("rank_{rank}.log"));
            match File::create(&path) {
                Ok(f) => {
                    worker.log_file = Some(path);
                    Some(Arc::new(Mutex::new(f)))
                }
                Err(source) => {
                    worker.signal_group(libc::SIGKILL);
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
    let waiter = std::thread::Builder::new()
        .name(format!("ddp-wait-{rank}"))
        .spawn(move || {
            let status = child.wait();
            // The supervisor may be gone (it only stops listening once every worker is reaped).
            let _ = events.send(ExitEvent { local_rank, status });
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
