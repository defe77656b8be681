//! A data error (a data set returning `None` below its length) fails the run on every rank,
//! naming the data set's own index, instead of ending an epoch early; outside the strategy the
//! loader panics with it, as burn's loaders do.

use crate::fixture::*;
use burn::backend::Flex;
use burn::data::dataloader::DataLoader;
use ddp_core::comm::ProcessGroup;
use ddp_core::data::DataError;
use ddp_train::{DdpReport, DistributedLoader};
use std::path::Path;
use std::sync::Arc;

/// Two epochs over the digits, with `get` returning `None` at `train_missing` of the training
/// set and at `valid_missing` of the validation set; `abort` gives the loaders the group.
fn outcome_with_holes(
    pg: ProcessGroup,
    dir: &Path,
    train_missing: Option<usize>,
    valid_missing: Option<usize>,
    abort: bool,
) -> ddp_train::Result<DdpReport> {
    let (train_items, test_items) = data();
    let (mut train, mut valid) = loaders(
        &pg,
        Holey {
            items: train_items,
            missing: train_missing,
        },
        16,
        Holey {
            items: test_items,
            missing: valid_missing,
        },
        16,
    )?;
    if abort {
        train = train.with_abort_group(pg.clone());
        valid = valid.with_abort_group(pg.clone());
    }
    outcome_with_loaders(pg, dir, Arc::new(train), Arc::new(valid))
}

/// A hole the data-error tests make in the digits, and what the error must name.
struct Hole {
    /// The index of the training set whose `get` returns `None`, if any.
    train_missing: Option<usize>,
    /// The index of the validation set whose `get` returns `None`, if any.
    valid_missing: Option<usize>,
    /// The loader that fails: `"training"` or `"validation"`.
    what: &'static str,
    /// The index and the data set's length the error names.
    index: usize,
    len: usize,
}

/// Training: index 5 is in one rank's shard of epoch 0 (256 samples, no padding). Validation:
/// 41 is rank 1's 21st sample (1, 3, ..., 41), in its shard of 50.
const HOLES: [Hole; 2] = [
    Hole {
        train_missing: Some(5),
        valid_missing: None,
        what: "training",
        index: 5,
        len: 256,
    },
    Hole {
        train_missing: None,
        valid_missing: Some(41),
        what: "validation",
        index: 41,
        len: 100,
    },
];

impl Hole {
    /// Each rank's outcome of two epochs on `world` ranks with this hole (the loaders without
    /// the abort group).
    fn outcomes(&self, world: usize) -> Vec<ddp_train::Result<DdpReport>> {
        let dir = tempfile::tempdir().expect("tempdir");
        run_ranks(world, |pg| {
            outcome_with_holes(
                pg,
                dir.path(),
                self.train_missing,
                self.valid_missing,
                false,
            )
        })
    }

    /// The error message this hole makes.
    fn message(&self) -> String {
        missing(self.index, self.len)
    }
}

/// The message of ddp-data's `MissingItem` for `index` of a data set of `len`.
fn missing(index: usize, len: usize) -> String {
    format!("no item for index {index} although its len() is {len}")
}

#[test]
fn a_data_error_fails_a_one_process_run_instead_of_ending_the_epoch_early() {
    for hole in &HOLES {
        let what = hole.what;
        let results = hole.outcomes(1);
        match &results[0] {
            Err(
                e @ ddp_train::DdpTrainError::Loading {
                    epoch: 1,
                    what: failed,
                    sampler_epoch: 0,
                    source: DataError::MissingItem { .. },
                },
            ) => {
                assert_eq!(*failed, what, "{e}");
                assert!(e.to_string().contains(&hole.message()), "{e}");
            }
            other => panic!("{what}: expected the data error, got {other:?}"),
        }
    }
}

/// Without an abort group on the loaders: the rank whose data failed reports the data error,
/// the other one the group's abort quoting it (not "uneven batches", not a silently shorter
/// validation set); the index is the data set's own, also for rank 1's evaluation shard.
#[test]
fn a_data_error_on_one_rank_fails_every_rank_naming_it() {
    for hole in &HOLES {
        let what = hole.what;
        let results = hole.outcomes(2);
        for (rank, r) in results.iter().enumerate() {
            let err = r.as_ref().expect_err("a data error must fail every rank");
            assert!(
                err.to_string().contains(&hole.message()),
                "{what}, rank {rank}: {err}"
            );
        }
        let failed: Vec<usize> = (0..2)
            .filter(|&r| {
                matches!(&results[r], Err(ddp_train::DdpTrainError::Loading { what: w, .. }) if *w == what)
            })
            .collect();
        assert_eq!(failed.len(), 1, "{what}: {results:?}");
        if what == "validation" {
            assert_eq!(failed, [1], "{results:?}");
        }
    }
}

/// With the loaders' abort group too: every rank fails with the data error's text.
#[test]
fn a_data_error_with_the_abort_group_fails_every_rank_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        outcome_with_holes(pg, dir.path(), Some(5), None, true)
    });
    for (rank, r) in results.iter().enumerate() {
        let err = r.as_ref().expect_err("a data error must fail every rank");
        assert!(
            err.to_string().contains(&missing(5, 256)),
            "rank {rank}: {err}"
        );
    }
}

/// Outside the strategy, a failed epoch panics with its error (as burn's loaders do) instead
/// of ending early; an evaluation shard's (and a slice's) error names the data set's index and
/// length, not the shard's.
#[test]
fn a_loader_iterated_by_anything_else_panics_with_the_data_sets_index() {
    let eval = DistributedLoader::<Flex, _, _>::eval(
        Holey {
            items: (0..1000).collect::<Vec<usize>>(),
            missing: Some(401),
        },
        Ids,
        8,
        4,
        1,
    )
    .expect("eval loader");
    let sliced = eval.slice(200, 1000);
    let loaders: [(&str, &dyn DataLoader<Flex, Vec<usize>>); 2] =
        [("eval", &eval), ("slice", &*sliced)];
    for (name, loader) in loaders {
        let panic =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader.iter().count()))
                .expect_err("the failed epoch must not just end");
        let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains(&missing(401, 1000)), "{name}: {text}");
        assert!(text.contains("validation data loader"), "{name}: {text}");
    }
}
