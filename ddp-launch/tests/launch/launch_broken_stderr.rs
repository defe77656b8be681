//! A launcher whose stderr is gone (`ddp-run ... 2>&1 | head` after `head` exits) keeps
//! supervising: its own messages are dropped, not a panic.
use crate::launch_common::*;
use std::process::Stdio;
use std::time::Instant;

#[test]
fn closed_stderr_does_not_stop_restarts_or_change_the_exit_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let attempts = dir.path().join("attempts");
    let mut cmd = ddp_run();
    // The default log level, as a user runs it: the launcher's info lines are written too.
    cmd.env_remove("RUST_LOG")
        .env("ATTEMPTS", &attempts)
        .args(["--nproc-per-node", "1", "--max-restarts", "1", "--"])
        .args(["sh", "-c", "echo x >> \"$ATTEMPTS\"; exit 3"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn ddp-run");
    // Close the read end before the launcher writes anything: every write to stderr fails
    // with EPIPE (Rust programs ignore SIGPIPE).
    drop(child.stderr.take());
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ddp-run did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let runs = std::fs::read_to_string(&attempts).unwrap_or_default();
    assert_eq!(runs.lines().count(), 2, "the restart happened: {runs:?}");
    assert_eq!(status.code(), Some(1), "the workers' failure, not a panic");
}
