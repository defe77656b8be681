//! Issue 45 item 7: a worker count the host cannot run, a port held on one address, and the
//! failure directories a SIGKILLed launcher leaves behind.
use crate::launch_common::*;
use std::net::TcpListener;

#[test]
fn nproc_per_node_far_beyond_the_cores_is_refused_before_any_worker_starts() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = (cores * 32 + 1).to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let cmd = ddp_run_worker(&["--nproc-per-node", &n], &["--mode", "sleep"], dir.path());
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

/// What the launcher puts in its failure directories' names to mark them as this host's (see
/// `host_marker` in supervise/blame.rs): the boot id and the PID namespace on Linux.
fn host_marker() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot_id");
    let ns = std::fs::read_link("/proc/self/ns/pid").expect("pid namespace");
    let ns: String = ns
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    format!("{}.{ns}", boot.trim().replace('-', ""))
}

/// The directories a SIGKILLed launcher of this host leaves are removed; those of other hosts
/// sharing the temporary directory (whose pids mean nothing here), and those of earlier
/// launchers (no host in the name), stay.
#[test]
fn failure_dirs_of_dead_launchers_are_removed_at_the_next_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let marker = host_marker();
    let dead_pid = impossible_pid();
    // What a SIGKILLed launcher leaves, and what a running one (this test process) owns.
    let dead = tmp
        .path()
        .join(format!("ddp-run-{marker}-{dead_pid}-0-00000000deadbeef"));
    let live = tmp.path().join(format!(
        "ddp-run-{marker}-{}-0-00000000cafef00d",
        std::process::id()
    ));
    // Another host's launcher, whose pid does not exist here; and an earlier launcher's.
    let other_host = tmp.path().join(format!(
        "ddp-run-0123456789abcdef0123456789abcdef.1-{dead_pid}-0-00000000deadbeef"
    ));
    let old_format = tmp
        .path()
        .join(format!("ddp-run-{dead_pid}-0-00000000deadbeef"));
    let unrelated = tmp.path().join("ddp-run-notes");
    for d in [&dead, &live, &other_host, &old_format, &unrelated] {
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
    assert!(other_host.exists(), "another host's directory was removed");
    assert!(
        old_format.exists(),
        "an earlier launcher's directory was removed"
    );
    assert!(unrelated.exists(), "a directory not ours was removed");
    // The launcher removed its own too.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read tmp")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left.len(), 4, "{left:?}");
}

/// `--max-restarts 4294967295` (u32::MAX): the failure summary counts the attempts without
/// overflowing, and the restart happens.
#[test]
fn the_largest_max_restarts_is_reported_and_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("failed-once");
    let mut cmd = ddp_run();
    // Fails on the first attempt only.
    cmd.args(["--max-restarts", "4294967295", "--", "sh", "-c"])
        .arg("test -e \"$0\" && exit 0; touch \"$0\"; echo failing once; exit 3")
        .arg(&marker);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", out.all());
    out.assert_stderr_has("attempt:       1 of 4294967296 (--max-restarts 4294967295)");
    out.assert_stderr_has("restarting every worker (restart 1 of 4294967295)");
    assert!(!out.stderr.contains("panicked"), "{}", out.all());
}
