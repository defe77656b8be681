//! `--max-restarts` with checkpoints: a worker killed mid-training is restarted with the group,
//! training resumes from the last checkpoint, and the final parameters equal an uninterrupted
//! run's, bitwise.

use std::path::Path;

fn run(dir: &Path, name: &str, extra: &[&str], tail: &[&str]) -> (bool, String, Vec<u8>) {
    let ckpt = dir.join(format!("{name}-ckpt"));
    let out = dir.join(format!("{name}.bin"));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_restart_resume"));
    ddp_test_support::remove_job_env(&mut cmd);
    if !extra.contains(&"--nproc-per-node") {
        cmd.args(["--nproc-per-node", "2"]);
    }
    let output = cmd
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

/// A random rank SIGKILLed at a random step (seeded; the seed, rank and step are printed) is
/// restarted with the group, and the job ends bitwise like the uninterrupted run, for several
/// seeds.
#[test]
fn a_random_rank_killed_at_a_random_step_ends_bitwise_like_an_uninterrupted_run() {
    use rand::{Rng, SeedableRng};
    const WORLD: usize = 3;
    // 48 samples, 3 ranks, batch 4: 4 steps per epoch, 4 epochs.
    const STEPS: u64 = 16;
    let dir = tempfile::tempdir().unwrap();
    let nproc = ["--nproc-per-node", "3"];
    let (ok, text, uninterrupted) = run(dir.path(), "plain", &nproc, &[]);
    assert!(ok, "uninterrupted run failed:\n{text}");
    assert!(!uninterrupted.is_empty());
    for seed in [1u64, 2, 3, 4] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let rank = rng.random_range(0..WORLD);
        let step = rng.random_range(0..STEPS);
        println!("seed {seed}: rank {rank} is killed at step {step}");
        let (rank_s, step_s) = (rank.to_string(), step.to_string());
        let name = format!("killed-{seed}");
        let args = [&nproc[..], &["--max-restarts", "1", "--kill-rank", &rank_s]].concat();
        let (ok, text, restarted) = run(dir.path(), &name, &args, &[&step_s]);
        assert!(ok, "seed {seed}: the restarted job must finish:\n{text}");
        assert!(
            text.contains(&format!("first failure: rank {rank} ")) && text.contains("SIGKILL"),
            "seed {seed}: the kill is reported:\n{text}"
        );
        assert!(
            text.contains("restarting every worker"),
            "seed {seed}: restarted:\n{text}"
        );
        assert!(
            restarted == uninterrupted,
            "seed {seed} (rank {rank}, step {step}): final parameters differ from the uninterrupted run:\n{text}"
        );
    }
}
