//! The examples as a user runs them: two processes, real data, checkpoints, resume.
use crate::common::{clean_command, output, percent_after};
use std::path::Path;

/// Runs an example to the end in a clean environment: (success, stdout, stderr).
fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let mut cmd = clean_command(bin);
    cmd.args(args);
    output(cmd)
}

#[test]
fn digits_trains_to_95_percent_checkpoints_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt_arg = ckpt.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_digits");
    let (ok, out, err) = run(
        bin,
        &[
            "--nproc-per-node",
            "2",
            "--epochs",
            "12",
            "--checkpoint-dir",
            ckpt_arg,
        ],
    );
    assert!(ok, "digits failed:\n{out}\n{err}");
    let accuracy = percent_after(&out, "test accuracy");
    assert!(accuracy >= 95.0, "accuracy {accuracy}% below 95%:\n{out}");
    assert!(
        err.contains("epoch 12/12"),
        "progress lines on rank 0:\n{err}"
    );
    assert!(
        err.contains("no valid checkpoint") || err.contains("starting fresh"),
        "{err}"
    );
    // digits declares mimalloc as its global allocator: DDP's fast-CPU-path check must see it.
    assert!(
        !err.contains("global allocator is not mimalloc"),
        "mimalloc not detected:\n{err}"
    );

    let latest = std::fs::read_to_string(ckpt.join("latest")).expect("a latest pointer");
    let last = ckpt.join(latest.trim());
    for file in [
        "model.safetensors",
        "optimizer.bin",
        "training_state.json",
        "manifest.json",
    ] {
        assert!(
            Path::new(&last).join(file).is_file(),
            "{file} missing in {}",
            last.display()
        );
    }
    assert!(
        out.contains(&format!("checkpoint: {}", last.display())),
        "prints where the checkpoint is:\n{out}"
    );

    // A second run with two more epochs resumes and runs only those.
    let (ok, out2, err2) = run(
        bin,
        &[
            "--nproc-per-node",
            "2",
            "--epochs",
            "14",
            "--checkpoint-dir",
            ckpt_arg,
        ],
    );
    assert!(ok, "resumed run failed:\n{out2}\n{err2}");
    assert!(
        err2.contains("resuming from") && err2.contains("12 of 14 epochs done"),
        "{err2}"
    );
    assert!(
        !err2.contains("epoch 1/14"),
        "finished epochs must be skipped:\n{err2}"
    );
    assert!(
        err2.contains("epoch 13/14") && err2.contains("epoch 14/14"),
        "{err2}"
    );
    assert!(percent_after(&out2, "test accuracy") >= 95.0, "{out2}");

    // --fresh ignores the checkpoints.
    let (ok, _, err3) = run(
        bin,
        &[
            "--nproc-per-node",
            "2",
            "--epochs",
            "1",
            "--fresh",
            "--checkpoint-dir",
            ckpt_arg,
        ],
    );
    assert!(ok);
    assert!(
        err3.contains("--fresh") && err3.contains("epoch 1/1"),
        "{err3}"
    );
}

/// A `--backend` that needs a cargo feature: without it (`built` false) the binary must fail
/// with an error containing every one of `hints`; with it, two ranks must reach `goal` percent
/// of the `metric` the binary prints, as they do on Flex.
fn trains_on_optional_backend(
    bin: &str,
    args: &[&str],
    built: bool,
    hints: &[&str],
    metric: &str,
    goal: f64,
) {
    let (ok, out, err) = run(bin, args);
    if !built {
        assert!(!ok, "{out}");
        assert!(hints.iter().all(|h| err.contains(h)), "{err}");
        return;
    }
    assert!(ok, "{bin} {args:?} failed:\n{out}\n{err}");
    let value = percent_after(&out, metric);
    assert!(value >= goal, "{metric} {value}% below {goal}%:\n{out}");
}

/// `--backend ndarray`: without the feature, a clear error; with it, training on burn's NdArray
/// backend (two ranks) to the accuracy it reaches on Flex.
#[test]
fn digits_with_backend_ndarray_trains_or_says_how_to_build_it() {
    trains_on_optional_backend(
        env!("CARGO_BIN_EXE_digits"),
        &[
            "--nproc-per-node",
            "2",
            "--backend",
            "ndarray",
            "--epochs",
            "12",
        ],
        cfg!(feature = "ndarray"),
        &["without the NdArray backend", "--features ndarray"],
        "test accuracy",
        95.0,
    );
}

/// `--backend tch`: without the feature, a clear error naming the feature and libtorch; with it,
/// training on burn's LibTorch backend (two ranks) to the accuracy it reaches on Flex.
#[test]
fn digits_with_backend_tch_trains_or_says_how_to_build_it() {
    trains_on_optional_backend(
        env!("CARGO_BIN_EXE_digits"),
        &[
            "--nproc-per-node",
            "2",
            "--backend",
            "tch",
            "--epochs",
            "12",
        ],
        cfg!(feature = "tch"),
        &[
            "without the LibTorch backend",
            "--features tch",
            "torch==2.9.0",
        ],
        "test accuracy",
        95.0,
    );
}

/// The transformer example with `--backend tch`: without the feature, the same clear error;
/// with it, two ranks on burn's LibTorch backend reach the token accuracy they reach on Flex
/// (`transformer_learns_to_reverse_sequences`'s shape and goal).
#[test]
fn transformer_with_backend_tch_learns_or_says_how_to_build_it() {
    trains_on_optional_backend(
        env!("CARGO_BIN_EXE_transformer"),
        &[
            "--nproc-per-node",
            "2",
            "--backend",
            "tch",
            "--epochs",
            "2",
            "--train-size",
            "1024",
            "--d-model",
            "64",
            "--layers",
            "2",
            "--boundaries",
        ],
        cfg!(feature = "tch"),
        &["without the LibTorch backend", "--features tch"],
        "token accuracy",
        90.0,
    );
}

/// `--backend cuda`: without the feature, a clear error; with it, training on GPU 0 to the same
/// accuracy as on the CPU (world size 1), or, on a machine without a driver, the error that says
/// so before any tensor operation.
#[test]
fn digits_with_backend_cuda_trains_on_the_gpu_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let (ok, out, err) = run(
        env!("CARGO_BIN_EXE_digits"),
        &[
            "--nproc-per-node",
            "1",
            "--backend",
            "cuda",
            "--epochs",
            "12",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ],
    );
    if !cfg!(feature = "cuda") {
        assert!(!ok, "{out}");
        assert!(
            err.contains("without CUDA support") && err.contains("--features cuda"),
            "{err}"
        );
        return;
    }
    #[cfg(feature = "cuda")]
    if !ddp_core::comm::cuda_driver_present() {
        assert!(!ok, "{out}");
        assert!(err.contains("no CUDA driver found"), "{err}");
        eprintln!("skipping GPU training: no CUDA driver found (the error path was checked)");
        return;
    }
    assert!(ok, "digits --backend cuda failed:\n{out}\n{err}");
    let accuracy = percent_after(&out, "test accuracy");
    assert!(
        accuracy >= 95.0,
        "accuracy {accuracy}% below 95% on the GPU:\n{out}"
    );
}

#[test]
fn transformer_learns_to_reverse_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let (ok, out, err) = run(
        env!("CARGO_BIN_EXE_transformer"),
        &[
            "--nproc-per-node",
            "2",
            "--epochs",
            "2",
            "--train-size",
            "1024",
            "--d-model",
            "64",
            "--layers",
            "2",
            "--boundaries",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ],
    );
    assert!(ok, "transformer failed:\n{out}\n{err}");
    let accuracy = percent_after(&out, "token accuracy");
    assert!(accuracy >= 90.0, "token accuracy {accuracy}%:\n{out}");
    assert!(ckpt.join("latest").is_file());
}

/// The number after `label` on the line that has it ("... state on rank 0: 1234 bytes").
fn number_after(text: &str, label: &str) -> u64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no '{label}' in:\n{text}"))
        + label.len();
    text[at..]
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number after '{label}' in:\n{text}"))
}

#[test]
fn transformer_with_zero2_learns_halves_adams_state_and_resumes_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let args = |nproc: &'static str, epochs: &'static str| {
        let mut a = vec![
            "--nproc-per-node",
            nproc,
            "--epochs",
            epochs,
            "--train-size",
            "1024",
            "--d-model",
            "64",
            "--layers",
            "2",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ];
        if nproc == "2" {
            a.extend(["--shard", "zero2"]);
        }
        a
    };
    let bin = env!("CARGO_BIN_EXE_transformer");
    let (ok, out, err) = run(bin, &args("2", "2"));
    assert!(ok, "transformer --shard zero2 failed:\n{out}\n{err}");
    assert!(err.contains("shard zero2"), "{err}");
    let accuracy = percent_after(&out, "token accuracy");
    assert!(
        accuracy >= 90.0,
        "token accuracy {accuracy}% with --shard zero2:\n{out}"
    );
    let sharded = number_after(&out, "optimizer state on rank 0:");

    // One process, plain Adam, from the checkpoint ZeRO-2 wrote: the whole state.
    let (ok, out, err) = run(bin, &args("1", "3"));
    assert!(ok, "resuming without --shard failed:\n{out}\n{err}");
    assert!(err.contains("resuming from"), "{err}");
    let accuracy = percent_after(&out, "token accuracy");
    assert!(
        accuracy >= 90.0,
        "token accuracy {accuracy}% after resuming:\n{out}"
    );
    let whole = number_after(&out, "optimizer state on rank 0:");
    let ratio = whole as f64 / sharded as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "plain Adam holds {whole} bytes, a ZeRO rank of 2 {sharded}: ratio {ratio:.2}, not about 2"
    );
}
