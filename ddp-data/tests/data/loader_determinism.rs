//! The loader yields the same batches in the same order for any worker count.
use crate::common::{
    Collect, IndexDataset, JitterDataset, TensorBatcher, collect_epoch, index_loader,
};
use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use ddp_data::{DistributedDataLoaderBuilder, DistributedSamplerConfig};

const WORKERS: [usize; 4] = [0, 1, 2, 4];

fn config(rank: usize) -> DistributedSamplerConfig {
    DistributedSamplerConfig::new(3, rank).with_seed(2024)
}

#[test]
fn loader_yields_same_batches_for_0_1_2_4_workers() {
    // Item costs vary, so with workers batches finish out of order.
    let dataset = JitterDataset {
        len: 257,
        slow_below: 0,
    };
    for rank in 0..3 {
        let mut reference = None;
        for workers in WORKERS {
            let mut loader = DistributedDataLoaderBuilder::new(Collect)
                .batch_size(7)
                .num_workers(workers)
                .build(dataset, config(rank))
                .unwrap();
            let mut epochs = Vec::new();
            for epoch in 0..2 {
                loader.set_epoch(epoch);
                epochs.push(collect_epoch(&loader));
            }
            // The batches are the sampler's indices, in order, in chunks.
            let mut sampler = config(rank).init(257).unwrap();
            sampler.set_epoch(1);
            assert_eq!(epochs[1].concat(), sampler.indices());
            match &reference {
                None => reference = Some(epochs),
                Some(reference) => {
                    assert_eq!(&epochs, reference, "rank {rank} with {workers} workers")
                }
            }
        }
    }
}

#[test]
fn batches_that_finish_early_wait_for_their_turn() {
    // The first batch takes ~120 ms, the next ones almost nothing: with 4
    // workers batches 1..3 are ready long before batch 0.
    let loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(4)
        .num_workers(4)
        .prefetch(8)
        .build(
            JitterDataset {
                len: 40,
                slow_below: 4,
            },
            DistributedSamplerConfig::new(1, 0).with_shuffle(false),
        )
        .unwrap();
    let batches = collect_epoch(&loader);
    let expected: Vec<Vec<usize>> = (0..10).map(|b| (4 * b..4 * b + 4).collect()).collect();
    assert_eq!(batches, expected);
}

#[test]
fn loader_order_does_not_depend_on_prefetch_depth() {
    let reference = collect_epoch(&index_loader(300, config(1), 4, 0));
    for (workers, prefetch) in [(1, 1), (2, 1), (4, 2), (4, 64)] {
        let loader = DistributedDataLoaderBuilder::new(Collect)
            .batch_size(4)
            .num_workers(workers)
            .prefetch(prefetch)
            .build(
                JitterDataset {
                    len: 300,
                    slow_below: 0,
                },
                config(1),
            )
            .unwrap();
        assert_eq!(
            collect_epoch(&loader),
            reference,
            "workers {workers} prefetch {prefetch}"
        );
    }
}

fn tensor_epoch(workers: usize) -> Vec<TensorData> {
    let loader = DistributedDataLoaderBuilder::new(TensorBatcher)
        .batch_size(16)
        .num_workers(workers)
        .drop_last(true)
        .build(IndexDataset(200), config(2))
        .unwrap();
    loader
        .iter()
        .map(|batch| {
            let batch: Tensor<Flex, 2> = batch.unwrap();
            assert_eq!(batch.dims(), [16, 3]);
            batch.into_data()
        })
        .collect()
}

#[test]
fn tensor_batches_are_identical_for_any_worker_count() {
    let reference = tensor_epoch(0);
    assert_eq!(
        reference.len(),
        4,
        "67 samples per rank: 4 full batches, short one dropped"
    );
    for workers in [1, 2, 4] {
        assert_eq!(tensor_epoch(workers), reference, "{workers} workers");
    }
}

#[test]
fn loader_len_counts_batches_of_this_rank_for_progress_bars() {
    // 257 items over 3 ranks: 86 per rank; batches of 7 -> 13, or 12 with drop_last.
    let loader = index_loader(257, config(0), 7, 2);
    assert_eq!(loader.len(), 13);
    assert_eq!(collect_epoch(&loader).len(), 13);
    let loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(7)
        .drop_last(true)
        .build(IndexDataset(257), config(0))
        .unwrap();
    assert_eq!(loader.len(), 12);
    let batches = collect_epoch(&loader);
    assert_eq!(batches.len(), 12);
    assert!(batches.iter().all(|b| b.len() == 7));
}

#[test]
fn each_iteration_without_set_epoch_repeats_the_epoch() {
    let loader = index_loader(50, config(0), 4, 2);
    assert_eq!(collect_epoch(&loader), collect_epoch(&loader));
}

#[test]
fn set_epoch_reshuffles_the_batches() {
    let mut loader = index_loader(90, config(0), 6, 2);
    let first = collect_epoch(&loader);
    loader.set_epoch(1);
    let second = collect_epoch(&loader);
    assert_ne!(first, second);
    let mut a = first.concat();
    let mut b = second.concat();
    a.sort_unstable();
    b.sort_unstable();
    assert_ne!(
        a, b,
        "rank 0 sees a different subset of the data, as in PyTorch"
    );
}

#[test]
fn dropping_an_iterator_early_leaves_the_loader_usable() {
    let loader = index_loader(500, config(0), 2, 4);
    let mut iter = loader.iter();
    iter.next().unwrap().unwrap();
    drop(iter);
    assert_eq!(collect_epoch(&loader).len(), loader.len());
}
