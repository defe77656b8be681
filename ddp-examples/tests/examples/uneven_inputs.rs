//! The `uneven_inputs` example as real processes: three ranks with 3, 5 and 7 batches end with
//! one model (`join`).

use crate::common::clean_command;

#[test]
fn the_uneven_inputs_example_trains_three_processes_to_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = clean_command(env!("CARGO_BIN_EXE_uneven_inputs"));
    cmd.env("RUST_LOG", "warn");
    let out = cmd
        .args(["--nproc-per-node", "3", "--checkpoint-dir"])
        .arg(dir.path())
        .output()
        .expect("running the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut checksums = Vec::new();
    for (rank, (trained, answered)) in [(3, 4), (5, 2), (7, 0)].into_iter().enumerate() {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("rank {rank}: trained")))
            .unwrap_or_else(|| panic!("no line from rank {rank}:\n{stdout}"));
        assert!(
            line.contains(&format!("trained {trained} steps"))
                && line.contains(&format!("answered {answered} steps")),
            "{line}"
        );
        checksums.push(line.rsplit(' ').next().unwrap_or_default().to_string());
    }
    assert!(
        checksums.iter().all(|c| c == &checksums[0]),
        "replicas differ: {checksums:?}\n{stdout}"
    );
    assert!(stdout.contains("rank 0: checkpoint"), "{stdout}");
}
