//! The transformer's `--shard` and `--mixed-precision` across a resume: the loss scaler's state
//! travels in the checkpoint; `--shard full` (fully sharded parameters) trains exactly as DDP
//! does, across a resume from its sharded checkpoint too, and refuses DDP-only flags before any
//! worker starts.
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

/// The loss of every epoch and the final accuracy, as rank 0 printed them.
fn losses_and_accuracy(err: &str) -> Vec<String> {
    err.lines()
        .filter_map(|l| {
            let at = l.find(": loss ").or_else(|| l.find("token accuracy "))?;
            Some(
                l[at..]
                    .split([',', '('])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn shard_full_trains_and_resumes_exactly_like_ddp_at_world_2() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let full_ckpt = dir.path().join("full");
    // 512 sequences, 2 ranks, 32 per rank: 8 steps per epoch, 4 epochs (100% at the end).
    let args = |shard: Option<&'static str>, epochs: &'static str, fresh: bool| {
        let ckpt = if shard.is_some() { &full_ckpt } else { &ckpt };
        let mut a = vec![
            "--nproc-per-node".to_string(),
            "2".into(),
            "--epochs".into(),
            epochs.into(),
            "--train-size".into(),
            "512".into(),
            "--test-size".into(),
            "64".into(),
            "--d-model".into(),
            "32".into(),
            "--layers".into(),
            "2".into(),
            "--heads".into(),
            "2".into(),
            "--lr".into(),
            "0.01".into(),
            "--checkpoint-dir".into(),
            ckpt.to_str().unwrap().into(),
        ];
        if fresh {
            a.push("--fresh".into());
        }
        if let Some(s) = shard {
            a.extend(["--shard".into(), s.into()]);
        }
        a
    };
    let run_with = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run(&a)
    };
    let (ok, ddp_out, ddp_err) = run_with(args(None, "4", true));
    assert!(ok, "DDP failed:\n{ddp_out}\n{ddp_err}");
    let ddp = losses_and_accuracy(&format!("{ddp_err}{ddp_out}"));
    assert_eq!(
        ddp.len(),
        5,
        "4 epoch losses and an accuracy:\n{ddp_err}{ddp_out}"
    );

    // Two epochs fully sharded, a sharded checkpoint, then a second run resumes it to four.
    let (ok, out, err) = run_with(args(Some("full"), "2", true));
    assert!(ok, "--shard full failed:\n{out}\n{err}");
    assert!(
        err.contains("shard full (3 units"),
        "the run says how it shards:\n{err}"
    );
    assert!(
        out.contains("checkpoint: ") && out.contains("sharded"),
        "the run names its sharded checkpoint:\n{out}"
    );
    let first = losses_and_accuracy(&format!("{err}{out}"));
    let (ok, out, err) = run_with(args(Some("full"), "4", false));
    assert!(ok, "resuming --shard full failed:\n{out}\n{err}");
    assert!(err.contains("resuming from"), "{err}");
    let resumed = losses_and_accuracy(&format!("{err}{out}"));
    // At world 2 the reduce-scatter's average rounds as DDP's all-reduce does: bitwise the same
    // training, so the same printed losses and accuracy, across the resume too.
    assert_eq!(first[..2], ddp[..2], "--shard full must train as DDP does");
    assert_eq!(
        resumed,
        ddp[2..],
        "the resumed run must go on as DDP's uninterrupted one"
    );
}

#[test]
fn shard_full_refuses_ddp_only_flags_before_any_worker_starts() {
    for flag in [
        &["--powersgd", "2"][..],
        &["--boundaries"],
        &["--mixed-precision", "bf16"],
    ] {
        let mut args = vec!["--shard", "full", "--nproc-per-node", "2"];
        args.extend_from_slice(flag);
        let (ok, out, err) = run(&args);
        assert!(!ok, "--shard full {flag:?} must fail:\n{out}\n{err}");
        assert!(
            err.contains("--shard full") && err.contains(flag[0]) && err.contains("drop it"),
            "{flag:?}: {err}"
        );
        assert!(!err.contains("epoch"), "no worker may start:\n{err}");
    }
}

/// `--collectives stand-in` with `--shard zero2` and `--shard full`: ZeRO-2's and FSDP's
/// collectives on the device path (the code NCCL runs on GPUs, on its CPU stand-in) train as
/// plain DDP through host memory does: at world 2 bitwise, so the same printed losses and
/// accuracy.
#[test]
fn shard_zero2_and_full_on_the_stand_in_train_exactly_like_ddp_at_world_2() {
    let dir = tempfile::tempdir().unwrap();
    let run_with = |extra: &[&str], name: &str| {
        let ckpt = dir.path().join(name);
        let mut a = vec![
            "--nproc-per-node",
            "2",
            "--epochs",
            "2",
            "--train-size",
            "256",
            "--test-size",
            "64",
            "--d-model",
            "32",
            "--layers",
            "2",
            "--heads",
            "2",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        let (ok, out, err) = run(&a);
        assert!(ok, "{extra:?} failed:\n{out}\n{err}");
        losses_and_accuracy(&format!("{err}{out}"))
    };
    let ddp = run_with(&["--collectives", "host"], "ddp");
    assert_eq!(ddp.len(), 3, "2 epoch losses and an accuracy: {ddp:?}");
    for shard in ["zero2", "full"] {
        let device = run_with(
            &["--shard", shard, "--collectives", "stand-in"],
            &format!("{shard}-stand-in"),
        );
        assert_eq!(
            device, ddp,
            "--shard {shard} on the stand-in must train as DDP does"
        );
    }
}
