//! Without a shared filesystem, rank 0 picks the checkpoint in its own directory: a newer one
//! in another rank's directory (the host that was rank 0 before an elastic restart) stops the
//! load on every rank, naming that rank, its step and its directory, instead of an older
//! resume or a fresh start. Ranks sharing one directory resume as before.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, MODEL_FILE, TrainingState, checkpoint_name,
};
use std::path::{Path, PathBuf};

/// Saves `steps` of random models into `dir` (1 rank).
fn save_steps(dir: &Path, steps: &[u64]) {
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("new");
        for &step in steps {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
}

/// `load_latest` on 2 ranks, rank `r` on `dirs[r]`: each rank's result, as the resumed
/// checkpoint's name (`None`: fresh) or the error.
fn load_on(dirs: [&Path; 2]) -> Vec<Result<Option<String>, CheckpointError>> {
    load_with(dirs, true)
}

/// [`load_on`], with the other ranks' directories `checked` or not.
fn load_with(dirs: [&Path; 2], checked: bool) -> Vec<Result<Option<String>, CheckpointError>> {
    run_ranks(2, |pg| {
        let dir = dirs[pg.rank()];
        let config = CheckpointConfig::new(dir).with_other_ranks_checked(checked);
        let ckpt = FullCheckpointer::new(config, pg).expect("new");
        let device = Default::default();
        let mut model = Mlp::<B>::new(&device, 4);
        let mut optim = adam();
        ckpt.load_latest(&device, &mut model, &mut optim)
            .map(|outcome| outcome.resumed().map(|r| r.info.name.clone()))
    })
}

fn assert_names_rank_1(results: &[Result<Option<String>, CheckpointError>], dir1: &Path) {
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(
                e @ CheckpointError::NewerCheckpointElsewhere {
                    rank: 1, step: 300, ..
                },
            ) => {
                let msg = e.to_string();
                for part in [
                    "rank 1",
                    "step 300",
                    &dir1.display().to_string(),
                    "every host that can become rank 0 shares",
                ] {
                    assert!(msg.contains(part), "rank {rank}: no {part:?} in: {msg}");
                }
            }
            other => panic!("rank {rank}: expected NewerCheckpointElsewhere, got {other:?}"),
        }
    }
}

#[test]
fn a_newer_checkpoint_in_another_ranks_directory_stops_the_load_on_every_rank() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1): (PathBuf, PathBuf) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[100]);
    save_steps(&dir1, &[300]);
    assert_names_rank_1(&load_on([&dir0, &dir1]), &dir1);
    // Nothing moved on either side.
    assert_eq!(
        entries_with_prefix(&dir0, "step-"),
        vec![checkpoint_name(100)]
    );
    assert_eq!(
        entries_with_prefix(&dir1, "step-"),
        vec![checkpoint_name(300)]
    );
}

/// With the check off (directories that may hold other runs' checkpoints), rank 0's own
/// choice is resumed, as before the check existed.
#[test]
fn with_the_check_off_rank_0s_checkpoint_is_resumed() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1): (PathBuf, PathBuf) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[100]);
    save_steps(&dir1, &[300]);
    for (rank, result) in load_with([&dir0, &dir1], false).into_iter().enumerate() {
        let name = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(name, Some(checkpoint_name(100)), "rank {rank}");
    }
}

#[test]
fn a_checkpoint_only_in_another_ranks_directory_stops_a_fresh_start() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1) = (root.path().join("new-host0"), root.path().join("host1"));
    save_steps(&dir1, &[300]);
    let results = load_on([&dir0, &dir1]);
    assert_names_rank_1(&results, &dir1);
    let msg = results[0].as_ref().expect_err("error").to_string();
    assert!(msg.contains("a fresh start"), "{msg}");
}

#[test]
fn ranks_sharing_one_directory_resume_as_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), &[100, 300]);
    for result in load_on([dir.path(), dir.path()]) {
        assert_eq!(result.expect("resumed"), Some(checkpoint_name(300)));
    }
    // Also when rank 0 falls back past a corrupt newer checkpoint and sets it aside: the other
    // rank, on the same directory, does not take it for a newer one.
    save_steps(dir.path(), &[400]);
    let model = dir.path().join(checkpoint_name(400)).join(MODEL_FILE);
    let mut bytes = std::fs::read(&model).expect("read");
    bytes[0] ^= 0xff;
    std::fs::write(&model, bytes).expect("corrupt");
    for result in load_on([dir.path(), dir.path()]) {
        assert_eq!(result.expect("resumed"), Some(checkpoint_name(300)));
    }
}
