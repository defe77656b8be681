//! `digits` under a real Open MPI `mpirun`, with no other setup: each process takes its rank
//! from Open MPI's environment, the port and job token come from the job id, and two jobs on
//! one host at once do not collide.
//!
//! Needs `mpirun` (Debian: `apt-get install -y openmpi-bin`), so the tests are `#[ignore]`d by
//! default and `.ci/run` runs them with `--ignored`; without `mpirun` they fail and say so.
use crate::common::clean_command;
use crate::common::job::{assert_trained, finish};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const DIGITS: &str = env!("CARGO_BIN_EXE_digits");

/// `mpirun` from `PATH`, or a failure that says how to install it.
fn mpirun_path() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("mpirun"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "mpirun not found in PATH: these tests run digits under a real Open MPI; \
             install it (Debian/Ubuntu: apt-get install -y openmpi-bin)"
        )
    })
}

/// `mpirun -np 2 digits --checkpoint-dir <dir> <args>`: allowed as root (CI), two processes
/// even on a machine with fewer cores, unbound (the test machine may have one core).
fn mpirun_digits(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = clean_command(mpirun_path().to_str().expect("a UTF-8 path"));
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--bind-to", "none", "-np", "2", DIGITS])
        .arg("--checkpoint-dir")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
#[ignore = "needs Open MPI's mpirun (apt-get install openmpi-bin); .ci/run runs it"]
fn digits_under_mpirun_trains_checkpoints_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    let child = mpirun_digits(&ckpt, &["--epochs", "12"])
        .spawn()
        .expect("starting mpirun");
    let (ok, out, err) = finish(child);
    assert!(ok, "mpirun -np 2 digits failed:\n{out}\n{err}");
    assert_trained(&ckpt, &out, &err, 95.0);
    assert!(err.contains("epoch 12/12"), "{err}");

    // The same command with more epochs resumes (rank 0 reads, rank 1 receives).
    let child = mpirun_digits(&ckpt, &["--epochs", "13"])
        .spawn()
        .expect("starting mpirun");
    let (ok, out, err) = finish(child);
    assert!(ok, "resumed run failed:\n{out}\n{err}");
    assert!(err.contains("12 of 13 epochs done"), "{err}");
    assert!(!err.contains("epoch 12/13"), "{err}");
    assert_trained(&ckpt, &out, &err, 95.0);
}

/// Two `mpirun` jobs at once on one host: each derives its own port and token from its job id
/// (a fixed default port would make the second job's rank 0 fail to bind, and its rank 1 join
/// the first job's store).
#[test]
#[ignore = "needs Open MPI's mpirun (apt-get install openmpi-bin); .ci/run runs it"]
fn two_mpirun_jobs_at_once_do_not_collide() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("a"), tmp.path().join("b")];
    let children: Vec<Child> = dirs
        .iter()
        .map(|d| {
            mpirun_digits(d, &["--epochs", "4"])
                .spawn()
                .expect("starting mpirun")
        })
        .collect();
    for (child, dir) in children.into_iter().zip(&dirs) {
        let (ok, out, err) = finish(child);
        assert!(ok, "{}: failed:\n{out}\n{err}", dir.display());
        assert_trained(dir, &out, &err, 80.0);
    }
}
