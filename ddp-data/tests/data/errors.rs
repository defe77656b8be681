//! Every bad input is a `DataError` with a message naming the values; a
//! failing dataset or batcher never hangs the loader.
use crate::common::{Collect, HoleDataset, IndexDataset, PanickingBatcher, PanickingDataset};
use ddp_data::{DataError, DistributedDataLoaderBuilder, DistributedSamplerConfig};

fn message(error: &DataError) -> String {
    error.to_string()
}

#[test]
fn zero_replicas_is_rejected() {
    let err = DistributedSamplerConfig::new(0, 0).init(10).unwrap_err();
    assert_eq!(err, DataError::ZeroReplicas);
    assert!(message(&err).contains("num_replicas is 0"));
}

#[test]
fn rank_outside_world_is_rejected() {
    let err = DistributedSamplerConfig::new(4, 4).init(10).unwrap_err();
    assert_eq!(
        err,
        DataError::RankOutOfRange {
            rank: 4,
            num_replicas: 4
        }
    );
    assert!(
        message(&err).contains("rank 4") && message(&err).contains("0..4"),
        "{err}"
    );
}

#[test]
fn empty_dataset_is_rejected() {
    assert_eq!(
        DistributedSamplerConfig::new(2, 0).init(0).unwrap_err(),
        DataError::EmptyDataset
    );
    let err = DistributedDataLoaderBuilder::new(Collect)
        .build(IndexDataset(0), DistributedSamplerConfig::new(1, 0))
        .unwrap_err();
    assert_eq!(err, DataError::EmptyDataset);
    assert!(message(&err).contains("empty"));
}

#[test]
fn zero_batch_size_is_rejected() {
    let err = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(0)
        .build(IndexDataset(10), DistributedSamplerConfig::new(1, 0))
        .unwrap_err();
    assert_eq!(err, DataError::ZeroBatchSize);
    assert!(message(&err).contains("batch size is 0"));
}

#[test]
fn zero_prefetch_with_workers_is_rejected() {
    let err = DistributedDataLoaderBuilder::new(Collect)
        .num_workers(3)
        .prefetch(0)
        .build(IndexDataset(10), DistributedSamplerConfig::new(1, 0))
        .unwrap_err();
    assert_eq!(err, DataError::ZeroPrefetch { num_workers: 3 });
    assert!(message(&err).contains("num_workers 3"));
}

#[test]
fn sampler_position_past_epoch_end_is_rejected() {
    let mut sampler = DistributedSamplerConfig::new(2, 0).init(10).unwrap();
    let err = sampler.set_position(6).unwrap_err();
    assert_eq!(
        err,
        DataError::PositionOutOfRange {
            position: 6,
            num_samples: 5
        }
    );
    assert!(message(&err).contains("position 6"));
}

#[test]
fn restoring_with_another_seed_is_rejected() {
    let saved = DistributedSamplerConfig::new(2, 0)
        .with_seed(1)
        .init(10)
        .unwrap()
        .state();
    let mut other = DistributedSamplerConfig::new(2, 0)
        .with_seed(2)
        .init(10)
        .unwrap();
    let err = other.load_state(&saved).unwrap_err();
    assert!(matches!(
        err,
        DataError::StateMismatch { field: "seed", .. }
    ));
    assert!(
        message(&err).contains("seed = 1") && message(&err).contains("seed = 2"),
        "{err}"
    );
}

/// Iterates to the end, returning the batches before the error and the error.
fn run_until_error<I>(iter: I) -> (usize, DataError, usize)
where
    I: Iterator<Item = Result<Vec<usize>, DataError>>,
{
    let mut ok = 0;
    let mut error = None;
    let mut after = 0;
    for item in iter {
        match (item, &error) {
            (Ok(_), None) => ok += 1,
            (Err(e), None) => error = Some(e),
            (_, Some(_)) => after += 1,
        }
    }
    (ok, error.expect("the iteration reported an error"), after)
}

#[test]
fn missing_item_is_an_error_not_a_silent_skip() {
    for workers in [0, 2] {
        let loader = DistributedDataLoaderBuilder::new(Collect)
            .batch_size(4)
            .num_workers(workers)
            .build(
                HoleDataset { len: 20, hole: 9 },
                DistributedSamplerConfig::new(1, 0).with_shuffle(false),
            )
            .unwrap();
        let (ok, err, after) = run_until_error(loader.iter());
        assert_eq!(
            (ok, after),
            (2, 0),
            "batches 0 and 1 load, batch 2 holds index 9"
        );
        assert_eq!(
            err,
            DataError::MissingItem {
                index: 9,
                dataset_len: 20
            }
        );
        assert!(message(&err).contains("index 9"), "{err}");
        assert_eq!(
            loader.state().position,
            8,
            "the failed batch is not counted as consumed"
        );
    }
}

#[test]
fn panicking_dataset_is_reported_without_hanging() {
    for workers in [0, 1, 4] {
        let loader = DistributedDataLoaderBuilder::new(Collect)
            .batch_size(5)
            .num_workers(workers)
            .build(
                PanickingDataset { len: 40, bad: 17 },
                DistributedSamplerConfig::new(1, 0).with_shuffle(false),
            )
            .unwrap();
        let (ok, err, after) = run_until_error(loader.iter());
        assert_eq!((ok, after), (3, 0), "{workers} workers");
        assert_eq!(
            err,
            DataError::WorkerPanicked {
                batch: 3,
                message: "corrupt record 17".into()
            }
        );
        assert!(message(&err).contains("batch 3") && message(&err).contains("corrupt record 17"));
    }
}

#[test]
fn panicking_batcher_is_reported_without_hanging() {
    for workers in [0, 2] {
        let loader = DistributedDataLoaderBuilder::new(PanickingBatcher { bad: 0 })
            .batch_size(3)
            .num_workers(workers)
            .build(
                IndexDataset(30),
                DistributedSamplerConfig::new(1, 0).with_shuffle(false),
            )
            .unwrap();
        let (ok, err, _) = run_until_error(loader.iter());
        assert_eq!(ok, 0);
        assert!(
            matches!(&err, DataError::WorkerPanicked { batch: 0, message } if message == "cannot batch item 0"),
            "{err:?}"
        );
    }
}

#[test]
fn loader_works_again_after_an_error() {
    let loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(5)
        .num_workers(2)
        .build(
            PanickingDataset { len: 40, bad: 39 },
            DistributedSamplerConfig::new(2, 1).with_shuffle(false),
        )
        .unwrap();
    // Rank 1 holds index 39 in its last batch; a fresh iteration fails the same way.
    for _ in 0..2 {
        let (ok, err, _) = run_until_error(loader.iter());
        assert_eq!(ok, 3);
        assert!(matches!(err, DataError::WorkerPanicked { batch: 3, .. }));
    }
}
