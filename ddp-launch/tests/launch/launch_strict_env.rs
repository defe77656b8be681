//! Issue 45 item 5: every variable the framework reads is parsed strictly. A value that is not
//! valid UTF-8 used to read as "not set" (`std::env::var(..).ok()`), so a worker ran with the
//! default timeout or port and a launcher invented its own token; now each is an error naming
//! the variable.
use crate::launch_common::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// A value no UTF-8 reader accepts.
fn not_utf8() -> &'static OsStr {
    OsStr::from_bytes(b"\xff")
}

/// Asserts a failure (no panic) whose message names `var` and says why. A worker exits with
/// 1 (its `main` returns the error), `ddp-run` with 2 (a usage error).
#[track_caller]
fn assert_names_non_utf8(out: &Finished, var: &str) {
    assert!(!out.status.success(), "{}", out.all());
    out.assert_stderr_has(&format!("{var}: value \"\\xFF\" is not valid UTF-8"));
    assert!(!out.stderr.contains("panicked"), "{}", out.all());
}

#[test]
fn a_worker_refuses_non_utf8_timeout_port_and_token() {
    for var in ["DDP_TIMEOUT_SECS", "MASTER_PORT", "DDP_JOB_TOKEN"] {
        let mut cmd = worker();
        // A one-rank torchrun-style worker: it would run (and succeed) on defaults.
        cmd.env("RANK", "0")
            .env("WORLD_SIZE", "1")
            .env(var, not_utf8());
        let out = run(cmd);
        assert_names_non_utf8(&out, var);
        assert!(
            !out.stdout.contains("ENV "),
            "it must not run\n{}",
            out.all()
        );
    }
}

#[test]
fn the_launcher_refuses_a_non_utf8_token() {
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", "1"])
        .arg(worker_path())
        .env("DDP_JOB_TOKEN", not_utf8());
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", out.all());
    assert_names_non_utf8(&out, "DDP_JOB_TOKEN");
}

#[test]
fn a_timeout_too_large_for_any_integer_is_out_of_range() {
    let mut cmd = worker();
    cmd.env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("DDP_TIMEOUT_SECS", "99999999999999999999");
    let out = run(cmd);
    assert!(!out.status.success(), "{}", out.all());
    out.assert_stderr_has(
        "DDP_TIMEOUT_SECS: '99999999999999999999' is out of range: a timeout is 1..=31536000 seconds",
    );
}
