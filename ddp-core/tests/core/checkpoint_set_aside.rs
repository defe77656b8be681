//! Invalid checkpoints are set aside (renamed `step-N.invalid`), never deleted: a one-bit error
//! may be repairable and the checkpoint worth hours. Checkpoints that are all invalid stop the
//! load instead of starting fresh over them. A directory whose manifest names another step is
//! invalid (not resumed as the step its name says), and a `latest` that is not UTF-8 is
//! ignored like any other garbage pointer.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, FullCheckpointer, LATEST_FILE, MODEL_FILE, TrainingState, checkpoint_name,
};
use std::path::Path;

fn checkpointer(dir: &Path, pg: ddp_core::comm::ProcessGroup) -> FullCheckpointer {
    FullCheckpointer::new(CheckpointConfig::new(dir).with_keep_last(2), pg).expect("new")
}

/// Saves steps `steps` of random models into `dir` (1 rank, keep-last 2).
fn save_steps(dir: &Path, steps: std::ops::RangeInclusive<u64>) {
    run_ranks(1, |pg| {
        let ckpt = checkpointer(dir, pg);
        for step in steps.clone() {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
}

/// Flips one bit near the end of `path` (inside the tensor data).
fn flip_last_bit(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(path, &bytes).expect("write");
    bytes
}

#[test]
fn a_corrupt_checkpoint_is_set_aside_with_a_warning_and_survives_later_saves() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), 1..=2);
    let corrupt = flip_last_bit(&dir.path().join(checkpoint_name(2)).join(MODEL_FILE));

    let (names, log) = run_ranks(1, |pg| {
        capture_logs(|| {
            let ckpt = checkpointer(dir.path(), pg);
            let (outcome, _) = load_latest_fresh(&ckpt);
            let resumed = outcome.resumed().expect("resumed from step 1");
            assert_eq!(resumed.info.name, checkpoint_name(1));
            assert_eq!(resumed.invalid.len(), 1, "{outcome}");
            // The run goes on past the corrupt step, with keep-last 2.
            for step in 2..=4 {
                save_random(&ckpt, TrainingState::new(0, step));
            }
            ckpt.list().expect("list")
        })
    })
    .remove(0);
    assert!(
        log.contains("WARN") && log.contains("step-0000000002.invalid") && log.contains("sha256"),
        "the warning names the checkpoint, where it went and why:\n{log}"
    );
    let kept = dir.path().join("step-0000000002.invalid").join(MODEL_FILE);
    assert_eq!(
        std::fs::read(&kept).ok().as_deref(),
        Some(corrupt.as_slice()),
        "the corrupt checkpoint is kept, as it was:\n{log}"
    );
    assert_eq!(
        names,
        [checkpoint_name(3), checkpoint_name(4)],
        "keep-last 2 counts the valid checkpoints"
    );
}

#[test]
fn checkpoints_that_are_all_invalid_stop_the_load_and_nothing_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), 1..=2);
    for step in 1..=2 {
        flip_last_bit(&dir.path().join(checkpoint_name(step)).join(MODEL_FILE));
    }
    let errors = run_ranks(2, |pg| {
        let ckpt = checkpointer(dir.path(), pg);
        let device = Default::default();
        let mut model = Mlp::<B>::new(&device, 4);
        ckpt.load_latest(&device, &mut model, &mut adam())
            .map(|outcome| outcome.to_string())
            .expect_err("no fresh start over invalid checkpoints")
            .to_string()
    });
    for (rank, msg) in errors.iter().enumerate() {
        assert!(
            msg.contains("step-0000000001")
                && msg.contains("step-0000000002")
                && msg.contains("none is valid")
                && msg.contains("--fresh")
                && msg.contains("Nothing was deleted"),
            "rank {rank}: {msg}"
        );
    }
    for step in 1..=2 {
        assert!(
            dir.path()
                .join(checkpoint_name(step))
                .join(MODEL_FILE)
                .is_file(),
            "step {step} is still there"
        );
    }
}

#[test]
fn a_directory_whose_manifest_names_another_step_is_not_resumed_as_its_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), 1..=2);
    // A copy of step 2 under a far newer name.
    let fake = dir.path().join("step-0000099999");
    std::fs::create_dir(&fake).expect("mkdir");
    for entry in std::fs::read_dir(dir.path().join(checkpoint_name(2))).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), fake.join(entry.file_name())).expect("copy");
    }
    run_ranks(1, |pg| {
        let ckpt = checkpointer(dir.path(), pg);
        let (outcome, _) = load_latest_fresh(&ckpt);
        let resumed = outcome.resumed().expect("resumed");
        assert_eq!(resumed.info.name, checkpoint_name(2), "{outcome}");
        let skipped = resumed
            .invalid
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>();
        assert!(
            skipped.len() == 1 && skipped[0].contains("step-0000099999"),
            "{skipped:?}"
        );
        // Saving goes on: nothing newer and valid blocks it.
        save_random(&ckpt, TrainingState::new(0, 3));
    });
}

#[test]
fn a_latest_pointer_that_is_not_utf8_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), 1..=2);
    std::fs::write(dir.path().join(LATEST_FILE), [0xff, 0xfe, b'\n']).expect("write");
    run_ranks(1, |pg| {
        let ckpt = checkpointer(dir.path(), pg);
        let device = Default::default();
        let mut model = Mlp::<B>::new(&device, 4);
        let outcome = ckpt
            .load_latest(&device, &mut model, &mut adam())
            .expect("a garbage latest is only a hint");
        assert_eq!(
            outcome.resumed().expect("resumed").info.name,
            checkpoint_name(2)
        );
    });
}
