//! `--fresh` with `--max-restarts`: the first attempt starts over, a restart resumes the
//! checkpoints this launch wrote (never starts over again, never resumes an older run), and the
//! final weights equal an uninterrupted run's, bitwise.
use crate::common::{Tensor, clean_command, latest, latest_model, output, step_of, worker_pids};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DIGITS: &str = env!("CARGO_BIN_EXE_digits");
/// Generous: the machine running the tests may be loaded.
const DEADLINE: Duration = Duration::from_secs(300);

/// `digits` on 2 ranks with a small batch (90 steps per epoch and rank), checkpoints in `dir`.
fn digits(dir: &Path, epochs: usize, extra: &[&str]) -> Command {
    let mut cmd = clean_command(DIGITS);
    cmd.args(["--nproc-per-node", "2", "--batch-size", "8", "--epochs"])
        .arg(epochs.to_string())
        .arg("--checkpoint-dir")
        .arg(dir)
        .args(extra);
    cmd
}

/// A finished older run in `dir` with other settings (other weights), which `--fresh` must set
/// aside: resuming it instead of this launch's checkpoints changes the final weights.
fn older_run(dir: &Path) -> String {
    let mut cmd = clean_command(DIGITS);
    cmd.args([
        "--nproc-per-node",
        "2",
        "--epochs",
        "1",
        "--batch-size",
        "16",
    ])
    .args(["--lr", "0.02", "--checkpoint-dir"])
    .arg(dir);
    let (ok, out, err) = output(cmd);
    assert!(ok, "the older run failed:\n{out}\n{err}");
    latest(dir).expect("the older run left a checkpoint")
}

/// The weights an uninterrupted `--fresh` run of `epochs` ends with.
fn uninterrupted(dir: &Path, epochs: usize) -> BTreeMap<String, Tensor> {
    let (ok, out, err) = output(digits(dir, epochs, &["--fresh"]));
    assert!(ok, "the uninterrupted run failed:\n{out}\n{err}");
    latest_model(dir).1
}

#[test]
fn fresh_run_killed_mid_run_resumes_its_own_checkpoint_and_ends_like_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let epochs = 12;
    let reference = uninterrupted(&tmp.path().join("reference"), epochs);
    let ckpt = tmp.path().join("ckpt");
    let older = older_run(&ckpt);
    assert!(
        latest_model(&ckpt).1 != reference,
        "the older run must end elsewhere, or resuming it would go unnoticed"
    );

    let mut launcher = digits(&ckpt, epochs, &["--fresh", "--max-restarts", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting digits");
    // Kill rank 1 as soon as this launch has a checkpoint after a finished epoch.
    let start = Instant::now();
    let killed = loop {
        if let Some(name) = latest(&ckpt).filter(|n| *n != older && step_of(n) > 0) {
            let pids = worker_pids(launcher.id(), 1);
            assert_eq!(pids.len(), 1, "rank 1 of the first attempt: {pids:?}");
            // SAFETY: plain syscall on the worker this test's launcher started.
            assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
            break name;
        }
        if let Some(status) = launcher.try_wait().expect("try_wait") {
            let out = launcher.wait_with_output().expect("output");
            panic!(
                "digits ended ({status}) before it could be killed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(start.elapsed() < DEADLINE, "no checkpoint of this launch");
        std::thread::sleep(Duration::from_millis(2));
    };
    let out = launcher.wait_with_output().expect("waiting for digits");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "the restarted job must finish:\n{all}"
    );
    assert!(
        stderr.contains("SIGKILL") && stderr.contains("restarting every worker (restart 1 of 1)"),
        "rank 1 was killed and the group restarted:\n{all}"
    );
    assert_eq!(
        stderr.matches("--fresh: starting over").count(),
        1,
        "--fresh applies to the first attempt only:\n{all}"
    );
    assert!(
        stderr.contains("restart 1 of this launch: resuming its checkpoints"),
        "{all}"
    );
    // The restart resumed a checkpoint of this launch at or after the one seen before the kill.
    let resumed = stderr
        .split("resuming from ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("the restart did not resume:\n{all}"));
    let resumed_name = Path::new(resumed)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a checkpoint path");
    assert!(
        step_of(resumed_name) >= step_of(&killed) && resumed_name != older,
        "resumed {resumed_name}, killed after {killed} (older run: {older}):\n{all}"
    );
    assert_eq!(
        stderr.matches(&format!("epoch 1/{epochs}:")).count(),
        1,
        "epoch 1 ran in the first attempt; the restart must not run it again:\n{all}"
    );
    let (_, restarted) = latest_model(&ckpt);
    assert!(
        restarted == reference,
        "final weights differ from the uninterrupted run's:\n{all}"
    );
}

/// A `--fresh` start in a directory holding an older run makes `latest` name this run from its
/// first step (a step-0 checkpoint), so a run that stops before its first epoch's checkpoint is
/// resumed as itself, not as the older run.
#[test]
fn fresh_start_over_an_older_run_commits_its_initial_state() {
    let tmp = tempfile::tempdir().unwrap();
    let epochs = 2;
    let reference = uninterrupted(&tmp.path().join("reference"), epochs);
    let ckpt = tmp.path().join("ckpt");
    let older = older_run(&ckpt);
    assert!(
        latest_model(&ckpt).1 != reference,
        "the older run must end elsewhere, or resuming it would go unnoticed"
    );

    // Zero epochs: the fresh run stops right after starting.
    let (ok, out, err) = output(digits(&ckpt, 0, &["--fresh"]));
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        latest(&ckpt).as_deref(),
        Some("step-0000000000"),
        "older run {older}:\n{err}"
    );
    // Resuming it (no --fresh) runs this run's epochs from the start.
    let (ok, out, err) = output(digits(&ckpt, epochs, &[]));
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains("step-0000000000: 0 of 2 epochs done, step 0"),
        "{err}"
    );
    assert!(
        latest_model(&ckpt).1 == reference,
        "final weights differ from the uninterrupted run's:\n{err}"
    );
}
