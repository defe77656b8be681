//! Mid-epoch checkpoints and resuming inside an epoch: the uninterrupted weights, with the
//! loader or the strategy skipping the steps taken, with gradient accumulation; a loader and
//! strategy at different positions refused; a step checkpoint re-saved and cut short never
//! counted as a mix of two runs.

use crate::fixture::*;
use burn::optim::SgdConfig;
use burn_train::{Learner, SupervisedTraining};
use ddp_examples::digits::DigitDataset;
use ddp_train::{DdpStrategy, DistributedTrainingExt};
use std::sync::Arc;

/// Epoch 3 of a run with mid-epoch checkpoints (every 3 of its 8 steps) was cut after step 6:
/// its epoch-end files are removed, so rank 0's latest checkpoint is epoch 3's step 6.
fn run_cut_inside_epoch_3(dirs: &[tempfile::TempDir; 2], setup: &Setup) -> Vec<Run> {
    let first = train_in_own_dirs(dirs, setup);
    for kind in ["model", "optim", "scheduler"] {
        std::fs::remove_file(dirs[0].path().join(format!("checkpoint/{kind}-3.mpk")))
            .expect("epoch 3's checkpoint");
    }
    first
}

#[test]
fn a_run_resumed_inside_an_epoch_ends_with_the_uninterrupted_weights() {
    // Each rank has its own directory (only rank 0 writes), SGD momentum and a decaying
    // learning rate: model, optimizer, scheduler and the loader's position must all come back
    // from rank 0's mid-epoch checkpoint, for both ways of skipping the steps already taken.
    let straight = tempfile::tempdir().expect("tempdir");
    let setup = |resume, loader_resumes| Setup {
        resume,
        loader_resumes,
        rank0_checkpoints: true,
        every_n_steps: 3,
        momentum: Some(0.9),
        gamma: 0.97,
        lr: 0.2,
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| train(pg, straight.path(), &setup(false, false)));
    assert_eq!(
        full[0].report.step_checkpoints, 6,
        "steps 3 and 6 of 3 epochs"
    );
    assert_eq!(full[1].report.step_checkpoints, 0, "rank 0 alone writes");
    for loader_resumes in [true, false] {
        let dirs = two_dirs();
        run_cut_inside_epoch_3(&dirs, &setup(false, false));
        let resumed = train_in_own_dirs(&dirs, &setup(true, loader_resumes));
        for rank in 0..2 {
            let report = &resumed[rank].report;
            assert_eq!(
                report.resumed_from,
                Some(ddp_train::ResumePoint {
                    epochs_done: 2,
                    steps_done: 6
                }),
                "rank {rank}"
            );
            assert_eq!(report.last_epoch, 3);
            assert_eq!(
                report.optimizer_steps, 2,
                "rank {rank} (loader resumes: {loader_resumes}): steps 7 and 8 of epoch 3"
            );
            assert_eq!(
                resumed[rank].params, full[rank].params,
                "rank {rank} (loader resumes: {loader_resumes}): resumed != straight"
            );
        }
    }
}

#[test]
fn a_loader_resuming_inside_an_epoch_without_the_strategy_fails_on_every_rank() {
    let dirs = two_dirs();
    let setup = Setup {
        rank0_checkpoints: true,
        every_n_steps: 3,
        batch_per_rank: 16,
        ..base()
    };
    run_cut_inside_epoch_3(&dirs, &setup);
    let errors = run_ranks(2, |pg| {
        let dir = own_dir(&dirs, &pg);
        let point = ddp_train::resume_point(&pg, &dir).expect("resume point");
        let (train_items, test_items) = data();
        let (train, valid) = loaders(
            &pg,
            DigitDataset(train_items),
            16,
            DigitDataset(test_items),
            16,
        )
        .expect("loaders");
        let train = train.with_resume(point);
        // The strategy is told epoch 2's end only: the loader is 6 steps further.
        let strategy = DdpStrategy::new(pg).with_checkpoints(&dir);
        let scheduler = Decay {
            lr: 0.5,
            gamma: 1.0,
        }; // as the run that wrote the files
        let learner = Learner::new(model(3), SgdConfig::new().init(), scheduler);
        SupervisedTraining::new(&dir, Arc::new(train), Arc::new(valid))
            .num_epochs(3)
            .with_application_logger(None)
            .checkpoint(2)
            .distributed(&strategy)
            .launch(learner);
        strategy
            .finish()
            .expect_err("a mismatched resume")
            .to_string()
    });
    assert!(
        errors[0].contains("starts at item") && errors[0].contains("with_resume"),
        "rank 0: {}",
        errors[0]
    );
    // Rank 1 fails too (the same check, or rank 0's abort), never hangs.
    assert!(!errors[1].is_empty());
}

#[test]
fn a_run_with_gradient_accumulation_resumed_inside_an_epoch_ends_with_the_uninterrupted_weights() {
    // 8 micro-batches per epoch, 2 per optimizer step: checkpoints after optimizer step 3
    // (micro-batch 6) of each epoch, never between the micro-batches of one optimizer step.
    let straight = tempfile::tempdir().expect("tempdir");
    let dirs = two_dirs();
    let setup = |resume| Setup {
        resume,
        loader_resumes: true,
        rank0_checkpoints: true,
        every_n_steps: 3,
        accumulation: Some(2),
        momentum: Some(0.9),
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| train(pg, straight.path(), &setup(false)));
    assert_eq!(full[0].report.step_checkpoints, 3, "one per epoch");
    run_cut_inside_epoch_3(&dirs, &setup(false));
    let resumed = train_in_own_dirs(&dirs, &setup(true));
    for rank in 0..2 {
        let report = &resumed[rank].report;
        let point = report.resumed_from.expect("resumed");
        assert_eq!((point.epochs_done, point.steps_done), (2, 6), "rank {rank}");
        assert_eq!(
            report.optimizer_steps, 1,
            "rank {rank}: micro-batches 7 and 8"
        );
        assert_eq!(
            resumed[rank].params, full[rank].params,
            "rank {rank}: resumed != straight"
        );
    }
}

/// A run resumed from an epoch end takes the steps of a mid-epoch checkpoint already in the
/// directory again: when the re-save fails after the records were replaced (here its position
/// cannot be written), the old checkpoint no longer counts (its files are a mix of two runs).
#[test]
fn a_step_checkpoint_saved_again_and_cut_short_is_incomplete_not_a_mix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let every_6 = |s: DdpStrategy| s.with_checkpoint_every_n_steps(6);
    let first = run_ranks(1, |pg| outcome_with(pg, dir.path(), 32, 32, true, every_6)).remove(0);
    assert!(first.is_ok(), "{first:?}");
    let checkpoint = dir.path().join("checkpoint");
    for kind in ["model", "optim", "scheduler"] {
        std::fs::remove_file(checkpoint.join(format!("{kind}-2.mpk"))).expect("epoch 2's files");
    }
    let point = |epochs_done, steps_done| ddp_train::ResumePoint {
        epochs_done,
        steps_done,
    };
    let latest = || {
        run_ranks(1, |pg| {
            ddp_train::resume_point(&pg, dir.path()).expect("readable")
        })
        .remove(0)
    };
    assert_eq!(latest(), Some(point(1, 6)), "epoch 2's step 6");
    let steps = checkpoint.join("steps");
    let model = steps.join("model-2-6.mpk");
    let old_model = std::fs::read(&model).expect("the step's model");
    // Where the re-save writes the position before renaming it into place.
    let tmp = steps.join(format!(".tmp-position-2-6.txt-{}", std::process::id()));
    std::fs::create_dir(&tmp).expect("blocking the position's write");
    let again = run_ranks(1, |pg| {
        outcome_with(pg, dir.path(), 32, 32, true, |s| {
            every_6(s).with_resume(Some(point(1, 0)))
        })
    })
    .remove(0);
    let error = again
        .expect_err("the position cannot be written")
        .to_string();
    assert!(error.contains("position"), "{error}");
    assert_ne!(
        std::fs::read(&model).expect("the step's model"),
        old_model,
        "the re-save replaced the model (this loader reshuffles epoch 2 as its first)"
    );
    assert_eq!(
        latest(),
        Some(point(1, 0)),
        "the mixed step checkpoint counted"
    );
}
