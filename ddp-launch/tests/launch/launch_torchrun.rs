//! A program built on `launch()`, started by PyTorch's own torchrun (`--no-python`): torchrun's
//! agent holds MASTER_PORT for its own store, so ours takes a port every worker derives alike,
//! and the workers form a group. Needs torchrun: `DDP_TORCHRUN` names it (`.ci/run` points it
//! at its PyTorch environment).
use crate::launch_common::*;
use std::process::Command;

/// Runs `launch_worker --mode <mode>` on 2 workers under torchrun (`DDP_TORCHRUN`).
fn torchrun_worker(mode: &str) -> Finished {
    let torchrun = std::env::var_os("DDP_TORCHRUN").expect("DDP_TORCHRUN names torchrun");
    let master_port = free_port().to_string();
    let mut cmd = Command::new(torchrun);
    ddp_test_support::remove_job_env(&mut cmd);
    cmd.args(["--nproc-per-node", "2", "--master-port", &master_port])
        .arg("--no-python")
        .arg(worker_path())
        .args(["--mode", mode]);
    run(cmd)
}

#[test]
#[ignore = "needs PyTorch's torchrun (DDP_TORCHRUN=/path/to/torchrun): run by .ci/run"]
fn torchrun_starts_workers_that_form_a_group() {
    let out = torchrun_worker("env");
    // `--mode env` all-reduces the ranks and fails unless the sum is right.
    assert!(out.status.success(), "{}", out.all());
    let ranks = out
        .stdout
        .lines()
        .filter(|l| l.contains("ENV rank="))
        .count();
    assert_eq!(ranks, 2, "one ENV line per rank: {}", out.all());
    assert!(out.stdout.contains("launcher=Torchrun"), "{}", out.all());
}

#[test]
#[ignore = "needs PyTorch's torchrun (DDP_TORCHRUN=/path/to/torchrun): run by .ci/run"]
fn torchrun_names_a_failed_workers_error_as_the_root_cause() {
    let out = torchrun_worker("fail-rank0");
    assert!(!out.status.success(), "{}", out.all());
    // torchrun's summary quotes the worker's error file; without one it says only this.
    assert!(
        !out.stderr.contains("To enable traceback see"),
        "{}",
        out.all()
    );
    let root_cause = out
        .stderr
        .split("Root Cause")
        .nth(1)
        .unwrap_or_else(|| panic!("no root cause in torchrun's summary:\n{}", out.all()));
    assert!(
        root_cause.contains("simulated checkpoint failure: checkpoint dir is read-only"),
        "{}",
        out.all()
    );
}
