//! The transformer's `--shard` and `--mixed-precision` across a resume: the loss scaler's state
//! travels in the checkpoint, and `--shard full` (FSDP) is refused, not silently ignored.
use crate::common::{clean_command, output};

fn run(args: &[&str]) -> (bool, String, String) {
    let mut cmd = clean_command(env!("CARGO_BIN_EXE_transformer"));
    cmd.args(args);
    output(cmd)
}

/// The text after `label` up to the next whitespace or comma, parsed.
fn value_after<T: std::str::FromStr>(text: &str, label: &str) -> T {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no '{label}' in:\n{text}"))
        + label.len();
    text[at..]
        .split([' ', ',', '\n'])
        .find(|s| !s.is_empty())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value after '{label}' in:\n{text}"))
}

#[test]
fn a_resumed_mixed_precision_run_keeps_its_loss_scale_under_zero2() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    // 256 sequences, 2 ranks, 32 per rank: 4 steps per epoch. Growth every finite step from a
    // scale of 1, so the scale after a run says how many steps it has seen since the start.
    let args = |epochs: &'static str| {
        vec![
            "--nproc-per-node",
            "2",
            "--epochs",
            epochs,
            "--train-size",
            "256",
            "--test-size",
            "64",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--shard",
            "zero2",
            "--mixed-precision",
            "bf16",
            "--loss-scale",
            "1",
            "--loss-scale-growth-interval",
            "1",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ]
    };
    let (ok, out, err) = run(&args("1"));
    assert!(ok, "first epoch failed:\n{out}\n{err}");
    let first: f32 = value_after(&out, "loss scale now ");
    let first_skipped: u32 = value_after(&out, "mixed precision Bf16: ");

    let (ok, out, err) = run(&args("2"));
    assert!(ok, "resuming failed:\n{out}\n{err}");
    assert!(err.contains("resuming from"), "{err}");
    let restored: f32 = value_after(&err, "transformer: loss scale ");
    assert_eq!(
        restored, first,
        "the resumed run must start at the scale the first one ended with:\n{err}"
    );
    let last: f32 = value_after(&out, "loss scale now ");
    let skipped: u32 = value_after(&out, "mixed precision Bf16: ");
    if first_skipped == 0 && skipped == 0 {
        // 4 more finite steps, each doubling: from 16, not from 1 again.
        assert_eq!(first, 16.0, "{out}");
        assert_eq!(last, 256.0, "{out}");
    }
}

#[test]
fn shard_full_is_refused_as_not_implemented() {
    let (ok, out, err) = run(&["--shard", "full", "--nproc-per-node", "2"]);
    assert!(!ok, "--shard full must fail:\n{out}\n{err}");
    assert!(
        err.contains("--shard full") && err.contains("not implemented"),
        "{err}"
    );
    assert!(!err.contains("epoch"), "no worker may start:\n{err}");
}
