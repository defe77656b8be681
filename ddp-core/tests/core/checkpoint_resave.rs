//! Saving a step again after a failed save of it: the copy the failed save replaced does not
//! stay behind, and the retry succeeds in the same process.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, LATEST_FILE, StorageError, TrainingState,
    checkpoint_name, clear_write_error, inject_write_error,
};
use std::path::Path;

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(LATEST_FILE))
        .expect("latest")
        .trim()
        .to_string()
}

/// Every entry of `dir` that a save leaves behind only on failure.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut all = entries_with_prefix(dir, ".replaced-");
    all.extend(entries_with_prefix(dir, ".tmp-"));
    all
}

#[test]
fn a_failed_latest_write_on_a_resave_leaves_no_replaced_copy_and_the_retry_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, retried) = run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        save_random(&ckpt, TrainingState::new(0, 5));
        // The disk fills up between the checkpoint and its small `latest` file.
        inject_write_error(dir.path().join(LATEST_FILE), libc::ENOSPC);
        let model = Mlp::<B>::new(&Default::default(), 4);
        let first = ckpt.save(&model, &adam(), &TrainingState::new(0, 5));
        clear_write_error(dir.path().join(LATEST_FILE));
        let left = leftovers(dir.path());
        let retried = ckpt.save(&model, &adam(), &TrainingState::new(0, 5));
        (first.map(|_| left), retried.map(|_| flat_params(&model)))
    })
    .remove(0);
    assert_latest_not_updated(&first, 5);
    let params = retried.expect("the retry of the same step succeeds");
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    assert_eq!(latest(dir.path()), checkpoint_name(5));
    assert_eq!(
        entries_with_prefix(dir.path(), "step-"),
        vec![checkpoint_name(5)]
    );
    // The retry's checkpoint is the one resumed.
    let resumed = resume(dir.path());
    assert!(bitwise_eq(&resumed, &params));
}

#[test]
fn the_new_checkpoint_is_kept_and_resumed_when_latest_cannot_be_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let params = run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        save_random(&ckpt, TrainingState::new(0, 5));
        inject_write_error(dir.path().join(LATEST_FILE), libc::ENOSPC);
        let model = Mlp::<B>::new(&Default::default(), 4);
        let failed = ckpt.save(&model, &adam(), &TrainingState::new(0, 5));
        clear_write_error(dir.path().join(LATEST_FILE));
        assert_latest_not_updated(&failed, 5);
        flat_params(&model)
    })
    .remove(0);
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    // The new copy was installed and made durable before `latest` failed: it is the one
    // resumed (the search prefers the newest valid checkpoint; `latest` is a hint).
    let resumed = resume(dir.path());
    assert!(bitwise_eq(&resumed, &params));
}

#[test]
fn a_replaced_copy_left_by_an_earlier_attempt_does_not_block_a_resave() {
    let dir = tempfile::tempdir().expect("tempdir");
    let params = run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        save_random(&ckpt, TrainingState::new(0, 5));
        // What an attempt of this process that failed after moving step 5 aside (its fsync
        // of the directory, say) leaves: the aside name a re-save of step 5 would take.
        let aside = dir.path().join(format!(
            ".replaced-{}-{}",
            checkpoint_name(5),
            std::process::id()
        ));
        std::fs::create_dir(&aside).expect("aside");
        std::fs::write(aside.join("model.safetensors"), b"older copy").expect("write");
        save_random(&ckpt, TrainingState::new(0, 5)).1
    })
    .remove(0);
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    let resumed = resume(dir.path());
    assert!(bitwise_eq(&resumed, &params));
}

/// `result` is the named error of a save of `step` whose checkpoint was committed but whose
/// `latest` write failed with the injected ENOSPC, and its message says the checkpoint is kept.
fn assert_latest_not_updated<T: std::fmt::Debug>(result: &Result<T, CheckpointError>, step: u64) {
    match result {
        Err(e @ CheckpointError::LatestNotUpdated { name, source, .. }) => {
            assert_eq!(name, &checkpoint_name(step));
            match source {
                StorageError::Write { source, .. } => {
                    assert_eq!(source.raw_os_error(), Some(libc::ENOSPC))
                }
                other => panic!("expected the injected ENOSPC, got {other:?}"),
            }
            let message = e.to_string();
            assert!(
                message.contains("is committed and is what a resume takes"),
                "{message}"
            );
        }
        other => panic!("expected LatestNotUpdated, got {other:?}"),
    }
}

/// The parameters a new job resumes from `dir`.
fn resume(dir: &std::path::Path) -> Vec<f32> {
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("new");
        flat_params(&load_latest_fresh(&ckpt).1)
    })
    .remove(0)
}
