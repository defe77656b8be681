//! keep-last-K, the `latest` pointer, falling back when `latest` names a missing checkpoint,
//! cleanup of leftovers, replacing a checkpoint, fresh start.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, FullCheckpointer, InvalidReason, LATEST_FILE, LOCK_FILE, LoadOutcome,
    TrainingState, checkpoint_name,
};
use std::path::Path;

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(LATEST_FILE))
        .expect("latest")
        .trim()
        .to_string()
}

#[test]
fn keep_last_k_and_the_latest_pointer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(
            CheckpointConfig::new(dir.path()).with_keep_last(2),
            pg.clone(),
        )
        .expect("new");
        let mut last_params = Vec::new();
        for step in 1..=4u64 {
            let (saved, params) = save_random(&ckpt, TrainingState::new(0, step));
            assert_eq!(saved.name, checkpoint_name(step));
            assert_eq!(
                saved.removed,
                if step > 2 {
                    vec![checkpoint_name(step - 2)]
                } else {
                    vec![]
                },
                "step {step}"
            );
            assert!(saved.bytes > 0);
            // Both ranks see the new state once save returns.
            assert_eq!(ckpt.latest().expect("latest"), Some(checkpoint_name(step)));
            let expected: Vec<String> = (step.saturating_sub(1).max(1)..=step)
                .map(checkpoint_name)
                .collect();
            assert_eq!(
                ckpt.list().expect("list"),
                expected,
                "after saving step {step}"
            );
            last_params = params;
        }
        let (outcome, model) = load_latest_fresh(&ckpt);
        let resumed = outcome.resumed().expect("resumed").clone();
        (resumed, flat_params(&model), last_params)
    });
    // Rank 0 wrote its own model; both ranks loaded it.
    let written = &results[0].2;
    for (rank, (resumed, loaded, _)) in results.iter().enumerate() {
        assert_eq!(resumed.info.name, checkpoint_name(4), "rank {rank}");
        assert_eq!(resumed.info.saved_world_size, 2);
        assert!(
            bitwise_eq(loaded, written),
            "rank {rank} holds rank 0's saved model"
        );
    }
    assert_eq!(latest(dir.path()), checkpoint_name(4));
    assert_eq!(
        entries_with_prefix(dir.path(), "."),
        Vec::<String>::new(),
        "no temporaries left"
    );
}

#[test]
fn latest_naming_a_missing_checkpoint_falls_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(1, |pg| {
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        for step in 1..=3 {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
    std::fs::remove_dir_all(dir.path().join(checkpoint_name(3))).expect("remove step 3");

    let outcome = run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        load_latest_fresh(&ckpt).0
    })
    .remove(0);
    let resumed = outcome.resumed().expect("resumed");
    assert_eq!(
        resumed.info.name,
        checkpoint_name(2),
        "the one before `latest`'s"
    );
    assert_eq!(resumed.invalid.len(), 1);
    assert_eq!(resumed.invalid[0].name, checkpoint_name(3));
    assert!(matches!(
        resumed.invalid[0].reason,
        InvalidReason::MissingDir { .. }
    ));
}

#[test]
fn leftovers_of_an_interrupted_write_are_removed_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join(".tmp-step-0000000005-4242");
    std::fs::create_dir(&tmp).expect("mkdir");
    std::fs::write(tmp.join("model.safetensors"), b"half a model").expect("write");
    std::fs::write(dir.path().join(".tmp-latest-4242"), b"step-0000000005\n").expect("write");
    std::fs::create_dir(dir.path().join(".trash-step-0000000001-4242")).expect("mkdir");
    let (outcome, log) = run_ranks(1, |pg| {
        capture_logs(|| {
            let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
            load_latest_fresh(&ckpt).0
        })
    })
    .remove(0);
    assert_eq!(entries_with_prefix(dir.path(), "."), Vec::<String>::new());
    assert!(
        log.contains("removed the leftover of an interrupted checkpoint write"),
        "{log}"
    );
    assert!(
        matches!(outcome, LoadOutcome::Fresh { ref invalid, .. } if invalid.is_empty()),
        "{outcome}"
    );
}

#[test]
fn fresh_start_in_a_new_directory_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("runs").join("digits");
    let (outcome, log) = run_ranks(2, |pg| {
        capture_logs(|| {
            let ckpt = FullCheckpointer::new(CheckpointConfig::new(&sub), pg).expect("new");
            let device = Default::default();
            let mut model = Mlp::<B>::new(&device, 4);
            let before = flat_params(&model);
            let mut optim = adam();
            let outcome = ckpt
                .load_latest(&device, &mut model, &mut optim)
                .expect("load");
            assert!(
                bitwise_eq(&before, &flat_params(&model)),
                "a fresh start leaves the model alone"
            );
            outcome
        })
    })
    .remove(0);
    assert!(sub.is_dir(), "rank 0 created the directory");
    assert!(outcome.resumed().is_none());
    assert_eq!(
        outcome.to_string(),
        format!("no valid checkpoint in {}: starting fresh", sub.display())
    );
    assert!(
        log.contains("INFO") && log.contains("starting fresh"),
        "{log}"
    );
}

#[test]
fn saving_the_same_step_twice_replaces_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (second, loaded) = run_ranks(1, |pg| {
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        save_random(&ckpt, TrainingState::new(0, 1));
        let (_, second) = save_random(&ckpt, TrainingState::new(1, 1));
        let (outcome, model) = load_latest_fresh(&ckpt);
        assert_eq!(outcome.resumed().expect("resumed").state.epoch, 1);
        (second, flat_params(&model))
    })
    .remove(0);
    assert!(bitwise_eq(&second, &loaded));
    assert_eq!(
        entries_with_prefix(dir.path(), ""),
        vec![
            LATEST_FILE.to_string(),
            LOCK_FILE.to_string(),
            checkpoint_name(1)
        ]
    );
}
