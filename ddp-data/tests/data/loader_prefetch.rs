//! Prefetching is bounded by the builder's `prefetch`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use burn::data::dataset::Dataset;
use ddp_data::{DistributedDataLoaderBuilder, DistributedSamplerConfig};
/// Counts every `get`.
#[derive(Debug, Clone, Default)]
struct CountingDataset {
    fetched: Arc<AtomicUsize>,
}

impl Dataset<usize> for CountingDataset {
    fn get(&self, index: usize) -> Option<usize> {
        self.fetched.fetch_add(1, Ordering::SeqCst);
        (index < 1000).then_some(index)
    }
    fn len(&self) -> usize {
        1000
    }
}

/// Waits (up to 10 s) until `counter` reaches `target`, then a little
/// longer so any excess loading would show.
fn settle(counter: &AtomicUsize, target: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter.load(Ordering::SeqCst) < target && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    counter.load(Ordering::SeqCst)
}

#[test]
fn workers_load_at_most_prefetch_batches_ahead() {
    let dataset = CountingDataset::default();
    let fetched = Arc::clone(&dataset.fetched);
    let loader = DistributedDataLoaderBuilder::new(crate::common::Collect)
        .batch_size(3)
        .num_workers(4)
        .prefetch(2)
        .build(dataset, DistributedSamplerConfig::new(1, 0))
        .unwrap();
    let mut iter = loader.iter();
    assert_eq!(
        fetched.load(Ordering::SeqCst),
        0,
        "nothing is loaded before the first next()"
    );
    iter.next().unwrap().unwrap();
    assert_eq!(settle(&fetched, 6), 6, "the first 2 batches, no more");
    iter.next().unwrap().unwrap();
    assert_eq!(settle(&fetched, 9), 9, "one more batch per batch consumed");
}

#[test]
fn loading_without_workers_fetches_only_the_requested_batch() {
    let dataset = CountingDataset::default();
    let fetched = Arc::clone(&dataset.fetched);
    let loader = DistributedDataLoaderBuilder::new(crate::common::Collect)
        .batch_size(5)
        .build(dataset, DistributedSamplerConfig::new(2, 1))
        .unwrap();
    let mut iter = loader.iter();
    iter.next().unwrap().unwrap();
    assert_eq!(fetched.load(Ordering::SeqCst), 5);
}

/// `prefetch(usize::MAX)` is "as far ahead as there are batches", not an overflow.
#[test]
fn an_unbounded_prefetch_loads_every_batch_without_overflowing() {
    let loader = DistributedDataLoaderBuilder::new(crate::common::Collect)
        .batch_size(100)
        .num_workers(2)
        .prefetch(usize::MAX)
        .build(
            crate::common::IndexDataset(1000),
            DistributedSamplerConfig::new(1, 0),
        )
        .unwrap();
    let batches = crate::common::collect_epoch(&loader);
    assert_eq!(batches.len(), 10);
    assert_eq!(batches.concat().len(), 1000);
}
