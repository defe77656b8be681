//! The guide's port of a PyTorch DDP script (`docs/guide/from-pytorch.md`) as its reader runs
//! it: 2 processes under the example's own launcher, training to a high accuracy.

use crate::common::clean_command;

#[test]
fn the_pytorch_port_trains_on_two_processes_as_the_guide_shows() {
    let out = clean_command(env!("CARGO_BIN_EXE_from_pytorch"))
        .env("RUST_LOG", "warn")
        .args(["--nproc-per-node", "2"])
        .output()
        .expect("running the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for epoch in 0..8 {
        assert!(
            stdout.contains(&format!("[rank 0]: epoch {epoch}: last batch loss ")),
            "no loss line for epoch {epoch}:\n{stdout}"
        );
    }
    let accuracy: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("[rank 0]: accuracy "))
        .and_then(|rest| rest.split('%').next())
        .and_then(|pct| pct.parse().ok())
        .unwrap_or_else(|| panic!("no accuracy line:\n{stdout}"));
    assert!(
        stdout.contains("% of 2048 points"),
        "the accuracy must count every point once:\n{stdout}"
    );
    assert!(accuracy >= 90.0, "accuracy {accuracy}%:\n{stdout}");
}
