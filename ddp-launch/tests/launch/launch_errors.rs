//! Clear errors for bad launches, before any worker starts.
use crate::launch_common::*;
use std::net::TcpListener;
use std::process::Command;

#[test]
fn taken_master_port_is_reported_before_any_worker_starts() {
    let taken = TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let cmd = ddp_run_worker(
        &["--nproc-per-node", "2", "--master-port", &port.to_string()],
        &["--mode", "sleep"],
        dir.path(),
    );
    let out = run(cmd);
    assert_usage_error(
        &out,
        &format!(
            "ddp-run: error: port {port} on 0.0.0.0 is already in use: pick another --master-port"
        ),
    );
    assert!(pids_in(dir.path()).is_empty(), "no worker may start");
    drop(taken);
}

#[test]
fn unknown_flag_is_rejected_by_the_parser() {
    let mut cmd = ddp_run();
    cmd.args(["--bogus", "1", "--", "true"]);
    assert_usage_error(&run(cmd), "unexpected argument '--bogus' found");
}

#[test]
fn unparsable_flag_value_is_rejected_with_the_value() {
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", "two", "--", "true"]);
    assert_usage_error(
        &run(cmd),
        "invalid value 'two' for '--nproc-per-node <N|auto>': expected a number of processes or 'auto', got 'two'",
    );
}

/// A duration beyond a year would panic in `Instant::now() + d` when the launcher waits: every
/// duration flag refuses it when parsed, naming the limit.
#[test]
fn absurd_durations_are_usage_errors_naming_the_limit() {
    for flag in [
        "--grace-period",
        "--join-timeout",
        "--rdzv-last-call",
        "--rdzv-heartbeat-timeout",
    ] {
        // `false` fails at once: the launcher then waits the grace period.
        let mut cmd = ddp_run();
        cmd.args([flag, "1e19", "--", "false"]);
        assert_usage_error(
            &run(cmd),
            &format!(
                "invalid value '1e19' for '{flag} <SECS>': 1e19 s is longer than the maximum of 31536000 s (365 days)"
            ),
        );
    }
}

/// `DDP_NODE_TAKEOVER_SECS` is checked when the launcher starts, naming its range.
#[test]
fn a_bad_takeover_grace_is_a_usage_error() {
    for (value, expected) in [
        (
            "1",
            "DDP_NODE_TAKEOVER_SECS: '1' is shorter than the minimum of 4 s",
        ),
        (
            "1e19",
            "DDP_NODE_TAKEOVER_SECS: 1e19 s is longer than the maximum of 31536000 s",
        ),
        (
            "soon",
            "DDP_NODE_TAKEOVER_SECS: expected a number of seconds, got 'soon'",
        ),
    ] {
        let mut cmd = ddp_run();
        cmd.env("DDP_NODE_TAKEOVER_SECS", value)
            .args(["--", "true"]);
        assert_usage_error(&run(cmd), expected);
    }
}

#[test]
fn missing_program_is_a_usage_error() {
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", "2"]);
    assert_usage_error(
        &run(cmd),
        "the following required arguments were not provided",
    );
}

#[test]
fn zero_processes_per_node_is_rejected() {
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", "0", "--", "true"]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: --nproc-per-node must be at least 1, got 0",
    );
}

#[test]
fn zero_processes_per_node_is_rejected_by_the_launch_api_too() {
    let mut cmd = worker();
    cmd.args(["--nproc-per-node", "0"]);
    let out = run(cmd);
    assert!(!out.status.success(), "{}", out.all());
    out.assert_stderr_has("Error: --nproc-per-node must be at least 1, got 0");
}

#[test]
fn program_that_does_not_exist_is_named() {
    let mut cmd = ddp_run();
    cmd.args([
        "--nproc-per-node",
        "2",
        "--",
        "/nonexistent/train",
        "--epochs",
        "3",
    ]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: program '/nonexistent/train' was not found: no such file",
    );

    let mut cmd = ddp_run();
    cmd.args(["--", "no-such-trainer-anywhere"]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: program 'no-such-trainer-anywhere' was not found: no executable 'no-such-trainer-anywhere' in PATH",
    );
}

#[test]
fn directory_as_program_cannot_be_executed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = ddp_run();
    cmd.arg("--").arg(dir.path());
    assert_usage_error(&run(cmd), "cannot be executed: it is a directory");
}

#[test]
fn node_rank_outside_nnodes_is_rejected() {
    let mut cmd = ddp_run();
    cmd.args([
        "--nnodes",
        "2",
        "--node-rank",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
        "--",
        "true",
    ]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: --node-rank 2 is out of range for --nnodes 2 (node ranks are 0..=1)",
    );
}

#[test]
fn multi_node_needs_master_address_port_and_token() {
    let mut cmd = ddp_run();
    cmd.args([
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-port",
        "29500",
        "--",
        "true",
    ]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: --master-addr is required when --nnodes is 2",
    );

    let mut cmd = ddp_run();
    cmd.args([
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--",
        "true",
    ]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: --master-port is required when --nnodes is 2",
    );

    let mut cmd = ddp_run();
    cmd.args([
        "--nnodes",
        "2",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "1",
        "--",
        "true",
    ]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: a multi-node job (--nnodes 2) needs a shared job token: set DDP_JOB_TOKEN",
    );
}

#[test]
fn standalone_contradicting_flags_are_rejected() {
    let mut cmd = ddp_run();
    cmd.args(["--standalone", "--nnodes", "2", "--", "true"]);
    assert_usage_error(
        &run(cmd),
        "ddp-run: error: --standalone runs one node on this host with a free port, but --nnodes 2 was also given",
    );
}

fn two_node_args(node_rank: usize, port: u16, extra: &[&str]) -> Command {
    let mut cmd = ddp_run();
    cmd.env("DDP_JOB_TOKEN", "loopback-secret").args([
        "--nnodes",
        "2",
        "--node-rank",
        &node_rank.to_string(),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        &port.to_string(),
    ]);
    cmd.args(extra);
    cmd
}

#[test]
fn taken_rendezvous_port_on_node_0_is_reported() {
    let taken = TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let out = run(two_node_args(0, port, &["--", "true"]));
    assert_usage_error(
        &out,
        &format!("ddp-run: error: port {port} on 0.0.0.0 is already in use"),
    );
    drop(taken);
}

#[test]
fn node_without_node_0_gives_up_after_the_join_timeout() {
    let port = free_port();
    let out = run(two_node_args(
        1,
        port,
        &["--join-timeout", "1", "--", "true"],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has(&format!(
        "ddp-run: error: rendezvous of node 1 through 127.0.0.1:{port} failed: node 0's launcher did not answer within 1s"
    ));
}

#[test]
fn nodes_with_different_settings_or_tokens_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    // Node 0 waits for node 1 (on the same host, over loopback).
    let mut node0 = two_node_args(0, port, &["--nproc-per-node", "2", "--"]);
    node0
        .arg(worker_path())
        .args(["--mode", "sleep", "--pid-dir"])
        .arg(dir.path());
    let node0 = start(node0);

    // A node with another token cannot prove it: refused, while node 0 keeps waiting (a
    // stranger's connection must not stop a job).
    let mut wrong_token = two_node_args(1, port, &["--nproc-per-node", "2", "--", "true"]);
    wrong_token.env("DDP_JOB_TOKEN", "another-secret");
    let out = run(wrong_token);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has("set the same DDP_JOB_TOKEN on every node");

    let out = run(two_node_args(
        1,
        port,
        &["--nproc-per-node", "1", "--", "true"],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has(
        "node 0 runs with --nnodes 2 --nproc-per-node 2 --max-restarts 0 (rendezvous protocol 2) \
             but this node with --nnodes 2 --nproc-per-node 1 --max-restarts 0 (rendezvous \
             protocol 2): every node must use the same settings",
    );

    // Node 0 stops at once with node 1's reason (issue 45, item 6), having started no worker.
    let out = node0.finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has("node 1 cannot join: node 0 runs with --nnodes 2 --nproc-per-node 2");
    assert!(pids_in(dir.path()).is_empty());
}

#[test]
fn node_0_says_a_node_with_another_token_was_refused_when_the_join_times_out() {
    let port = free_port();
    // Generous: node 1 below must reach node 0 within it, however slow the machine.
    let node0 = start(two_node_args(
        0,
        port,
        &["--join-timeout", "20", "--", "true"],
    ));
    let mut wrong_token = two_node_args(1, port, &["--", "true"]);
    wrong_token.env("DDP_JOB_TOKEN", "another-secret");
    let out = run(wrong_token);
    out.assert_stderr_has("set the same DDP_JOB_TOKEN on every node");
    let out = node0.finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has(
        "only 1 of 2 nodes joined attempt 0 within 20s; meanwhile the rendezvous refused ",
    );
    out.assert_stderr_has("connection(s) that could not prove the job token");
    // And it said so as the connection came.
    out.assert_stderr_has("WARN store: rejected a connection");
}
