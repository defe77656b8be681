//! Exact resume: stopping (after an epoch, or mid-epoch), saving, and resuming into a fresh
//! model, a fresh Adam and a fresh shuffled loader ends bitwise equal to an uninterrupted run,
//! for world sizes 1 and 2 (ranks as threads).
use crate::checkpoint_common::*;
use crate::common::{mlp_from, run_ranks};

/// Final parameters of every rank after the uninterrupted run.
fn uninterrupted(world: usize, init: &[u8]) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(world, |pg| {
        run(pg, init, dir.path(), Start::Init, Stop::Never)
    })
    .into_iter()
    .map(|r| {
        assert_eq!(
            r.steps as u64,
            EPOCHS * steps_per_epoch(world),
            "the reference run trains every step"
        );
        r.params
    })
    .collect()
}

fn steps_per_epoch(world: usize) -> u64 {
    (DATASET_LEN / world).div_ceil(BATCH_PER_RANK) as u64
}

/// Trains until `stop`, saves, then resumes (in fresh ranks) with `start`; returns every
/// rank's final parameters.
fn interrupted(world: usize, init: &[u8], stop: Stop, start: Start) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = run_ranks(world, |pg| run(pg, init, dir.path(), Start::Init, stop));
    let saved = first[0]
        .saved
        .clone()
        .expect("the first run saved a checkpoint");
    let sampler = saved.sampler.clone().expect("sampler state saved");
    match stop {
        Stop::AtStep(_) => assert!(
            sampler.position > 0 && !sampler.is_epoch_complete(),
            "a mid-epoch stop must save a mid-epoch position: {sampler:?}"
        ),
        Stop::AfterEpoch(_) => assert!(sampler.is_epoch_complete(), "{sampler:?}"),
        Stop::Never => unreachable!(),
    }
    let second = run_ranks(world, |pg| run(pg, init, dir.path(), start, Stop::Never));
    let total = first[0].steps + second[0].steps;
    assert_eq!(
        total as u64,
        EPOCHS * steps_per_epoch(world),
        "{stop:?}: steps before + after the resume"
    );
    let resumed = second[0].resumed.as_ref().expect("resumed");
    assert_eq!(
        resumed.state, saved,
        "the resumed training state is the saved one"
    );
    assert!(resumed.invalid.is_empty());
    assert!(!resumed.info.world_size_changed());
    second.into_iter().map(|r| r.params).collect()
}

fn check(world: usize, stop: Stop) {
    let init = init_bytes();
    let reference = uninterrupted(world, &init);
    let resumed = interrupted(world, &init, stop, Start::Resume);
    for rank in 0..world {
        assert!(
            bitwise_eq(&reference[rank], &reference[0]),
            "world {world}: reference rank {rank} differs from rank 0"
        );
        assert!(
            bitwise_eq(&resumed[rank], &reference[0]),
            "world {world}, {stop:?}: rank {rank} after the resume is not bitwise equal to the uninterrupted run"
        );
    }
}

#[test]
fn resume_after_one_epoch_is_bitwise_exact_world_1() {
    check(1, Stop::AfterEpoch(0));
}

#[test]
fn resume_after_one_epoch_is_bitwise_exact_world_2() {
    check(2, Stop::AfterEpoch(0));
}

#[test]
fn resume_mid_epoch_is_bitwise_exact_world_1() {
    // 8 steps per epoch: stop in the middle of epoch 1 (after epoch 0's 8 and 3 more).
    check(1, Stop::AtStep(11));
    // And in the middle of the first epoch.
    check(1, Stop::AtStep(3));
}

#[test]
fn resume_mid_epoch_is_bitwise_exact_world_2() {
    // 4 steps per epoch: stop after 2 steps of epoch 0, and after 1 step of epoch 1.
    check(2, Stop::AtStep(2));
    check(2, Stop::AtStep(5));
}

/// The test would pass vacuously if optimizer or sampler state did not matter: show that
/// dropping either changes the result.
#[test]
fn optimizer_and_sampler_state_both_matter() {
    let init = init_bytes();
    let reference = uninterrupted(2, &init);
    let no_optim = interrupted(
        2,
        &init,
        Stop::AtStep(2),
        Start::ResumeWithoutOptimizerState,
    );
    assert!(
        !bitwise_eq(&no_optim[0], &reference[0]),
        "resuming with a fresh Adam should differ from the uninterrupted run"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| {
        run(pg, &init, dir.path(), Start::Init, Stop::AtStep(2))
    });
    let no_loader = run_ranks(2, |pg| {
        run(
            pg,
            &init,
            dir.path(),
            Start::ResumeWithoutLoaderState,
            Stop::Never,
        )
    });
    assert!(
        !bitwise_eq(&no_loader[0].params, &reference[0]),
        "resuming without the loader position should differ from the uninterrupted run"
    );
}

/// Without a shared filesystem every rank has its own checkpoint directory and only rank 0's is
/// written; a later run resumes on every rank, bitwise exactly, because rank 0 sends the
/// checkpoint to the ranks whose directory is empty.
#[test]
fn resume_with_a_directory_per_rank_is_bitwise_exact_world_2() {
    let world = 2;
    let init = init_bytes();
    let reference = uninterrupted(world, &init);
    let dirs: Vec<tempfile::TempDir> = (0..world)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let own_dir = |rank: usize| dirs[rank].path().join("checkpoints");
    run_ranks(world, |pg| {
        let dir = own_dir(pg.rank());
        run(pg, &init, &dir, Start::Init, Stop::AfterEpoch(0))
    });
    let written = |rank: usize| -> Vec<String> {
        match std::fs::read_dir(own_dir(rank)) {
            Ok(entries) => entries
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    };
    assert!(
        written(0).contains(&ddp_core::checkpoint::LATEST_FILE.to_string()),
        "rank 0 wrote its checkpoint: {:?}",
        written(0)
    );
    assert_eq!(
        written(1),
        Vec::<String>::new(),
        "rank 1's directory stays empty"
    );

    let second = run_ranks(world, |pg| {
        let dir = own_dir(pg.rank());
        run(pg, &init, &dir, Start::Resume, Stop::Never)
    });
    for (rank, r) in second.iter().enumerate() {
        let resumed = r.resumed.as_ref().expect("resumed");
        assert_eq!(resumed.state.epoch, 0, "rank {rank}");
        assert!(
            bitwise_eq(&r.params, &reference[0]),
            "rank {rank} resumed from rank 0's checkpoint is not bitwise equal to the uninterrupted run"
        );
    }
    assert_eq!(written(1), Vec::<String>::new(), "rank 1 never writes");
}

/// Checkpoint files are deterministic: two identical runs write the same `model.safetensors`
/// bytes, and so do repeated saves of one model (burn hands its metadata over in a `HashMap`,
/// whose order differs between maps: eight saves would almost surely show it).
#[test]
fn identical_runs_write_identical_model_bytes() {
    use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, MODEL_FILE, TrainingState};
    let init = init_bytes();
    let model_bytes = |dir: &std::path::Path| -> Vec<u8> {
        let ckpt =
            std::fs::read_to_string(dir.join(ddp_core::checkpoint::LATEST_FILE)).expect("latest");
        std::fs::read(dir.join(ckpt.trim()).join(MODEL_FILE)).expect("model file")
    };
    let train_once = || {
        let dir = tempfile::tempdir().expect("tempdir");
        run_ranks(2, |pg| {
            run(pg, &init, dir.path(), Start::Init, Stop::AfterEpoch(0))
        });
        model_bytes(dir.path())
    };
    let (a, b) = (train_once(), train_once());
    assert!(
        !a.is_empty() && a == b,
        "two identical runs wrote different model bytes"
    );

    let dirs: Vec<tempfile::TempDir> = (0..8)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    run_ranks(1, |pg| {
        let model = mlp_from(&init);
        for dir in &dirs {
            let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone())
                .expect("checkpointer");
            ckpt.save(&model, &adam(), &TrainingState::new(0, 1))
                .expect("save");
        }
    });
    let first = model_bytes(dirs[0].path());
    for (i, dir) in dirs.iter().enumerate() {
        assert!(
            model_bytes(dir.path()) == first,
            "save {i} of the same model wrote different bytes"
        );
    }
}
