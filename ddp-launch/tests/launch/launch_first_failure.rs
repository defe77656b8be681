//! Issue 45 item 4: the failure summary names the rank that failed first, with its own error,
//! even when a peer that failed because of it exited first.
use crate::launch_common::*;

#[test]
fn the_rank_that_failed_is_first_with_its_error_though_its_victim_exited_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Rank 0 fails on its own; rank 1, waiting for it in an all_reduce, fails because of it.
    let cmd = ddp_run_worker(
        &["--nproc-per-node", "2"],
        &["--mode", "fail-rank0"],
        dir.path(),
    );
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has("first failure: rank 0 (local rank 0 on node 0, pid");
    // Rank 0 printed its own error before its peer could be stopped.
    out.assert_stderr_has(
        "[rank 0]: ddp worker: rank 0: training failed: simulated checkpoint failure: checkpoint dir is read-only",
    );
    assert!(
        !out.stderr.contains("first failure: rank 1"),
        "rank 1 only failed because of rank 0\n{}",
        out.all()
    );
    let pids = pids_in(dir.path());
    assert_eq!(pids.len(), 2, "both ranks ran: {pids:?}");
    assert_all_gone(&pids);
}
