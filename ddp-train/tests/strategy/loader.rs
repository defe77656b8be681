//! `DistributedLoader` on its own and as the strategy uses it: each rank its shard, reshuffled
//! every epoch; exact evaluation shards; settings refused when the loader is built; moved to
//! the model's device once, the moved copy sharing the loader's epoch and resume point.

use crate::fixture::*;
use burn::backend::Flex;
use burn::data::dataloader::DataLoader;
use burn::data::dataset::InMemDataset;
use ddp_core::data::{DataError, DistributedSamplerConfig};
use ddp_examples::digits::DigitDataset;
use ddp_train::DistributedLoader;
use std::sync::{Arc, Mutex};

#[test]
fn the_loader_gives_each_rank_its_shard_and_reshuffles_every_epoch() {
    let epoch_of = |rank: usize, loader: &DistributedLoader<Flex, usize, Vec<usize>>| {
        let _ = rank;
        loader.iter().flatten().collect::<Vec<usize>>()
    };
    let loaders: Vec<_> = (0..2)
        .map(|rank| {
            DistributedLoader::train(
                InMemDataset::new((0..40).collect::<Vec<usize>>()),
                Ids,
                4,
                DistributedSamplerConfig::new(2, rank).with_seed(5),
            )
            .expect("loader")
            .with_num_workers(2)
        })
        .collect();
    let mut previous: Option<Vec<usize>> = None;
    for _epoch in 0..3 {
        let shards: Vec<Vec<usize>> = (0..2).map(|r| epoch_of(r, &loaders[r])).collect();
        assert_eq!(shards[0].len(), 20);
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..40).collect::<Vec<_>>(),
            "shards must cover the data set once"
        );
        if let Some(p) = &previous {
            assert_ne!(p, &shards[0], "no reshuffle between epochs");
        }
        previous = Some(shards[0].clone());
    }
    assert_eq!(loaders[0].num_items(), 40);
    // Evaluation shards: every sample once, no padding, uneven sizes allowed.
    let eval: Vec<Vec<usize>> = (0..2)
        .map(|rank| {
            let l = DistributedLoader::<Flex, _, _>::eval(
                InMemDataset::new((0..7).collect::<Vec<usize>>()),
                Ids,
                2,
                2,
                rank,
            )
            .expect("eval loader");
            l.iter().flatten().collect()
        })
        .collect();
    assert_eq!(eval, vec![vec![0, 2, 4, 6], vec![1, 3, 5]]);
}

/// A slice of a training loader splits its samples as the loader splits the data set: with
/// the sampler's `drop_last`, the tail that does not fill a shard is dropped, and
/// `num_items` counts what the ranks take (10 samples, 4 ranks: 2 each, 8 in all; padded: 3
/// each, 12 in all).
#[test]
fn a_slice_of_a_training_loader_keeps_the_samplers_drop_last() {
    for (drop_last, per_rank) in [(true, 2), (false, 3)] {
        let loaders: Vec<_> = (0..4)
            .map(|rank| {
                DistributedLoader::<Flex, _, _>::train(
                    InMemDataset::new((0..100).collect::<Vec<usize>>()),
                    Ids,
                    1,
                    DistributedSamplerConfig::new(4, rank)
                        .with_seed(3)
                        .with_drop_last(drop_last),
                )
                .expect("loader")
            })
            .collect();
        let mut taken = Vec::new();
        for (rank, loader) in loaders.iter().enumerate() {
            let sliced = loader.slice(20, 30);
            let case = format!("drop_last {drop_last}, rank {rank}");
            assert_eq!(sliced.num_items(), 4 * per_rank, "{case}");
            let items: Vec<usize> = sliced.iter().flatten().collect();
            assert_eq!(items.len(), per_rank, "{case}: {items:?}");
            assert!(
                items.iter().all(|i| (20..30).contains(i)),
                "{case}: {items:?}"
            );
            taken.extend(items);
        }
        taken.sort_unstable();
        taken.dedup();
        let expected = if drop_last { 8 } else { 10 };
        assert_eq!(taken.len(), expected, "drop_last {drop_last}: {taken:?}");
    }
}

/// An evaluation set smaller than the world leaves the last ranks without batches: an empty
/// epoch there, not a loading error that aborts the process group.
#[test]
fn an_eval_set_smaller_than_the_world_gives_the_last_ranks_empty_epochs() {
    let outcomes = run_ranks(1, |pg| {
        (0..4)
            .map(|rank| {
                let l = DistributedLoader::<Flex, _, _>::eval(
                    InMemDataset::new((0..3).collect::<Vec<usize>>()),
                    Ids,
                    2,
                    4,
                    rank,
                )
                .expect("eval loader")
                .with_abort_group(pg.clone());
                let items: Vec<usize> = l.iter().flatten().collect();
                (items, pg.barrier().map_err(|e| e.to_string()))
            })
            .collect::<Vec<_>>()
    });
    for (rank, (items, group)) in outcomes[0].iter().enumerate() {
        let expected: Vec<usize> = (rank..3).step_by(4).collect();
        assert_eq!(items, &expected, "rank {rank}");
        assert!(group.is_ok(), "rank {rank} aborted the group: {group:?}");
    }
}

#[test]
fn a_batch_size_of_zero_is_refused() {
    let train = DistributedLoader::<Flex, _, _>::train(
        InMemDataset::new((0..10).collect::<Vec<usize>>()),
        Ids,
        0,
        DistributedSamplerConfig::new(2, 0),
    );
    assert!(
        matches!(
            train,
            Err(ddp_train::DdpTrainError::Data(DataError::ZeroBatchSize))
        ),
        "{train:?}"
    );
    let eval = DistributedLoader::<Flex, _, _>::eval(
        InMemDataset::new((0..10).collect::<Vec<usize>>()),
        Ids,
        0,
        2,
        0,
    );
    assert!(
        matches!(
            eval,
            Err(ddp_train::DdpTrainError::Data(DataError::ZeroBatchSize))
        ),
        "{eval:?}"
    );
}

#[test]
fn an_empty_evaluation_set_is_refused_when_the_loader_is_built() {
    for world in [1, 3] {
        let eval = DistributedLoader::<Flex, _, _>::eval(
            InMemDataset::new(Vec::<usize>::new()),
            Ids,
            2,
            world,
            0,
        );
        assert!(
            matches!(
                eval,
                Err(ddp_train::DdpTrainError::Data(DataError::EmptyDataset))
            ),
            "world {world}: {eval:?}"
        );
    }
}

/// A loader that logs `to_device` and which copy each `iter()` runs on.
struct DeviceProbe<Bk: burn::tensor::backend::Backend, O> {
    name: &'static str,
    inner: Arc<dyn DataLoader<Bk, O>>,
    moved_to: Option<Bk::Device>,
    log: Arc<Mutex<Vec<String>>>,
}

impl<Bk: burn::tensor::backend::Backend, O: 'static> DataLoader<Bk, O> for DeviceProbe<Bk, O> {
    fn iter<'a>(&'a self) -> Box<dyn burn::data::dataloader::DataLoaderIterator<O> + 'a> {
        let on = match &self.moved_to {
            Some(device) => format!("{device:?}"),
            None => "the loader as given".into(),
        };
        self.log
            .lock()
            .expect("log")
            .push(format!("{} iter on {on}", self.name));
        self.inner.iter()
    }
    fn num_items(&self) -> usize {
        self.inner.num_items()
    }
    fn to_device(&self, device: &Bk::Device) -> Arc<dyn DataLoader<Bk, O>> {
        self.log
            .lock()
            .expect("log")
            .push(format!("{} to_device {device:?}", self.name));
        Arc::new(DeviceProbe {
            name: self.name,
            inner: self.inner.to_device(device),
            moved_to: Some(device.clone()),
            log: self.log.clone(),
        })
    }
    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<Bk, O>> {
        self.inner.slice(start, end)
    }
}

/// As burn-train's own strategies: both loaders are moved to the model's device once, before
/// the first epoch, and every epoch iterates the moved loaders (with one GPU per rank, batches
/// on the default device would not be on the model's).
#[test]
fn the_loaders_are_moved_to_the_models_device_once_before_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Mutex::new(Vec::new()));
    let results = run_ranks(1, |pg| {
        let (train_items, test_items) = data();
        let (train, valid) = loaders(
            &pg,
            DigitDataset(train_items),
            32,
            DigitDataset(test_items),
            32,
        )?;
        let train = DeviceProbe {
            name: "train",
            inner: Arc::new(train),
            moved_to: None,
            log: log.clone(),
        };
        let valid = DeviceProbe {
            name: "valid",
            inner: Arc::new(valid),
            moved_to: None,
            log: log.clone(),
        };
        outcome_with_loaders(pg, dir.path(), Arc::new(train), Arc::new(valid))
    });
    let report = results[0].as_ref().expect("training succeeded");
    assert_eq!(report.last_epoch, 2);
    let device = format!("{:?}", burn::tensor::Device::<B>::default());
    let log = log.lock().expect("log").clone();
    let epoch = [
        format!("train iter on {device}"),
        format!("valid iter on {device}"),
    ];
    let mut expected = vec![
        format!("train to_device {device}"),
        format!("valid to_device {device}"),
    ];
    expected.extend(epoch.iter().chain(&epoch).cloned());
    assert_eq!(log, expected);
}

/// The copy `to_device` returns is the same loader, moved: it continues at the loader's epoch
/// and resume point, and iterating it advances the loader.
#[test]
fn a_moved_loader_continues_where_the_loader_is() {
    let build = || {
        DistributedLoader::<Flex, _, _>::train(
            InMemDataset::new((0..40).collect::<Vec<usize>>()),
            Ids,
            4,
            DistributedSamplerConfig::new(2, 1).with_seed(5),
        )
        .expect("loader")
        .with_resume(Some(ddp_train::ResumePoint {
            epochs_done: 3,
            steps_done: 2,
        }))
    };
    let reference = build();
    let expected: Vec<Vec<Vec<usize>>> = (0..2).map(|_| reference.iter().collect()).collect();
    let loader = build();
    let moved = loader.to_device(&Default::default());
    let mut iter = moved.iter();
    assert_eq!(
        iter.progress().items_processed,
        2 * 4 * 2,
        "after the resumed steps"
    );
    let first: Vec<Vec<usize>> = iter.by_ref().collect();
    drop(iter);
    assert_eq!(first, expected[0]);
    assert_eq!(
        loader.next_epoch(),
        4,
        "the moved copy's epoch advanced the loader"
    );
    let second: Vec<Vec<usize>> = loader.iter().collect();
    assert_eq!(
        second, expected[1],
        "the loader continues after the moved copy's epoch"
    );
}
