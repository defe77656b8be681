//! `--log-dir`: each launch writes under a directory of its own, so a later launch with the
//! same `--log-dir` leaves the earlier one's logs alone (as torchrun's `log_dir/<run id>_*`).
use crate::launch_common::*;
use std::path::Path;

/// The text of every `rank_0.log` under `dir`, sorted.
fn rank_0_logs(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read log dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.file_name().is_some_and(|n| n == "rank_0.log") {
                found.push(std::fs::read_to_string(&path).expect("read log"));
            }
        }
    }
    found.sort();
    found
}

/// `ddp-run --log-dir DIR` running `echo WORD`, with `launch_id` in its environment if given.
fn echo_into(dir: &Path, word: &str, launch_id: Option<&str>) -> Finished {
    let mut cmd = ddp_run();
    cmd.env("RUST_LOG", "ddp_launch=info,warn")
        .arg("--log-dir")
        .arg(dir)
        .args(["--nproc-per-node", "1", "--", "sh", "-c"])
        .arg(format!("echo {word}"));
    if let Some(id) = launch_id {
        cmd.env("DDP_LAUNCH_ID", id);
    }
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.all());
    out
}

#[test]
fn a_second_launch_into_the_same_log_dir_keeps_the_first_launchs_logs() {
    let logs = tempfile::tempdir().expect("tempdir");
    echo_into(logs.path(), "first", None);
    echo_into(logs.path(), "second", None);
    assert_eq!(rank_0_logs(logs.path()), ["first\n", "second\n"]);
}

#[test]
fn logs_go_under_the_launch_id_which_the_launcher_names() {
    let logs = tempfile::tempdir().expect("tempdir");
    let out = echo_into(logs.path(), "one", Some("job-a"));
    let attempt = logs.path().join("job-a").join("attempt_0");
    out.assert_stderr_has(&attempt.display().to_string());
    let log = attempt.join("rank_0.log");
    assert_eq!(
        std::fs::read_to_string(&log).expect("rank 0's log"),
        "one\n"
    );
    // A launch id set again on purpose (the same launch, as far as checkpoints go) adds to
    // the logs rather than truncating them.
    echo_into(logs.path(), "two", Some("job-a"));
    assert_eq!(
        std::fs::read_to_string(&log).expect("rank 0's log"),
        "one\ntwo\n"
    );
}
