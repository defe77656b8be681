//! `--max-restarts` with checkpoints: a worker killed mid-training is restarted with the group,
//! training resumes from the last checkpoint, and the final parameters equal an uninterrupted
//! run's, bitwise.

use std::path::{Path, PathBuf};
use std::process::Command;

fn program() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("examples").join("restart_resume"))
        .expect("target directory");
    assert!(
        path.exists(),
        "{} is missing: run `cargo test -p ddp-core` (which builds examples)",
        path.display()
    );
    path
}

fn run(dir: &Path, name: &str, extra: &[&str], tail: &[&str]) -> (bool, String, Vec<u8>) {
    let ckpt = dir.join(format!("{name}-ckpt"));
    let out = dir.join(format!("{name}.bin"));
    let mut cmd = Command::new(program());
    for (k, _) in std::env::vars() {
        if k.starts_with("DDP_") || k == "RANK" || k == "WORLD_SIZE" || k.starts_with("MASTER_") {
            cmd.env_remove(k);
        }
    }
    let output = cmd
        .args(["--nproc-per-node", "2"])
        .args(extra)
        .arg("--")
        .arg(&ckpt)
        .arg(&out)
        .args(tail)
        .output()
        .expect("starting restart_resume");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (
        output.status.success(),
        text,
        std::fs::read(&out).unwrap_or_default(),
    )
}

#[test]
fn killed_worker_is_restarted_and_training_ends_exactly_like_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text, uninterrupted) = run(dir.path(), "plain", &[], &[]);
    assert!(ok, "uninterrupted run failed:\n{text}");
    assert!(!uninterrupted.is_empty());

    // 48 samples, 2 ranks, batch 4: 6 steps per epoch; step 9 is in the middle of epoch 2.
    let (ok, text, restarted) = run(dir.path(), "killed", &["--max-restarts", "1"], &["9"]);
    assert!(ok, "the restarted job must finish:\n{text}");
    assert!(text.contains("SIGKILL"), "the failure is reported:\n{text}");
    assert!(
        text.contains("RESUMED attempt=1 epoch=1 step=6"),
        "resumed from the epoch-1 checkpoint:\n{text}"
    );
    assert_eq!(
        restarted, uninterrupted,
        "final parameters differ from the uninterrupted run"
    );
}

#[test]
fn without_restarts_the_killed_job_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text, _) = run(dir.path(), "killed", &[], &["3"]);
    assert!(!ok, "must fail:\n{text}");
    assert!(
        text.contains("rank 1") && text.contains("SIGKILL"),
        "{text}"
    );
}
