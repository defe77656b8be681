//! An I/O error while loading is not corruption (issue 29): it fails the load with the path
//! and the OS error instead of falling back to an older checkpoint; `latest` never moves below
//! a newer valid checkpoint; a corrupt one is set aside, not pruned; `load(name)` stays inside the
//! checkpoint directory.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, InvalidReason, LATEST_FILE, MODEL_FILE,
    TrainingState, checkpoint_name, clear_read_error, inject_read_error,
};
use std::path::Path;

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(LATEST_FILE))
        .expect("latest")
        .trim()
        .to_string()
}

fn save_steps(dir: &Path, steps: &[u64], keep: Option<usize>) {
    run_ranks(1, |pg| {
        let mut config = CheckpointConfig::new(dir);
        if let Some(k) = keep {
            config = config.with_keep_last(k);
        }
        let ckpt = FullCheckpointer::new(config, pg).expect("new");
        for &step in steps {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
}

#[test]
fn an_eio_on_the_newest_checkpoint_fails_the_load_and_nothing_moves_backwards() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), &[1, 2, 3], None);
    let model = dir.path().join(checkpoint_name(3)).join(MODEL_FILE);
    inject_read_error(&model, libc::EIO);
    let errors = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let device = Default::default();
        let mut m = Mlp::<B>::new(&device, 4);
        let mut optim = adam();
        ckpt.load_latest(&device, &mut m, &mut optim)
            .expect_err("an EIO must fail the load, not fall back to step 2")
    });
    clear_read_error(&model);
    match &errors[0] {
        CheckpointError::ReadCheckpoint { name, path, source } => {
            assert_eq!(name, &checkpoint_name(3));
            assert_eq!(path, &model);
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("expected ReadCheckpoint, got {other}"),
    }
    let msg = errors[0].to_string();
    assert!(
        msg.contains(&model.display().to_string()) && msg.contains("not corruption"),
        "{msg}"
    );
    assert!(
        matches!(&errors[1], CheckpointError::Rank0Failed { message, .. } if message.contains(MODEL_FILE)),
        "{}",
        errors[1]
    );
    // Nothing was written or moved, and once the error is gone the run resumes from step 3.
    assert_eq!(latest(dir.path()), checkpoint_name(3));
    let name = run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let (outcome, _) = load_latest_fresh(&ckpt);
        outcome.resumed().expect("resumed").info.name.clone()
    })
    .remove(0);
    assert_eq!(name, checkpoint_name(3));
}

#[test]
fn a_save_below_a_newer_valid_checkpoint_is_refused_and_latest_stays() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), &[10, 20, 30], None);
    let err = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        // Resume from an older one (as a fallback would), then save above it.
        let device = Default::default();
        let mut m = Mlp::<B>::new(&device, 4);
        let mut optim = adam();
        ckpt.load(&checkpoint_name(10), &device, &mut m, &mut optim)
            .expect("load step 10");
        ckpt.save(&m, &optim, &TrainingState::new(0, 15))
            .expect_err("step 15 would move latest below step 30")
    })
    .remove(0);
    assert!(
        matches!(&err, CheckpointError::NewerCheckpointExists { step: 15, newer, .. } if *newer == checkpoint_name(30)),
        "{err}"
    );
    assert_eq!(
        latest(dir.path()),
        checkpoint_name(30),
        "latest did not move"
    );
    assert!(!dir.path().join(checkpoint_name(15)).exists());
}

#[test]
fn a_corrupt_newest_checkpoint_falls_back_and_is_set_aside_not_pruned() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), &[10, 20, 30], Some(2));
    let model = dir.path().join(checkpoint_name(30)).join(MODEL_FILE);
    let mut bytes = std::fs::read(&model).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&model, bytes).expect("corrupt");
    let (resumed, saved) = run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()).with_keep_last(2), pg)
            .expect("new");
        let (outcome, _) = load_latest_fresh(&ckpt);
        let resumed = outcome.into_resumed().expect("resumed");
        let (saved, _) = save_random(&ckpt, TrainingState::new(0, 25));
        (resumed, saved)
    })
    .remove(0);
    assert_eq!(resumed.info.name, checkpoint_name(20));
    assert!(matches!(
        resumed.invalid.as_slice(),
        [c] if c.name == checkpoint_name(30) && matches!(c.reason, InvalidReason::HashMismatch { .. })
    ));
    assert_eq!(
        resumed.invalid[0].set_aside.as_deref(),
        Some("step-0000000030.invalid")
    );
    // Corruption may fall back; the corrupt newer one is set aside (kept, out of the way of
    // retention), never deleted.
    assert_eq!(saved.removed, Vec::<String>::new());
    assert_eq!(latest(dir.path()), checkpoint_name(25));
    assert_eq!(
        entries_with_prefix(dir.path(), "step-"),
        vec![
            checkpoint_name(20),
            checkpoint_name(25),
            "step-0000000030.invalid".to_string()
        ]
    );
}

#[test]
fn a_complete_checkpoint_newer_than_latest_is_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), &[1, 2], None);
    // The writer renamed step 2 into place and died before moving `latest`.
    std::fs::write(
        dir.path().join(LATEST_FILE),
        format!("{}\n", checkpoint_name(1)),
    )
    .expect("write latest");
    let (name, log) = run_ranks(1, |pg| {
        capture_logs(|| {
            let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
            let (outcome, _) = load_latest_fresh(&ckpt);
            outcome.resumed().expect("resumed").info.name.clone()
        })
    })
    .remove(0);
    assert_eq!(name, checkpoint_name(2), "{log}");
    assert!(log.contains("newer than `latest`"), "{log}");
}

#[test]
fn load_refuses_names_that_leave_the_checkpoint_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let run = root.path().join("run");
    let other = root.path().join("other");
    save_steps(&other, &[1], None);
    let errors = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(&run), pg).expect("new");
        let device = Default::default();
        let mut m = Mlp::<B>::new(&device, 4);
        let mut optim = adam();
        let traversal = format!("../other/{}", checkpoint_name(1));
        let absolute = other.join(checkpoint_name(1)).display().to_string();
        [traversal.as_str(), absolute.as_str(), "..", ""]
            .map(|name| {
                ckpt.load(name, &device, &mut m, &mut optim)
                    .expect_err(name)
                    .to_string()
            })
            .to_vec()
    });
    for (rank, errs) in errors.iter().enumerate() {
        for e in errs {
            assert!(e.starts_with("invalid checkpoint name"), "rank {rank}: {e}");
        }
    }
}
