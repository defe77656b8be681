//! Helpers shared by the launcher's integration tests: locating `ddp-run` and the
//! `launch_worker` example, running a command with a deadline, and checking pids.
#![allow(dead_code)] // each test file uses a different subset

#[cfg(feature = "etcd")]
pub mod etcd_server;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Generous: the machine running the tests may be loaded.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A TCP port free on every interface now (the OS picks it), for a test's rendezvous or store.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// The `ddp-run` binary built for these tests.
pub fn ddp_run() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ddp-run"));
    ddp_test_support::remove_job_env(&mut cmd);
    cmd
}

/// `ddp-run <launcher_args> -- <launch_worker> <worker_args> --pid-dir <pid_dir>`: the test
/// worker writes its pid files into `pid_dir`.
pub fn ddp_run_worker(launcher_args: &[&str], worker_args: &[&str], pid_dir: &Path) -> Command {
    let mut cmd = ddp_run();
    cmd.args(launcher_args)
        .arg("--")
        .arg(worker_path())
        .args(worker_args)
        .arg("--pid-dir")
        .arg(pid_dir);
    cmd
}

/// The `launch_worker` example (built by `cargo test`, which builds examples).
pub fn worker_path() -> PathBuf {
    example_path("launch_worker")
}

/// ddp-launch's example `name` (built by `cargo test`, which builds examples); a missing or stale
/// build is a failure saying how to build it.
pub fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("examples").join(name))
        .expect("target directory");
    let hint = "run `cargo test -p ddp-launch` (which builds examples) or `cargo build -p ddp-launch --examples`";
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}: {hint}", path.display()));
    // `cargo test --test <name>` alone does not rebuild examples: refuse a stale one.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    if let Ok(edited) = std::fs::metadata(&source).and_then(|m| m.modified()) {
        assert!(
            edited <= built,
            "{} is older than its source: {hint}",
            path.display()
        );
    }
    path
}

/// ddp-launch's example `name`, run directly (it launches itself) in a clean environment.
pub fn example(name: &str) -> Command {
    let mut cmd = Command::new(example_path(name));
    ddp_test_support::remove_job_env(&mut cmd);
    cmd
}

/// The `launch_worker` example run directly (it launches itself).
pub fn worker() -> Command {
    example("launch_worker")
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn all(&self) -> String {
        format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        )
    }

    /// Asserts that stderr contains `text`, showing everything the command printed if not.
    #[track_caller]
    pub fn assert_stderr_has(&self, text: &str) {
        assert!(
            self.stderr.contains(text),
            "expected {text:?} on stderr\n{}",
            self.all()
        );
    }
}

/// A started command whose output is being collected.
pub struct Running {
    pub child: Child,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
}

pub fn start(mut cmd: Command) -> Running {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut o = child.stdout.take().expect("stdout");
    let mut e = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = o.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = e.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    Running {
        child,
        out: Some(out),
        err: Some(err),
    }
}

impl Running {
    /// The collected output, once the command has exited.
    fn output(&mut self) -> (String, String) {
        let join = |h: Option<std::thread::JoinHandle<String>>| {
            h.and_then(|h| h.join().ok()).unwrap_or_default()
        };
        (join(self.out.take()), join(self.err.take()))
    }

    /// Waits up to [`DEADLINE`]; kills the command and fails the test if it takes longer.
    pub fn finish(mut self) -> Finished {
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let (stdout, stderr) = self.output();
                let f = Finished {
                    status: ExitStatus::default(),
                    stdout,
                    stderr,
                };
                panic!("command did not finish within {DEADLINE:?}\n{}", f.all());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (stdout, stderr) = self.output();
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

/// Runs `cmd` to completion (at most [`DEADLINE`]).
pub fn run(cmd: Command) -> Finished {
    start(cmd).finish()
}

/// Pids written as `*.pid` files in `dir`, with their file names.
pub fn pids_in(dir: &Path) -> Vec<(String, i32)> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read pid dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "pid") {
            let text = std::fs::read_to_string(&path).expect("read pid");
            let pid = text.trim().parse().expect("pid number");
            let name = path
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned();
            pids.push((name, pid));
        }
    }
    pids.sort();
    pids
}

/// Waits until `dir` holds at least `n` pid files written by the workers of `launcher`.
pub fn wait_for_pids(dir: &Path, n: usize, launcher: &mut Running) -> Vec<(String, i32)> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let pids = pids_in(dir);
        if pids.len() >= n {
            return pids;
        }
        if launcher.child.try_wait().expect("try_wait").is_some() {
            let (stdout, stderr) = launcher.output();
            panic!(
                "the launcher exited before {n} workers started ({pids:?})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} pid files after {DEADLINE:?}: {pids:?}",
            pids.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `pid` is a live process: `kill(pid, 0)` does not fail with ESRCH, and it is not a
/// zombie (a zombie has exited; only its parent's bookkeeping remains).
pub fn is_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// How long [`assert_all_gone`] waits for processes to die: a SIGKILL is delivered
/// asynchronously and `PR_SET_PDEATHSIG` fires as the launcher dies, which a busy machine may
/// delay. The workers it checks sleep until killed, so an orphan still fails the test.
pub const GONE_WITHIN: Duration = Duration::from_secs(15);

/// Asserts that none of `pids` is alive within [`GONE_WITHIN`]; kills the survivors and fails
/// otherwise.
#[track_caller]
pub fn assert_all_gone(pids: &[(String, i32)]) {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let alive: Vec<_> = pids.iter().filter(|(_, p)| is_alive(*p)).collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            kill_all(pids);
            panic!("processes still alive after the launcher exited: {alive:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills every listed process, for cleanup after a failed assertion.
pub fn kill_all(pids: &[(String, i32)]) {
    for (_, pid) in pids {
        // SAFETY: plain syscall on pids this test's processes wrote.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
}

/// A usage error: exit code 2, `expected` on stderr, and no panic.
#[track_caller]
pub fn assert_usage_error(out: &Finished, expected: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", out.all());
    out.assert_stderr_has(expected);
    assert!(!out.stderr.contains("panicked"), "{}", out.all());
}
