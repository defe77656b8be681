//! Issue 45 item 7: a worker count the host cannot run, a port held on one address, and the
//! failure directories a SIGKILLed launcher leaves behind.
use crate::launch_common::*;
use std::net::TcpListener;

#[test]
fn nproc_per_node_far_beyond_the_cores_is_refused_before_any_worker_starts() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = (cores * 32 + 1).to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", &n, "--"])
        .arg(worker_path())
        .args(["--mode", "sleep", "--pid-dir"])
        .arg(dir.path());
    let out = run(cmd);
    assert_usage_error(
        &out,
        &format!("--nproc-per-node {n} is more than 32 workers per CPU core ({cores} cores here"),
    );
    out.assert_stderr_has("--oversubscribe");
    assert!(pids_in(dir.path()).is_empty(), "no worker may start");
}

#[test]
fn a_port_held_on_loopback_is_reported_on_loopback() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let mut cmd = ddp_run();
    cmd.args(["--master-port", &port.to_string(), "--"])
        .arg(worker_path());
    let out = run(cmd);
    assert_usage_error(
        &out,
        &format!("ddp-run: error: port {port} on 127.0.0.1 is already in use"),
    );
    drop(taken);
}

/// A pid no process can have: above the kernel's maximum.
fn impossible_pid() -> u64 {
    let max = std::fs::read_to_string("/proc/sys/kernel/pid_max").expect("pid_max");
    max.trim().parse::<u64>().expect("a number") + 1
}

#[test]
fn failure_dirs_of_dead_launchers_are_removed_at_the_next_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // What a SIGKILLed launcher leaves, and what a running one (this test process) owns.
    let dead = tmp
        .path()
        .join(format!("ddp-run-{}-0-00000000deadbeef", impossible_pid()));
    let live = tmp
        .path()
        .join(format!("ddp-run-{}-0-00000000cafef00d", std::process::id()));
    let unrelated = tmp.path().join("ddp-run-notes");
    for d in [&dead, &live, &unrelated] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let mut cmd = ddp_run();
    cmd.env("TMPDIR", tmp.path())
        .args(["--nproc-per-node", "1", "--"])
        .arg(worker_path());
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.all());
    assert!(
        !dead.exists(),
        "a dead launcher's directory stays\n{}",
        out.all()
    );
    assert!(live.exists(), "a live launcher's directory was removed");
    assert!(unrelated.exists(), "a directory not ours was removed");
    // The launcher removed its own too.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read tmp")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}
