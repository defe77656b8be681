//! Loader throughput against worker count.
//!
//! Each `Dataset::get` synthesises a 1024-float feature vector with a few
//! transcendental functions per element (~10k floating-point operations),
//! standing in for decoding; the batcher stacks 32 items into a
//! `Tensor<Flex, 2>`. One iteration is one full epoch of 512 items.
//!
//! Run: `cargo bench -p ddp-data --bench loader_throughput`

use std::hint::black_box;
use std::time::Duration;

use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::{Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ddp_data::{DistributedDataLoaderBuilder, DistributedSamplerConfig};

const ITEMS: usize = 512;
const DIM: usize = 1024;
const BATCH: usize = 32;

/// Items whose `get` costs real work.
struct SynthesisedDataset;

impl Dataset<Vec<f32>> for SynthesisedDataset {
    fn get(&self, index: usize) -> Option<Vec<f32>> {
        (index < ITEMS).then(|| {
            (0..DIM)
                .map(|j| {
                    let mut x = (index * DIM + j) as f32 * 1e-4;
                    for _ in 0..4 {
                        x = x.sin().mul_add(1.5, x.cos() * 0.5) + x.sqrt().tanh();
                    }
                    x
                })
                .collect()
        })
    }

    fn len(&self) -> usize {
        ITEMS
    }
}

#[derive(Clone)]
struct StackBatcher;

impl Batcher<Flex, Vec<f32>, Tensor<Flex, 2>> for StackBatcher {
    fn batch(&self, items: Vec<Vec<f32>>, device: &FlexDevice) -> Tensor<Flex, 2> {
        let rows = items.len();
        let flat: Vec<f32> = items.into_iter().flatten().collect();
        Tensor::from_data(TensorData::new(flat, [rows, DIM]), device)
    }
}

fn loader_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("loader_throughput");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(ITEMS as u64));
    for workers in [0, 1, 2, 4] {
        let loader = DistributedDataLoaderBuilder::new(StackBatcher)
            .batch_size(BATCH)
            .num_workers(workers)
            .build(SynthesisedDataset, DistributedSamplerConfig::new(1, 0))
            .expect("valid loader settings");
        group.bench_with_input(
            BenchmarkId::new("workers", workers),
            &loader,
            |b, loader| {
                b.iter(|| {
                    for batch in loader.iter() {
                        black_box(batch.expect("batch loads"));
                    }
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, loader_throughput);
criterion_main!(benches);
