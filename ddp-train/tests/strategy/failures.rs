//! Ranks that disagree or fail fail together: uneven batches, a checkpoint rank 0 cannot
//! write, a checkpoint directory another job holds, different models. Every rank gets an
//! error naming the cause, none hangs.

use crate::fixture::*;

#[test]
fn ranks_with_different_numbers_of_batches_fail_together_instead_of_hanging() {
    // Rank 0 has 8 batches of 16, rank 1 4 batches of 32: step 5 finds rank 1 without a batch.
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let batch = if pg.rank() == 0 { 16 } else { 32 };
        outcome(pg, dir.path(), batch, 32, false)
    });
    for (rank, r) in results.iter().enumerate() {
        let err = r
            .as_ref()
            .expect_err("uneven batches must fail")
            .to_string();
        assert!(
            err.contains("ranks [1] have no batch left") || err.contains("abort"),
            "rank {rank}: {err}"
        );
    }
    assert!(
        results.iter().any(|r| matches!(
            r,
            Err(ddp_train::DdpTrainError::UnevenBatches { step: 5, .. })
        )),
        "{results:?}"
    );
}

/// Rank 0 cannot write its checkpoints (`checkpoint` is a file there): the run fails on every
/// rank, with rank 0's reason, not on rank 0 alone while the others report success.
#[test]
fn a_checkpoint_rank0_cannot_write_fails_the_run_on_every_rank() {
    let dirs = two_dirs();
    std::fs::write(dirs[0].path().join("checkpoint"), b"not a directory").expect("file");
    let results = run_ranks(2, |pg| {
        let dir = own_dir(&dirs, &pg);
        outcome(pg, &dir, 16, 32, true)
    });
    for (rank, r) in results.iter().enumerate() {
        let err = r
            .as_ref()
            .expect_err("a failed checkpoint write must fail every rank")
            .to_string();
        assert!(err.contains("checkpoint"), "rank {rank}: {err}");
    }
}

/// Another job holds the checkpoint directory (here: this test, through ddp-core's lock):
/// the run fails on every rank naming the holder, before anything there is read or removed.
#[test]
fn a_checkpoint_directory_another_job_holds_fails_the_run_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let leftover = dir.path().join("checkpoint").join(".tmp-model-1.mpk-999");
    std::fs::create_dir_all(leftover.parent().expect("parent")).expect("dir");
    std::fs::write(&leftover, b"the other job's write in progress").expect("file");
    let held = ddp_core::checkpoint::lock_dir(dir.path()).expect("the other job's lock");
    let results = run_ranks(2, |pg| outcome(pg, dir.path(), 16, 32, true));
    for (rank, r) in results.iter().enumerate() {
        let err = r
            .as_ref()
            .expect_err("a locked directory must fail every rank")
            .to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "rank {rank}: {err}"
        );
    }
    assert!(leftover.exists(), "the other job's file was removed");
    // Without the lock (a file system that has none), the run goes on beside the holder.
    let unlocked = run_ranks(2, |pg| {
        outcome_with(pg, dir.path(), 16, 32, true, |s| s.with_dir_lock(false))
    });
    for (rank, r) in unlocked.iter().enumerate() {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    drop(held);
}

#[test]
fn ranks_with_different_models_fail_before_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let hidden = if pg.rank() == 0 { 32 } else { 64 };
        outcome(pg, dir.path(), 16, hidden, false)
    });
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(ddp_train::DdpTrainError::ModelMismatch(why)) => {
                assert!(why.contains("ranks [1] differ"), "rank {rank}: {why}")
            }
            other => panic!("rank {rank}: expected a model mismatch, got {other:?}"),
        }
    }
}
