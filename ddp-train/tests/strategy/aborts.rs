//! The group is aborted at once when a rank fails: a panic outside the training step, or an
//! error while the rank's loader thread is still inside a slow `get`, reaches the other ranks
//! with its message instead of at the timeout.

use crate::fixture::*;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::Backend;
use ddp_core::comm::ProcessGroup;
use ddp_examples::digits::{DigitDataset, DigitItem};
use ddp_train::{DdpReport, DdpStrategy};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A learning rate that panics on its `panic_at`-th step: the user's code failing on one rank
/// outside the training step (which ddp-core guards itself).
#[derive(Clone, Debug)]
struct PanicAt {
    lr: f64,
    steps: usize,
    panic_at: Option<usize>,
}

impl LrScheduler for PanicAt {
    type Record<Bk: Backend> = f64;
    fn step(&mut self) -> f64 {
        self.steps += 1;
        if Some(self.steps) == self.panic_at {
            panic!("the scheduler gave up at step {}", self.steps);
        }
        self.lr
    }
    fn to_record<Bk: Backend>(&self) -> f64 {
        self.lr
    }
    fn load_record<Bk: Backend>(mut self, record: f64) -> Self {
        self.lr = record;
        self
    }
}

/// Opens once; until then `wait` blocks (no timing: the test opens it).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }
    fn wait(&self) {
        let mut open = self.open.lock().expect("gate");
        while !*open {
            open = self.opened.wait(open).expect("gate");
        }
    }
}

/// Opens the gate when dropped, also when the holder panics.
struct OpenOnDrop<'a>(&'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The digits, whose `get` waits at `gate` from its call number `block_from` (0-based) on: a
/// slow data set, so the loader thread is inside `get` when the epoch ends.
struct Gated<'a> {
    items: Vec<DigitItem>,
    calls: std::sync::atomic::AtomicUsize,
    block_from: Option<usize>,
    gate: &'a Gate,
}

impl burn::data::dataset::Dataset<DigitItem> for Gated<'static> {
    fn get(&self, index: usize) -> Option<DigitItem> {
        let call = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.block_from.is_some_and(|from| call >= from) {
            self.gate.wait();
        }
        self.items.get(index).cloned()
    }
    fn len(&self) -> usize {
        self.items.len()
    }
}

/// Two epochs (batches of 16 per rank) over `train_set`, with `scheduler` and the strategy
/// passed through `adjust`; also the message of a panic that ended `launch`.
fn outcome_over<S: LrScheduler + 'static>(
    pg: ProcessGroup,
    dir: &Path,
    train_set: Gated<'static>,
    scheduler: S,
    adjust: impl FnOnce(DdpStrategy) -> DdpStrategy,
) -> (ddp_train::Result<DdpReport>, Option<String>) {
    let (train, valid) = loaders(&pg, train_set, 16, DigitDataset(data().1), 16).expect("loaders");
    let strategy = adjust(DdpStrategy::new(pg));
    let launched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (train, valid) = (Arc::new(train), Arc::new(valid));
        launch_two_epochs(dir, train, valid, &strategy, classifier(32), scheduler)
    }));
    let panic = launched.err().map(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".into())
    });
    (strategy.finish(), panic)
}

/// The digits' training images, waiting at `gate` from `get` call `block_from` on.
fn gated(gate: &'static Gate, block_from: Option<usize>) -> Gated<'static> {
    Gated {
        items: data().0,
        calls: Default::default(),
        block_from,
        gate,
    }
}

/// A panic on rank 1 outside the training step (its LR scheduler): it aborts the group with
/// the panic's message before unwinding on, so rank 0 fails at once quoting it (not at the
/// timeout, not with a bare "connection closed"), and `finish` on rank 1 reports it.
#[test]
fn a_panic_on_one_rank_aborts_the_group_with_its_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate: &'static Gate = Box::leak(Box::default());
    let results = run_ranks(2, |pg| {
        let panic_at = (pg.rank() == 1).then_some(3);
        let scheduler = PanicAt {
            lr: 0.1,
            steps: 0,
            panic_at,
        };
        outcome_over(pg, dir.path(), gated(gate, None), scheduler, |s| s)
    });
    let message = "the scheduler gave up at step 3";
    let (rank0, panic0) = &results[0];
    assert_eq!(panic0, &None, "rank 0 did not panic");
    let error = rank0.as_ref().expect_err("rank 0 must fail").to_string();
    assert!(
        error.contains(&format!("rank 1 panicked: {message}")),
        "rank 0: {error}"
    );
    let (rank1, panic1) = &results[1];
    assert_eq!(
        panic1.as_deref(),
        Some(message),
        "rank 1's panic unwinds on"
    );
    let error = rank1.as_ref().expect_err("rank 1 failed").to_string();
    assert!(error.contains(message), "rank 1: {error}");
}

/// Rank 0 fails (its mid-epoch checkpoint cannot be written: `checkpoint/steps` is a file)
/// while its loader thread is inside a slow `get`: it aborts the group before joining that
/// thread, so rank 1 fails at once quoting rank 0's reason. Rank 1 opens the gate only after
/// it has its result, so without the early abort rank 1 would wait for the timeout.
#[test]
fn a_failing_rank_aborts_the_group_before_waiting_for_its_loader_thread() {
    let dirs = two_dirs();
    let checkpoint = dirs[0].path().join("checkpoint");
    std::fs::create_dir_all(&checkpoint).expect("dir");
    std::fs::write(checkpoint.join("steps"), b"not a directory").expect("file");
    let gate: &'static Gate = Box::leak(Box::default());
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let dir = own_dir(&dirs, &pg);
        // Rank 0's batch 4 (after the checkpoint due at step 3) never loads until opened.
        let block_from = (rank == 0).then_some(3 * 16);
        let _open = (rank == 1).then(|| OpenOnDrop(gate));
        let (result, panic) = outcome_over(pg, &dir, gated(gate, block_from), 0.1, |s| {
            s.with_checkpoints(&dir).with_checkpoint_every_n_steps(3)
        });
        assert_eq!(panic, None, "rank {rank} panicked");
        result
    });
    let error = results[0]
        .as_ref()
        .expect_err("rank 0's checkpoint write fails")
        .to_string();
    assert!(error.contains("creating the directory"), "rank 0: {error}");
    let error = results[1]
        .as_ref()
        .expect_err("rank 1 fails with rank 0")
        .to_string();
    assert!(
        error.contains("aborted") && error.contains("creating the directory"),
        "rank 1: {error}"
    );
}
