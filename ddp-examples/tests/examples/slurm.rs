//! `digits` under a real Slurm: the test starts a one-node cluster (munged, slurmctld, slurmd;
//! see `slurm/cluster.rs`), runs `srun -N1 -n2 digits` (each task takes its rank, world size,
//! rank 0's host and the port from Slurm's environment) and an `sbatch` script that starts the
//! job with `ddp-run`, as the README's recipes do.
//!
//! Needs Slurm and munge (Debian: `apt-get install -y slurm-wlm munge`) and root, so it is
//! `#[ignore]`d by default; `.ci/run` runs it with `--ignored`. Without them it fails and says so,
//! and a daemon that cannot start fails it with the daemon's log.

mod cluster;

use crate::common::job::{assert_trained, finish};
use crate::common::percent_after;
use cluster::Cluster;
use std::path::{Path, PathBuf};
use std::process::Stdio;

const DIGITS: &str = env!("CARGO_BIN_EXE_digits");

/// `ddp-run`, built by cargo into the target directory `digits` is in (cargo builds only this
/// package's binaries for its tests; the build is a no-op when it is up to date).
fn ddp_run() -> PathBuf {
    let profile_dir = Path::new(DIGITS)
        .parent()
        .expect("digits is in a directory");
    let target_dir = profile_dir.parent().expect("a profile directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("unexpected target layout: {DIGITS}"),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(&cargo)
        .args(["build", "--quiet", "-p", "ddp-launch", "--bin", "ddp-run"])
        .args(["--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running {cargo} to build ddp-run: {e}"));
    assert!(
        out.status.success(),
        "building ddp-run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir.join("ddp-run")
}

/// Both ways into the cluster in one test: starting the daemons is the slow part.
#[test]
#[ignore = "needs Slurm and munge, as root (apt-get install slurm-wlm munge); .ci/run runs it"]
fn digits_under_srun_and_sbatch_with_ddp_run() {
    let ddp_run = ddp_run();
    let cluster = Cluster::start();

    // srun: two tasks, each a worker of one job.
    let ckpt = cluster.dir().join("srun-ckpt");
    let child = cluster
        .command("srun")
        .args(["-N1", "-n2", "--time=5", DIGITS, "--epochs", "6"])
        .arg("--checkpoint-dir")
        .arg(&ckpt)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting srun");
    let (ok, out, err) = finish(child);
    assert!(
        ok,
        "srun -N1 -n2 digits failed:\n{out}\n{err}\n{}",
        cluster.logs()
    );
    assert_trained(&ckpt, &out, &err, 85.0);
    assert!(err.contains("epoch 6/6"), "{err}");

    // sbatch: a batch script whose one task runs ddp-run, which starts two workers.
    let batch_ckpt = cluster.dir().join("sbatch-ckpt");
    let output = cluster.dir().join("job.out");
    let script = cluster.dir().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#SBATCH --nodes=1 --ntasks=1 --cpus-per-task=2 --time=5\n\
             exec '{}' --nproc-per-node 2 -- '{DIGITS}' --epochs 6 --checkpoint-dir '{}'\n",
            ddp_run.display(),
            batch_ckpt.display()
        ),
    )
    .expect("writing the batch script");
    let child = cluster
        .command("sbatch")
        .arg("--wait")
        .arg(format!("--output={}", output.display()))
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting sbatch");
    let (ok, out, err) = finish(child);
    let job = std::fs::read_to_string(&output).unwrap_or_default();
    assert!(
        ok,
        "sbatch --wait failed:\n{out}\n{err}\njob output:\n{job}\n{}",
        cluster.logs()
    );
    assert!(out.contains("Submitted batch job"), "{out}");
    assert_eq!(job.matches("test accuracy").count(), 1, "{job}");
    assert!(job.contains("on 2 rank(s)"), "one job of two ranks:\n{job}");
    let accuracy = percent_after(&job, "test accuracy");
    assert!(accuracy >= 85.0, "accuracy {accuracy}%:\n{job}");
    assert!(
        crate::common::latest(&batch_ckpt).is_some(),
        "no checkpoint:\n{job}"
    );
}
