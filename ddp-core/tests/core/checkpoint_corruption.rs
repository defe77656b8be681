//! A truncated or altered checkpoint file fails the manifest check, is named in the warning
//! and in the outcome, and the previous valid checkpoint is used.
use crate::checkpoint_common::*;
use crate::common::*;
use burn::optim::AdamConfig;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, InvalidReason, LoadOutcome, MODEL_FILE,
    OPTIMIZER_FILE, TrainingState, checkpoint_name,
};
use std::path::Path;

/// Saves checkpoints at steps 1 and 2 (with an Adam step in between, so both differ); returns
/// the parameters saved at step 1 and 2.
fn save_two(dir: &Path) -> (Vec<f32>, Vec<f32>) {
    let mut out = run_ranks(1, |pg| {
        let device = Default::default();
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer");
        let mut ddp = ddp_core::DistributedDataParallel::new(
            Mlp::<B>::new(&device, HIDDEN),
            pg,
            ddp_core::DdpConfig::new(),
        )
        .expect("ddp");
        let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
        let mut saved = Vec::new();
        for step in 1..=2u64 {
            let (x, y) = batch(&[0, 1, 2, 3], &device);
            let pred = ddp.forward(|m| m.forward(x, false)).expect("forward");
            let loss =
                burn::nn::loss::MseLoss::new().forward(pred, y, burn::nn::loss::Reduction::Mean);
            let grads = ddp.backward(loss).expect("backward");
            ddp.optimizer_step(&mut optim, LR, grads);
            ckpt.save(ddp.module(), &optim, &TrainingState::new(0, step))
                .expect("save");
            saved.push(flat_params(ddp.module()));
        }
        saved
    });
    let mut saved = out.remove(0);
    let second = saved.remove(1);
    (saved.remove(0), second)
}

/// Loads the latest checkpoint of `dir` into a fresh model (1 rank) and returns the outcome,
/// the loaded parameters and the log.
fn load(dir: &Path) -> (LoadOutcome, Vec<f32>, String) {
    let mut out = run_ranks(1, |pg| {
        capture_logs(|| {
            let device = Default::default();
            let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("checkpointer");
            let mut model = Mlp::<B>::new(&device, HIDDEN);
            let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
            let outcome = ckpt
                .load_latest(&device, &mut model, &mut optim)
                .expect("load_latest");
            (outcome, flat_params(&model))
        })
    });
    let ((outcome, params), log) = out.remove(0);
    (outcome, params, log)
}

fn step2_file(dir: &Path, file: &str) -> std::path::PathBuf {
    dir.join(checkpoint_name(2)).join(file)
}

#[test]
fn truncated_model_file_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (step1, step2) = save_two(dir.path());
    assert!(!bitwise_eq(&step1, &step2));
    let path = step2_file(dir.path(), MODEL_FILE);
    let len = std::fs::metadata(&path).expect("model file").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 10)
        .expect("truncate");

    let (outcome, params, log) = load(dir.path());
    let resumed = outcome.resumed().expect("resumed from step 1");
    assert_eq!(resumed.info.name, checkpoint_name(1));
    assert_eq!(resumed.state.global_step, 1);
    assert!(
        bitwise_eq(&params, &step1),
        "the model holds step 1's parameters"
    );
    assert_eq!(resumed.invalid.len(), 1);
    assert_eq!(resumed.invalid[0].name, checkpoint_name(2));
    assert_eq!(
        resumed.invalid[0].reason,
        InvalidReason::SizeMismatch {
            file: MODEL_FILE.into(),
            expected: len,
            found: len - 10
        }
    );
    assert!(
        log.contains("WARN")
            && log.contains("step-0000000002")
            && log.contains("model.safetensors"),
        "the warning names the checkpoint and the file:\n{log}"
    );
    assert!(
        outcome
            .to_string()
            .contains("skipped checkpoint step-0000000002"),
        "{outcome}"
    );
}

#[test]
fn altered_tensor_bytes_are_caught_by_the_hash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (step1, _) = save_two(dir.path());
    let path = step2_file(dir.path(), MODEL_FILE);
    let mut bytes = std::fs::read(&path).expect("read");
    let last = bytes.len() - 1; // inside the tensor data: the header stays valid
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).expect("write");

    let (outcome, params, log) = load(dir.path());
    let resumed = outcome.resumed().expect("resumed from step 1");
    assert_eq!(resumed.info.name, checkpoint_name(1));
    assert!(bitwise_eq(&params, &step1));
    assert!(
        matches!(&resumed.invalid[0].reason, InvalidReason::HashMismatch { file, .. } if file == MODEL_FILE),
        "{:?}",
        resumed.invalid
    );
    assert!(
        log.contains("step-0000000002") && log.contains("sha256"),
        "{log}"
    );
}

/// Every checkpoint corrupt: the load stops with an error listing each and why, instead of
/// starting fresh over them; nothing is renamed or removed.
#[test]
fn every_checkpoint_corrupt_is_an_error_not_a_fresh_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_two(dir.path());
    std::fs::write(
        dir.path().join(checkpoint_name(2)).join(OPTIMIZER_FILE),
        b"garbage",
    )
    .expect("write");
    std::fs::remove_file(dir.path().join(checkpoint_name(1)).join(MODEL_FILE)).expect("remove");
    let err = run_ranks(1, |pg| {
        let device = Default::default();
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let mut model = Mlp::<B>::new(&device, HIDDEN);
        let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
        ckpt.load_latest(&device, &mut model, &mut optim)
            .map(|outcome| outcome.to_string())
            .expect_err("no fresh start over corrupt checkpoints")
    })
    .remove(0);
    let CheckpointError::NoValidCheckpoint { invalid, .. } = &err else {
        panic!("expected NoValidCheckpoint, got {err}");
    };
    let names: Vec<_> = invalid.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, [checkpoint_name(2), checkpoint_name(1)]);
    assert!(
        matches!(&invalid[1].reason, InvalidReason::MissingFile { file } if file == MODEL_FILE)
    );
    assert!(
        dir.path().join(checkpoint_name(2)).is_dir()
            && dir.path().join(checkpoint_name(1)).is_dir(),
        "nothing moved: {err}"
    );
}

#[test]
fn loading_a_named_corrupt_checkpoint_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_two(dir.path());
    let path = step2_file(dir.path(), MODEL_FILE);
    let len = std::fs::metadata(&path).expect("model file").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len / 2)
        .expect("truncate");
    let errors = run_ranks(2, |pg| {
        let device = burn::tensor::Device::<B>::default();
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("checkpointer");
        let mut model = Mlp::<B>::new(&device, HIDDEN);
        let before = flat_params(&model);
        let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
        let err = ckpt
            .load(&checkpoint_name(2), &device, &mut model, &mut optim)
            .expect_err("a corrupt checkpoint must not load");
        assert!(
            bitwise_eq(&before, &flat_params(&model)),
            "the model is unchanged"
        );
        err
    });
    assert!(
        matches!(&errors[0], CheckpointError::Invalid { name, reason: InvalidReason::SizeMismatch { file, .. }, .. }
            if name == "step-0000000002" && file == MODEL_FILE),
        "{}",
        errors[0]
    );
    let msg = errors[1].to_string();
    assert!(
        matches!(errors[1], CheckpointError::Rank0Failed { .. })
            && msg.contains("model.safetensors"),
        "rank 1 learns rank 0's error: {msg}"
    );
}
