//! Resuming at an epoch end: bitwise the uninterrupted run, from rank 0's files without a
//! shared directory or from burn-train's checkpointer; and refused on every rank, saying why,
//! when the ranks disagree, nothing can be loaded, or burn's checkpoint is cut short.

use crate::fixture::*;
use burn::optim::SgdConfig;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn_train::metric::LossMetric;
use burn_train::{Learner, SupervisedTraining};
use ddp_core::comm::ProcessGroup;
use ddp_examples::digits::DigitDataset;
use ddp_train::{DdpReport, DdpStrategy, DistributedTrainingExt};
use std::path::Path;
use std::sync::Arc;

#[test]
fn a_resumed_run_continues_exactly_where_the_checkpoint_left_off() {
    // 3 epochs straight, vs 2 epochs, then a new run (as after a restart) resuming from the
    // latest checkpoint for the third: the same parameters, bitwise.
    let straight = tempfile::tempdir().expect("tempdir");
    let resumed = tempfile::tempdir().expect("tempdir");
    let with_checkpoints = |epochs, resume| Setup {
        epochs,
        checkpoints: true,
        resume,
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| {
        train(pg, straight.path(), &with_checkpoints(3, false))
    });
    let first = run_ranks(2, |pg| {
        train(pg, resumed.path(), &with_checkpoints(2, false))
    });
    assert_eq!(
        ddp_train::latest_checkpoint(resumed.path()).expect("readable"),
        Some(2)
    );
    let second = run_ranks(2, |pg| {
        train(pg, resumed.path(), &with_checkpoints(3, true))
    });
    assert_ne!(
        first[0].params, full[0].params,
        "the third epoch changed nothing"
    );
    for rank in 0..2 {
        assert_eq!(second[rank].report.last_epoch, 3);
        assert_eq!(
            second[rank].report.optimizer_steps, 8,
            "rank {rank}: one epoch of 8 steps"
        );
        assert_eq!(
            second[rank].params, full[rank].params,
            "rank {rank}: resumed != straight"
        );
    }
}

#[test]
fn ranks_without_a_shared_directory_resume_rank0s_model_optimizer_and_scheduler() {
    // Each rank has its own directory and only rank 0 writes, so rank 1's stays empty: a
    // resumed run must take the epoch, weights, momentum buffers and decayed learning rate
    // from rank 0 (the straight run shows any of them missing on rank 1 as a difference).
    let straight = tempfile::tempdir().expect("tempdir");
    let dirs = two_dirs();
    let setup = |epochs, resume| Setup {
        epochs,
        resume,
        rank0_checkpoints: true,
        momentum: Some(0.9),
        gamma: 0.97,
        lr: 0.2,
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| train(pg, straight.path(), &setup(3, false)));
    let first = train_in_own_dirs(&dirs, &setup(2, false));
    assert_eq!(
        checkpoint_files(dirs[0].path()),
        [
            "model-1.mpk",
            "model-2.mpk",
            "optim-1.mpk",
            "optim-2.mpk",
            "scheduler-1.mpk",
            "scheduler-2.mpk"
        ],
        "rank 0 wrote both epochs, nothing temporary left"
    );
    assert!(
        checkpoint_files(dirs[1].path()).is_empty(),
        "rank 1 wrote {:?}",
        checkpoint_files(dirs[1].path())
    );
    let second = train_in_own_dirs(&dirs, &setup(3, true));
    assert_ne!(
        first[0].params, full[0].params,
        "the third epoch changed nothing"
    );
    for rank in 0..2 {
        assert_eq!(second[rank].report.last_epoch, 3, "rank {rank}");
        assert_eq!(
            second[rank].report.optimizer_steps, 8,
            "rank {rank}: one epoch of 8 steps"
        );
        assert!(
            second[rank].params == full[rank].params,
            "rank {rank}: resumed != straight (max scaled difference {:e})",
            max_scaled_diff(&second[rank].params, &full[rank].params)
        );
    }
}

#[test]
fn ranks_told_to_resume_different_epochs_fail_together() {
    // Rank 1 resumes nothing while rank 0 resumes epoch 1 (as with per-rank
    // `latest_checkpoint` on unshared directories): an error on both, not a silent divergence.
    let dirs = two_dirs();
    let setup = |epochs, resume| Setup {
        epochs,
        resume,
        checkpoints: true,
        batch_per_rank: 16,
        ..base()
    };
    let _ = train_in_own_dirs(&dirs, &setup(1, false));
    let results = run_ranks(2, |pg| {
        let dir = own_dir(&dirs, &pg);
        let resume = ddp_train::latest_checkpoint(&dir).expect("readable");
        resume_outcome(pg, &dir, resume)
    });
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(ddp_train::DdpTrainError::Resume(why)) => {
                assert!(
                    why.contains("by rank: [after epoch 1, none]"),
                    "rank {rank}: {why}"
                )
            }
            other => panic!("rank {rank}: expected a resume error, got {other:?}"),
        }
    }
}

/// Two epochs resuming `resume` (burn-train's file checkpointer), returning the outcome.
fn resume_outcome(
    pg: ProcessGroup,
    dir: &Path,
    resume: Option<usize>,
) -> ddp_train::Result<DdpReport> {
    let (train_items, test_items) = data();
    let (train, valid) = loaders(
        &pg,
        DigitDataset(train_items),
        16,
        DigitDataset(test_items),
        16,
    )?;
    let strategy = DdpStrategy::new(pg);
    let mut training = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
        .metrics((LossMetric::new(),))
        .num_epochs(2)
        .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
        .with_application_logger(None);
    if let Some(epoch) = resume {
        training = training.checkpoint(epoch);
    }
    let _ = training.distributed(&strategy).launch(Learner::new(
        model(3),
        SgdConfig::new().init(),
        0.1,
    ));
    strategy.finish()
}

/// The strategy told to resume after epoch 1.
fn resume_after_epoch_1(strategy: DdpStrategy) -> DdpStrategy {
    strategy.with_resume(Some(ddp_train::ResumePoint {
        epochs_done: 1,
        steps_done: 0,
    }))
}

/// An epoch end given to resume from, with no checkpointer at all: refused on every rank (it
/// would train the next epoch from untrained weights while reporting a resume).
#[test]
fn resuming_an_epoch_end_without_a_checkpointer_is_refused_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        outcome_with(pg, dir.path(), 16, 32, false, resume_after_epoch_1)
    });
    refused_on_every_rank(
        &results,
        |e| matches!(e, ddp_train::DdpTrainError::Settings(_)),
        &[
            "resuming after epoch 1 needs a checkpoint",
            "with_checkpoints(dir)",
        ],
    );
}

/// Every rank failed with an error saying all of `says`, and one of them with the error
/// `is` accepts (each rank decides alike, but one may see the other's abort first).
fn refused_on_every_rank(
    results: &[ddp_train::Result<DdpReport>],
    is: impl Fn(&ddp_train::DdpTrainError) -> bool,
    says: &[&str],
) {
    for (rank, r) in results.iter().enumerate() {
        let error = r.as_ref().expect_err("refused").to_string();
        for part in says {
            assert!(error.contains(part), "rank {rank}: {error}");
        }
    }
    assert!(
        results.iter().any(|r| r.as_ref().is_err_and(&is)),
        "{results:?}"
    );
}

/// `with_checkpoints` on rank 0 only: rank 0 would broadcast its files while rank 1 went on to
/// the model check's all-gather. Refused on every rank, naming each rank's setting.
#[test]
fn ranks_resuming_with_and_without_with_checkpoints_are_refused_on_every_rank() {
    let dirs = two_dirs();
    for (rank, r) in run_ranks(2, |pg| {
        let dir = own_dir(&dirs, &pg);
        outcome(pg, &dir, 16, 32, true)
    })
    .iter()
    .enumerate()
    {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    let results = run_ranks(2, |pg| {
        let dir = own_dir(&dirs, &pg);
        let rank0 = pg.rank() == 0;
        outcome_with(pg, &dir, 16, 32, rank0, resume_after_epoch_1)
    });
    refused_on_every_rank(
        &results,
        |e| matches!(e, ddp_train::DdpTrainError::Settings(_)),
        &["by rank: [with_checkpoints, no checkpointer]"],
    );
}

/// burn-train's checkpointer writes in place, so a kill can leave a cut file, on which its
/// loader panics: every rank fails instead, naming the epoch and what to delete.
#[test]
fn a_cut_short_burn_checkpoint_fails_the_resume_on_every_rank_saying_what_to_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (rank, r) in run_ranks(2, |pg| resume_outcome(pg, dir.path(), None))
        .iter()
        .enumerate()
    {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    let model = dir.path().join("checkpoint/model-1.mpk");
    let len = std::fs::metadata(&model).expect("epoch 1's model").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .and_then(|f| f.set_len(len / 2))
        .expect("cutting the file");
    let results = run_ranks(2, |pg| resume_outcome(pg, dir.path(), Some(1)));
    refused_on_every_rank(
        &results,
        |e| matches!(e, ddp_train::DdpTrainError::Resume(_)),
        &[
            "checkpoint of epoch 1",
            "model checkpoint",
            "Delete those three files of epoch 1",
        ],
    );
}
