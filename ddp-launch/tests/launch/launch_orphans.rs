//! The launcher is a child subreaper: a process a worker started that left the worker's
//! process group (`setsid`) and outlived the worker is reparented to the launcher, which kills
//! it when the attempt ends, so it does not outlive the launcher (issue 29).
use crate::launch_common::*;

#[test]
fn a_grandchild_that_left_the_workers_process_group_does_not_outlive_the_launcher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("orphan.pid");
    let mut cmd = ddp_run();
    // The worker starts `sleep` in a new session (out of reach of killpg on the worker's
    // group), records its pid, and exits successfully right away.
    cmd.args(["--nproc-per-node", "1", "--", "sh", "-c"])
        .arg("setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > \"$0\"")
        .arg(&pid_file);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", out.all());
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid");
    // The launcher killed and reaped it before exiting; the grace only absorbs a loaded
    // machine (a surviving `sleep 600` fails the test either way, and is killed).
    assert_all_gone(&[("setsid sleep".to_string(), pid)]);
}
