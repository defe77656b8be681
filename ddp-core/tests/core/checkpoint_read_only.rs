//! A checkpointer opened read-only (`CheckpointConfig::with_read_only(true)`: a read-only
//! mount, or another job's checkpoints evaluated while it runs) loads without writing anything
//! in the directory: no lock file, no corrupt checkpoint set aside, no leftover removed. Saves,
//! rewinds and fresh-start records fail with `CheckpointError::ReadOnly` on every rank.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::sharded::{
    ShardedCheckpointError, ShardedCheckpointer, model_shard_file,
};
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, LOCK_FILE, MODEL_FILE, TrainingState,
    checkpoint_name,
};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Every entry below `dir` with its length and modification time, sorted.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut entries = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            let meta = std::fs::metadata(&path).expect("metadata");
            if meta.is_dir() {
                todo.push(path.clone());
            }
            entries.push((path, meta.len(), meta.modified().expect("mtime")));
        }
    }
    entries.sort();
    entries
}

/// Flips one bit near the end of `path` (inside the tensor data).
fn flip_last_bit(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(path, &bytes).expect("write");
}

fn read_only(dir: &Path) -> CheckpointConfig {
    CheckpointConfig::new(dir).with_read_only(true)
}

#[test]
fn a_read_only_checkpointer_loads_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        for step in 1..=2 {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
    // Step 2 is corrupt (a writable checkpointer would rename it), a write was interrupted
    // (a writable one would remove its leftover), and nobody locked the directory yet.
    flip_last_bit(&dir.path().join(checkpoint_name(2)).join(MODEL_FILE));
    let leftover = dir.path().join(".tmp-step-0000000003-partial");
    std::fs::create_dir(&leftover).expect("leftover");
    std::fs::remove_file(dir.path().join(LOCK_FILE)).expect("no lock file");
    let before = snapshot(dir.path());

    let errors = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(read_only(dir.path()), pg).expect("opens read-only");
        let (outcome, _) = load_latest_fresh(&ckpt);
        let resumed = outcome.resumed().expect("resumed from step 1");
        assert_eq!(resumed.info.name, checkpoint_name(1), "{outcome}");
        assert_eq!(resumed.invalid.len(), 1, "{outcome}");
        let model = Mlp::<B>::new(&Default::default(), 4);
        let save = ckpt.save(&model, &adam(), &TrainingState::new(0, 3));
        let rewind = ckpt.rewind_to(0);
        let record = ckpt.record_fresh_start("launch");
        [
            save.map(|_| ()).expect_err("save"),
            rewind.map(|_| ()).expect_err("rewind"),
            record.expect_err("fresh start"),
        ]
    });
    for (rank, errors) in errors.iter().enumerate() {
        for e in errors {
            assert!(
                matches!(e, CheckpointError::ReadOnly { .. }),
                "rank {rank}: {e}"
            );
            assert!(e.to_string().contains("with_read_only(true)"), "{e}");
        }
    }
    assert_eq!(
        snapshot(dir.path()),
        before,
        "nothing in the directory changed"
    );
}

#[test]
fn a_read_only_checkpointer_of_a_missing_directory_fails_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("runs").join("digits");
    let errors = run_ranks(2, |pg| {
        FullCheckpointer::new(read_only(&missing), pg)
            .map(|_| ())
            .expect_err("no directory to load from")
            .to_string()
    });
    assert!(
        errors[0].contains("is not a directory, and a read-only checkpointer creates nothing"),
        "{errors:?}"
    );
    assert!(errors[1].contains("rank 0 failed"), "{errors:?}");
    assert!(!dir.path().join("runs").exists());
}

#[test]
fn a_read_only_sharded_checkpointer_loads_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| {
        let ckpt = ShardedCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let model = Mlp::<B>::seeded(&Default::default(), 4, 7);
        for step in 1..=2 {
            ckpt.save(&model, &adam(), &TrainingState::new(0, step))
                .expect("save");
        }
    });
    flip_last_bit(
        &dir.path()
            .join(checkpoint_name(2))
            .join(model_shard_file(1, 2)),
    );
    std::fs::remove_file(dir.path().join(LOCK_FILE)).expect("no lock file");
    let before = snapshot(dir.path());

    let errors = run_ranks(2, |pg| {
        let ckpt = ShardedCheckpointer::new(read_only(dir.path()), pg).expect("opens read-only");
        let device = Default::default();
        let (mut model, mut optim) = (Mlp::<B>::new(&device, 4), adam());
        let outcome = ckpt
            .load_latest(&device, &mut model, &mut optim)
            .expect("load");
        assert_eq!(outcome.invalid().len(), 1, "{outcome}");
        let resumed = outcome.into_resumed().expect("resumed from step 1");
        assert_eq!(resumed.state.global_step, 1);
        ckpt.save(&model, &optim, &TrainingState::new(0, 3))
            .map(|_| ())
            .expect_err("save")
    });
    for (rank, e) in errors.iter().enumerate() {
        assert!(
            matches!(
                e,
                ShardedCheckpointError::Checkpoint(CheckpointError::ReadOnly { .. })
            ),
            "rank {rank}: {e}"
        );
    }
    assert_eq!(
        snapshot(dir.path()),
        before,
        "nothing in the directory changed"
    );
}
