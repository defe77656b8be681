//! The strategy against one process with the global batch: the same weights (within float
//! error), the same metrics on rank 0, gradients all-reduced during backward, gradient
//! accumulation as `no_sync`, and rank 0's early stopping followed by every rank.

use crate::fixture::*;
use ddp_core::DdpConfig;

#[test]
fn two_ranks_match_one_process_with_the_global_batch() {
    let dir1 = tempfile::tempdir().expect("tempdir");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let one = run_ranks(1, |pg| train(pg, dir1.path(), &base())).remove(0);
    let two = run_ranks(2, |pg| {
        train(
            pg,
            dir2.path(),
            &Setup {
                batch_per_rank: 16,
                ..base()
            },
        )
    });
    // Both ranks hold the same model, bitwise (they apply the same averaged gradients).
    assert_eq!(two[0].params, two[1].params, "ranks diverged");
    let diff = max_scaled_diff(&two[0].params, &one.params);
    eprintln!("world 2 vs world 1: max scaled parameter difference {diff:e}");
    eprintln!(
        "world 1 metrics per epoch (train loss, train acc, valid loss, valid acc): {:?}",
        one.metrics
    );
    eprintln!(
        "world 2 metrics per epoch (rank 0):                                      {:?}",
        two[0].metrics
    );
    assert!(
        diff < 1e-5,
        "world 2 vs world 1: parameters differ by {diff:e} (scaled)"
    );
    assert_ne!(
        one.params,
        flat_params::<B, _>(&model(3)),
        "training changed nothing"
    );
    for r in &two {
        assert_eq!(r.report.last_epoch, 3);
        assert_eq!(r.report.optimizer_steps, 24); // 256 / 32 per epoch, 3 epochs
    }
    // Metrics over the global batch: rank 0 of world 2 reports what world 1 does.
    assert_eq!(one.metrics.len(), 3);
    assert_eq!(two[0].metrics.len(), 3);
    assert!(
        two[1].metrics.is_empty(),
        "rank 1 must not evaluate metrics"
    );
    for (epoch, (a, b)) in two[0].metrics.iter().zip(&one.metrics).enumerate() {
        let pairs = [
            (a.0, b.0, "train loss"),
            (a.1, b.1, "train accuracy"),
            (a.2, b.2, "valid loss"),
            (a.3, b.3, "valid accuracy"),
        ];
        for (x, y, what) in pairs {
            assert!(
                x.is_finite() && y.is_finite(),
                "epoch {}: {what} missing ({x}, {y})",
                epoch + 1
            );
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "epoch {}: {what}: world 2 {x} vs world 1 {y}",
                epoch + 1
            );
        }
    }
}

/// The gradient all-reduce overlaps burn's backward: every bucket's all-reduce is issued from
/// inside the user's `TrainStep::step` (its plain `loss.backward()`), by the taps, none after it
/// returned; and the result is the one of the default (coarser) layout. Deterministic: counts
/// of buckets, not timings.
#[test]
fn buckets_are_all_reduced_during_the_train_steps_backward() {
    let dir1 = tempfile::tempdir().expect("tempdir");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let setup = |ddp| Setup {
        batch_per_rank: 16,
        epochs: 1,
        ddp,
        ..base()
    };
    let small = DdpConfig::new()
        .with_bucket_cap_mb(0.004)
        .with_first_bucket_cap_mb(0.001);
    let split = run_ranks(2, |pg| train(pg, dir1.path(), &setup(Some(small.clone()))));
    let whole = run_ranks(2, |pg| train(pg, dir2.path(), &setup(None)));
    for (rank, r) in split.iter().enumerate() {
        let per_step = r.report.buckets / r.report.optimizer_steps;
        eprintln!(
            "rank {rank}: {} optimizer steps, {} buckets, {} launched during backward",
            r.report.optimizer_steps, r.report.buckets, r.report.buckets_launched_during_backward
        );
        assert_eq!(r.report.optimizer_steps, 8); // 256 / 32 per epoch
        assert!(per_step >= 3, "rank {rank}: {per_step} buckets per step");
        assert_eq!(
            r.report.buckets_launched_during_backward, r.report.buckets,
            "rank {rank}: every bucket is issued during backward"
        );
    }
    for r in &whole {
        assert!(r.report.buckets >= r.report.optimizer_steps);
        assert_eq!(r.report.buckets_launched_during_backward, r.report.buckets);
    }
    assert_eq!(split[0].params, split[1].params, "ranks diverged");
    let diff = max_scaled_diff(&split[0].params, &whole[0].params);
    assert!(diff < 1e-6, "bucket layout changed the result by {diff:e}");
}

#[test]
fn gradient_accumulation_is_no_sync_then_one_all_reduce() {
    // 2 ranks x 2 micro-batches of 8, gradients summed locally then averaged over ranks, equal
    // twice the mean gradient of the global batch of 32: one process with batch 32 and twice
    // the learning rate takes the same steps.
    let dir1 = tempfile::tempdir().expect("tempdir");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let one = run_ranks(1, |pg| train(pg, dir1.path(), &Setup { lr: 0.5, ..base() })).remove(0);
    let two = run_ranks(2, |pg| {
        train(
            pg,
            dir2.path(),
            &Setup {
                batch_per_rank: 8,
                lr: 0.25,
                accumulation: Some(2),
                ..base()
            },
        )
    });
    assert_eq!(two[0].params, two[1].params, "ranks diverged");
    let diff = max_scaled_diff(&two[0].params, &one.params);
    eprintln!("accumulated world 2 vs world 1: max scaled parameter difference {diff:e}");
    assert!(
        diff < 1e-5,
        "accumulated world 2 vs world 1: differ by {diff:e} (scaled)"
    );
    for r in &two {
        assert_eq!(r.report.train_steps, 48);
        assert_eq!(r.report.optimizer_steps, 24);
    }
}

#[test]
fn early_stopping_decided_by_rank0_stops_every_rank_in_the_same_epoch() {
    // Learning rate 0: the validation loss stays flat, so "no improvement since 1 epoch" fires
    // after epoch 2, on rank 0 (the only rank with metrics); rank 1 must stop there too instead
    // of waiting in epoch 3's first collective.
    let dirs = two_dirs();
    let runs = train_in_own_dirs(
        &dirs,
        &Setup {
            epochs: 6,
            lr: 0.0,
            stop_when_flat: true,
            checkpoints: true,
            ..base()
        },
    );
    for (rank, r) in runs.iter().enumerate() {
        assert_eq!(
            r.report.stopped_early_at,
            Some(2),
            "rank {rank}: {:?}",
            r.report
        );
        assert_eq!(r.report.last_epoch, 2, "rank {rank}");
        assert_eq!(r.report.optimizer_steps, 4 * 2, "rank {rank}"); // 256 / 64 per epoch
    }
    // Rank 0 alone writes burn-train's checkpoints.
    let listing = |rank: usize| checkpoint_files(dirs[rank].path());
    // burn-train's checkpointer has joined its writer thread when `launch` returns.
    let rank0 = listing(0);
    assert!(
        rank0.iter().any(|f| f.starts_with("model-2")),
        "rank 0 wrote {rank0:?}"
    );
    assert!(
        listing(1).is_empty(),
        "rank 1 wrote checkpoints: {:?}",
        listing(1)
    );
}
