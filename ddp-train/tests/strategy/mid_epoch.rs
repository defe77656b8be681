//! Mid-epoch checkpoints and resuming inside an epoch: the uninterrupted weights, with the
//! loader or the strategy skipping the steps taken, with gradient accumulation; a loader and
//! strategy at different positions refused; a step checkpoint re-saved and cut short never
//! counted as a mix of two runs.

use crate::fixture::*;
use burn::optim::SgdConfig;
use burn_train::{Learner, SupervisedTraining};
use ddp_core::data::DistributedSamplerConfig;
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
    let inode = |path: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).expect("the step's model").ino()
    };
    let old_model = inode(&model);
    // Where the re-save writes the position before renaming it into place.
    let tmp = steps.join(format!(".tmp-position-2-6.txt-{}", std::process::id()));
    std::fs::create_dir(&tmp).expect("blocking the position's write");
    let again = run_ranks(1, |pg| {
        let (train_items, test_items) = data();
        let (train, valid) = loaders(
            &pg,
            DigitDataset(train_items),
            32,
            DigitDataset(test_items),
            16,
        )
        .expect("loaders");
        let train = train.with_resume(Some(point(1, 0)));
        let strategy = every_6(DdpStrategy::new(pg).with_checkpoints(dir.path()))
            .with_resume(Some(point(1, 0)));
        launch_two_epochs(
            dir.path(),
            Arc::new(train),
            Arc::new(valid),
            &strategy,
            classifier(32),
            0.1,
        );
        strategy.finish()
    })
    .remove(0);
    let error = again
        .expect_err("the position cannot be written")
        .to_string();
    assert!(error.contains("position"), "{error}");
    assert_ne!(
        inode(&model),
        old_model,
        "the re-save replaced the model (written anew, renamed into place)"
    );
    assert_eq!(
        latest(),
        Some(point(1, 0)),
        "the mixed step checkpoint counted"
    );
}

/// Resumes the run [`run_cut_inside_epoch_3`] left in `dirs` at `point` (rank 0's latest
/// when `None`), with the training loader `loader` builds for this rank; each rank's outcome.
fn resume_cut_run(
    dirs: &[tempfile::TempDir; 2],
    point: Option<ddp_train::ResumePoint>,
    loader: impl Fn(&ddp_core::comm::ProcessGroup, Option<ddp_train::ResumePoint>) -> TrainLoader + Sync,
) -> Vec<ddp_train::Result<ddp_train::DdpReport>> {
    run_ranks(2, |pg| {
        let dir = own_dir(dirs, &pg);
        let point = point.or_else(|| ddp_train::resume_point(&pg, &dir).expect("resume point"));
        let (_, test_items) = data();
        let valid = ValidLoader::eval(
            DigitDataset(test_items),
            ddp_examples::digits::DigitBatcher,
            16,
            pg.world_size(),
            pg.rank(),
        )
        .expect("valid loader");
        let train = loader(&pg, point).with_abort_group(pg.clone());
        let strategy = DdpStrategy::new(pg)
            .with_checkpoints(&dir)
            .with_checkpoint_every_n_steps(3)
            .with_resume(point);
        let scheduler = Decay {
            lr: 0.5,
            gamma: 1.0,
        }; // as the run that wrote the files
        let learner = Learner::new(model(3), SgdConfig::new().init(), scheduler);
        SupervisedTraining::new(&dir, Arc::new(train), Arc::new(valid))
            .num_epochs(3)
            .with_application_logger(None)
            .distributed(&strategy)
            .launch(learner);
        strategy.finish()
    })
}

/// The cut run's settings (16 per rank, mid-epoch checkpoints every 3 steps).
fn cut_setup() -> Setup {
    Setup {
        rank0_checkpoints: true,
        every_n_steps: 3,
        batch_per_rank: 16,
        ..base()
    }
}

/// A training loader over `items` with `sampler`'s settings for this rank, 16 per step.
fn digits_loader(
    pg: &ddp_core::comm::ProcessGroup,
    items: Vec<ddp_examples::digits::DigitItem>,
    sampler: impl Fn(DistributedSamplerConfig) -> DistributedSamplerConfig,
) -> TrainLoader {
    let config = sampler(DistributedSamplerConfig::new(pg.world_size(), pg.rank()).with_seed(42));
    TrainLoader::train(
        DigitDataset(items),
        ddp_examples::digits::DigitBatcher,
        16,
        config,
    )
    .expect("train loader")
}

/// A resume every rank refused with a [`DdpTrainError::Resume`](ddp_train::DdpTrainError)
/// whose text (on rank 0, which checks first or alone) has all of `needles`.
fn refused_with(results: &[ddp_train::Result<ddp_train::DdpReport>], needles: &[&str]) {
    match &results[0] {
        Err(ddp_train::DdpTrainError::Resume(why)) => {
            for needle in needles {
                assert!(why.contains(needle), "rank 0: `{needle}` not in: {why}");
            }
        }
        other => panic!("rank 0: expected a resume error, got {other:?}"),
    }
    // Rank 1 fails too (the same check, or rank 0's abort), never trains on.
    assert!(results[1].is_err(), "rank 1: {:?}", results[1]);
}

/// A training loader not told where the run resumes (neither `with_resume` nor
/// `with_start_epoch`) shuffles epoch 3 as sampler epoch 0: the item counts match, the order
/// does not. Refused on every rank, inside an epoch and at an epoch's end.
#[test]
fn a_loader_not_told_the_resume_epoch_is_refused_on_every_rank() {
    let dirs = two_dirs();
    run_cut_inside_epoch_3(&dirs, &cut_setup());
    let plain = |pg: &ddp_core::comm::ProcessGroup, _| digits_loader(pg, data().0, |s| s);
    for point in [
        None, // rank 0's latest: epoch 3, step 6
        Some(ddp_train::ResumePoint {
            epochs_done: 2,
            steps_done: 0,
        }),
    ] {
        let results = resume_cut_run(&dirs, point, plain);
        refused_with(
            &results,
            &[
                "epoch 3",
                "sampler epoch 0",
                "sampler epoch 2",
                "DistributedLoader::with_resume",
            ],
        );
    }
}

/// Resuming inside an epoch with another data set length, seed, shuffle or drop_last would
/// continue another order at the saved position (the item counts can still match): refused on
/// every rank, naming the setting and both values.
#[test]
fn a_mid_epoch_resume_with_another_data_order_is_refused_naming_what_differs() {
    let dirs = two_dirs();
    run_cut_inside_epoch_3(&dirs, &cut_setup());
    type Change = fn(DistributedSamplerConfig) -> DistributedSamplerConfig;
    let cases: [(usize, Change, &[&str]); 4] = [
        (
            250,
            |s| s,
            &["data set length 256 at the checkpoint, 250 now"],
        ),
        (
            256,
            |s| s.with_seed(43),
            &["sampler seed 42 at the checkpoint, 43 now"],
        ),
        (
            256,
            |s| s.with_shuffle(false),
            &["shuffle true at the checkpoint, false now"],
        ),
        (
            256,
            |s| s.with_drop_last(true),
            &["drop_last false at the checkpoint, true now"],
        ),
    ];
    for (len, change, needles) in cases {
        let results = resume_cut_run(&dirs, None, |pg, point| {
            let mut items = data().0;
            items.truncate(len);
            digits_loader(pg, items, change).with_resume(point)
        });
        let mut needles = needles.to_vec();
        needles.extend(["epoch 3, step 6", "same data set and sampler settings"]);
        refused_with(&results, &needles);
    }
}

/// A position file written before the data order was recorded still resumes (the order is
/// then not checked).
#[test]
fn a_position_file_without_the_data_order_still_resumes() {
    let dirs = two_dirs();
    run_cut_inside_epoch_3(&dirs, &cut_setup());
    let position = dirs[0].path().join("checkpoint/steps/position-3-6.txt");
    let text = std::fs::read_to_string(&position).expect("the position file");
    assert!(text.contains("seed=42"), "the order is recorded: {text}");
    let old: String = text
        .lines()
        .filter(|l| {
            ["epoch=", "step=", "world=", "items="]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&position, old).expect("an old-style position file");
    let results = resume_cut_run(&dirs, None, |pg, point| {
        digits_loader(pg, data().0, |s| s).with_resume(point)
    });
    for (rank, result) in results.iter().enumerate() {
        let report = result.as_ref().expect("resumed");
        assert_eq!(report.optimizer_steps, 2, "rank {rank}: steps 7 and 8");
    }
}
