//! Datasets and batchers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::{Tensor, TensorData};
use ddp_data::{DistributedDataLoader, DistributedDataLoaderBuilder, DistributedSamplerConfig};

/// Item `i` is `i`, so batches show exactly which indices were loaded.
#[derive(Debug, Clone, Copy)]
pub struct IndexDataset(pub usize);

impl Dataset<usize> for IndexDataset {
    fn get(&self, index: usize) -> Option<usize> {
        (index < self.0).then_some(index)
    }
    fn len(&self) -> usize {
        self.0
    }
}

/// Returns the items as they are.
#[derive(Debug, Clone, Copy)]
pub struct Collect;

impl Batcher<Flex, usize, Vec<usize>> for Collect {
    fn batch(&self, items: Vec<usize>, _device: &FlexDevice) -> Vec<usize> {
        items
    }
}

/// Builds a `[batch, 3]` tensor with rows `[i, i², sin(i)]`.
#[derive(Debug, Clone, Copy)]
pub struct TensorBatcher;

impl Batcher<Flex, usize, Tensor<Flex, 2>> for TensorBatcher {
    fn batch(&self, items: Vec<usize>, device: &FlexDevice) -> Tensor<Flex, 2> {
        let rows = items.len();
        let flat: Vec<f32> = items
            .into_iter()
            .flat_map(|i| {
                let x = i as f32;
                [x, x * x, x.sin()]
            })
            .collect();
        Tensor::from_data(TensorData::new(flat, [rows, 3]), device)
    }
}

/// Returns `None` for one index inside its length.
#[derive(Debug, Clone, Copy)]
pub struct HoleDataset {
    pub len: usize,
    pub hole: usize,
}

impl Dataset<usize> for HoleDataset {
    fn get(&self, index: usize) -> Option<usize> {
        (index < self.len && index != self.hole).then_some(index)
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Panics when asked for one index.
#[derive(Debug, Clone, Copy)]
pub struct PanickingDataset {
    pub len: usize,
    pub bad: usize,
}

impl Dataset<usize> for PanickingDataset {
    fn get(&self, index: usize) -> Option<usize> {
        if index == self.bad {
            panic!("corrupt record {index}");
        }
        (index < self.len).then_some(index)
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Panics on any batch containing one item.
#[derive(Debug, Clone, Copy)]
pub struct PanickingBatcher {
    pub bad: usize,
}

impl Batcher<Flex, usize, Vec<usize>> for PanickingBatcher {
    fn batch(&self, items: Vec<usize>, _device: &FlexDevice) -> Vec<usize> {
        assert!(!items.contains(&self.bad), "cannot batch item {}", self.bad);
        items
    }
}

/// A loader of indices `0..len` for `rank` of `world`.
pub fn index_loader(
    len: usize,
    config: DistributedSamplerConfig,
    batch_size: usize,
    num_workers: usize,
) -> DistributedDataLoader<Flex, usize, Vec<usize>> {
    DistributedDataLoaderBuilder::new(Collect)
        .batch_size(batch_size)
        .num_workers(num_workers)
        .build(IndexDataset(len), config)
        .expect("valid loader settings")
}

/// All batches of one pass, panicking on a loader error.
pub fn collect_epoch(loader: &DistributedDataLoader<Flex, usize, Vec<usize>>) -> Vec<Vec<usize>> {
    loader
        .iter()
        .map(|batch| batch.expect("batch loads"))
        .collect()
}

/// Like [`IndexDataset`], but `get` sleeps 0–0.8 ms depending on the index
/// (and `slow_below` items sleep 30 ms), so parallel workers finish batches
/// out of order.
#[derive(Debug, Clone, Copy)]
pub struct JitterDataset {
    pub len: usize,
    pub slow_below: usize,
}

impl Dataset<usize> for JitterDataset {
    fn get(&self, index: usize) -> Option<usize> {
        let micros = if index < self.slow_below {
            30_000
        } else {
            (index.wrapping_mul(7919) % 5) as u64 * 200
        };
        std::thread::sleep(std::time::Duration::from_micros(micros));
        (index < self.len).then_some(index)
    }
    fn len(&self) -> usize {
        self.len
    }
}
