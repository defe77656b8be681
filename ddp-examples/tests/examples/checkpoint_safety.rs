//! The checkpoint directory's safety rules, end to end with `digits`:
//! - a restart of a `--fresh` launch whose first attempt died before it started over does not
//!   resume an older run: it starts over itself (and a later restart of the same launch
//!   resumes what it wrote);
//! - a second job on a directory another job holds fails naming the holder, and `--fresh`
//!   removes nothing;
//! - resuming a checkpoint with more epochs than `--epochs` says so instead of "N of N".
//!
//! The restarts run `digits` as a worker directly (one rank), with the variables ddp-run sets
//! for a restart, so the "died before starting over" case is exact rather than a race.
use crate::common::{clean_command, latest, output, step_of};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::Command;

const DIGITS: &str = env!("CARGO_BIN_EXE_digits");

/// A finished 1-epoch run of 2 ranks in `dir`; returns its latest checkpoint.
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

/// `digits` as the single worker of attempt `restart` of launch `launch`, as ddp-run starts it.
fn worker(dir: &Path, launch: &str, restart: u32, epochs: usize, extra: &[&str]) -> Command {
    worker_of(DIGITS, dir, launch, restart, epochs, extra)
}

/// Example `bin` as the single worker of attempt `restart` of launch `launch`.
fn worker_of(
    bin: &str,
    dir: &Path,
    launch: &str,
    restart: u32,
    epochs: usize,
    extra: &[&str],
) -> Command {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut cmd = clean_command(bin);
    cmd.envs([
        ("DDP_LAUNCH_WORKER", "1"),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("DDP_LAUNCH_ID", launch),
    ])
    .env("MASTER_PORT", port.to_string())
    .env("DDP_RESTART_COUNT", restart.to_string())
    .args(["--batch-size", "16", "--epochs"])
    .arg(epochs.to_string())
    .arg("--checkpoint-dir")
    .arg(dir)
    .args(extra);
    cmd
}

#[test]
fn a_fresh_restart_never_resumes_an_older_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ckpt = tmp.path().join("ckpt");
    let older = older_run(&ckpt);

    // Restart 1 of launch A, whose first attempt died before it started over.
    let (ok, out, err) = output(worker(&ckpt, "launch-A", 1, 2, &["--fresh"]));
    assert!(ok, "{out}\n{err}");
    assert!(
        !err.contains("resuming from"),
        "the older run ({older}) must not be resumed:\n{err}"
    );
    assert!(
        err.contains("stopped before it had started over")
            && err.contains("--fresh: starting over"),
        "{err}"
    );
    assert!(err.contains("epoch 1/2:"), "epoch 1 ran again:\n{err}");

    // Restart 2 of the same launch resumes what launch A wrote.
    let ours = latest(&ckpt).expect("launch A saved");
    let (ok, out, err) = output(worker(&ckpt, "launch-A", 2, 3, &["--fresh"]));
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains("restart 2 of this launch: resuming its checkpoints")
            && err.contains(&format!("{ours}: 2 of 3 epochs done")),
        "{err}"
    );

    // A restart of another --fresh launch that never started over does not resume launch A's.
    let (ok, out, err) = output(worker(&ckpt, "launch-B", 1, 1, &["--fresh"]));
    assert!(ok, "{out}\n{err}");
    assert!(
        !err.contains("resuming from") && err.contains("--fresh: starting over"),
        "{err}"
    );
}

/// The same rule for the transformer's fully sharded checkpoints (`--shard full`).
#[test]
fn a_fresh_restart_of_a_fully_sharded_run_never_resumes_an_older_run() {
    const TRANSFORMER: &str = env!("CARGO_BIN_EXE_transformer");
    let tmp = tempfile::tempdir().expect("tempdir");
    let ckpt = tmp.path().join("ckpt");
    let small = [
        "--shard",
        "full",
        "--train-size",
        "64",
        "--test-size",
        "32",
        "--d-model",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
    ];
    let run = |launch: &str, restart: u32, epochs: usize, fresh: bool| {
        let mut extra = small.to_vec();
        if fresh {
            extra.push("--fresh");
        }
        let (ok, out, err) = output(worker_of(
            TRANSFORMER,
            &ckpt,
            launch,
            restart,
            epochs,
            &extra,
        ));
        assert!(ok, "{out}\n{err}");
        err
    };
    // An older run of 1 epoch (attempt 0 of another launch, without --fresh).
    run("older", 0, 1, false);
    // Restart 1 of launch A, whose first attempt died before it started over.
    let err = run("launch-A", 1, 1, true);
    assert!(
        !err.contains("resuming from")
            && err.contains("stopped before it had started over")
            && err.contains("--fresh: starting over"),
        "{err}"
    );
    // Restart 2 of the same launch resumes what launch A wrote.
    let err = run("launch-A", 2, 2, true);
    assert!(
        err.contains("restart 2 of this launch: resuming its checkpoints")
            && err.contains("resuming from"),
        "{err}"
    );
}

#[test]
fn a_second_job_is_refused_and_fresh_removes_nothing_while_another_job_holds_the_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ckpt = tmp.path().join("ckpt");
    let older = older_run(&ckpt);
    // Another job holds the directory, as its rank 0 does (an flock on `lock` and its name).
    let mut lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(ckpt.join("lock"))
        .expect("lock file");
    lock.lock().expect("lock");
    lock.write_all(b"host otherhost, pid 4242, started 2026-01-01 00:00:00 UTC\n")
        .expect("write");

    let mut cmd = clean_command(DIGITS);
    cmd.args(["--nproc-per-node", "2", "--epochs", "1", "--fresh"])
        .arg("--checkpoint-dir")
        .arg(&ckpt);
    let (ok, out, err) = output(cmd);
    assert!(!ok, "the second job must fail:\n{out}\n{err}");
    assert!(
        err.contains("in use by another job") && err.contains("host otherhost, pid 4242"),
        "the error names the holder:\n{err}"
    );
    assert_eq!(latest(&ckpt).as_deref(), Some(older.as_str()), "{err}");
    assert!(
        ckpt.join(&older).join("model.safetensors").is_file(),
        "--fresh removed nothing:\n{err}"
    );
    drop(lock);
}

#[test]
fn resuming_more_epochs_than_asked_says_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ckpt = tmp.path().join("ckpt");
    let older = older_run(&ckpt);
    assert!(step_of(&older) > 0);
    let mut cmd = clean_command(DIGITS);
    cmd.args([
        "--nproc-per-node",
        "2",
        "--epochs",
        "0",
        "--batch-size",
        "16",
    ])
    .args(["--lr", "0.02", "--checkpoint-dir"])
    .arg(&ckpt);
    let (ok, out, err) = output(cmd);
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains("1 epochs done, more than --epochs 0: none left to run")
            && !err.contains("0 of 0 epochs done"),
        "{err}"
    );
}
