//! The launcher is a child subreaper: a process a worker started that left the worker's
//! process group (`setsid`) and outlived the worker is reparented to the launcher, which kills
//! it when the attempt ends, so it does not outlive the launcher (issue 29).
use crate::launch_common::*;
use std::time::{Duration, Instant};

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

/// The launcher reaps, while the attempt runs, what a worker's short-lived helpers leave
/// behind (a `(cmd &)` per checkpoint, say): reparented to it as the child subreaper, each would
/// otherwise stay a zombie until the attempt ends and count against the process limit.
#[test]
fn exited_helpers_of_a_worker_are_reaped_while_it_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let forked = dir.path().join("forked");
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", "1", "--", "sh", "-c"])
        .arg("for i in $(seq 40); do (true &); done; touch \"$1\"; sleep 120")
        .arg("sh")
        .arg(&forked);
    let mut launcher = start(cmd);
    let launcher_pid = launcher.child.id();
    let deadline = Instant::now() + DEADLINE;
    while !forked.exists() {
        assert!(
            Instant::now() < deadline,
            "the worker never forked its helpers"
        );
        assert!(
            launcher.child.try_wait().expect("try_wait").is_none(),
            "the launcher exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every helper has exited or soon will: the worker must become the launcher's only child,
    // with no zombie beside it.
    let children = loop {
        let children = children_of(launcher_pid);
        if children.len() == 1 || Instant::now() > deadline {
            break children;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = launcher.child.kill();
    let _ = launcher.child.wait();
    assert_eq!(
        children.len(),
        1,
        "the launcher's children (states) after {DEADLINE:?}: {children:?}"
    );
}

/// The states (`R`, `S`, `Z`...) of the children of `parent`, from `/proc/<pid>/stat`.
fn children_of(parent: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| {
            // `pid (comm) state ppid ...`: comm may hold spaces, so split after its ')'.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let mut fields = after.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next().and_then(|p| p.parse::<u32>().ok())?;
            (ppid == parent).then(|| state.to_string())
        })
        .collect()
}
