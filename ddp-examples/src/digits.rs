//! The UCI handwritten digits (8x8 images, 10 classes), shipped gzipped in `data/` and compiled
//! into the binary, so the examples run from any directory with no download.

use anyhow::{Context, Result, bail, ensure};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use std::io::Read;

/// The data set file (CC BY 4.0, see `data/README.md`).
pub const DIGITS_CSV_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

/// One image: 64 pixels in `0..=16`, row-major, and its label.
#[derive(Debug, Clone)]
pub struct DigitItem {
    /// Pixel intensities scaled to `0..=1`.
    pub pixels: [f32; 64],
    /// The digit, `0..=9`.
    pub label: u8,
}

/// Parses the gzipped CSV: 64 integers then the label per row.
pub fn load_digits() -> Result<Vec<DigitItem>> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_CSV_GZ)
        .read_to_string(&mut text)
        .context("decompressing digits.csv.gz")?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            let values: Vec<u8> = line
                .split(',')
                .map(|v| v.trim().parse::<u8>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("digits.csv line {}: not a list of integers", i + 1))?;
            ensure!(
                values.len() == 65,
                "digits.csv line {}: {} values, expected 65",
                i + 1,
                values.len()
            );
            let label = values[64];
            if label > 9 {
                bail!("digits.csv line {}: label {label} is not a digit", i + 1);
            }
            Ok(DigitItem {
                pixels: std::array::from_fn(|k| values[k] as f32 / 16.0),
                label,
            })
        })
        .collect()
}

/// A fixed, seeded split: the same permutation on every machine (ddp-data's documented shuffle),
/// the first `train_fraction` for training.
pub fn split(
    items: Vec<DigitItem>,
    seed: u64,
    train_fraction: f64,
) -> (Vec<DigitItem>, Vec<DigitItem>) {
    let order = ddp_core::data::sampler::permutation::shuffled_order(items.len(), seed, 0);
    let n_train = (items.len() as f64 * train_fraction).round() as usize;
    let mut train = Vec::with_capacity(n_train);
    let mut test = Vec::with_capacity(items.len() - n_train);
    for (k, i) in order.into_iter().enumerate() {
        if k < n_train {
            train.push(items[i].clone());
        } else {
            test.push(items[i].clone());
        }
    }
    (train, test)
}

/// An in-memory list of digits.
#[derive(Debug, Clone)]
pub struct DigitDataset(pub Vec<DigitItem>);

impl Dataset<DigitItem> for DigitDataset {
    fn get(&self, index: usize) -> Option<DigitItem> {
        self.0.get(index).cloned()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A batch: images `[n, 64]` and labels `[n]`.
#[derive(Debug, Clone)]
pub struct DigitBatch<B: Backend> {
    /// Pixels, one row per image.
    pub images: Tensor<B, 2>,
    /// Labels.
    pub targets: Tensor<B, 1, Int>,
}

/// Stacks items into a [`DigitBatch`].
#[derive(Debug, Clone, Default)]
pub struct DigitBatcher;

impl<B: Backend> Batcher<B, DigitItem, DigitBatch<B>> for DigitBatcher {
    fn batch(&self, items: Vec<DigitItem>, device: &B::Device) -> DigitBatch<B> {
        let n = items.len();
        let pixels: Vec<f32> = items.iter().flat_map(|i| i.pixels).collect();
        let labels: Vec<i64> = items.iter().map(|i| i.label as i64).collect();
        DigitBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, 64]), device),
            targets: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_has_1797_labelled_images() {
        let items = load_digits().unwrap();
        assert_eq!(items.len(), 1797);
        assert!(
            items
                .iter()
                .all(|i| i.pixels.iter().all(|p| (0.0..=1.0).contains(p)))
        );
        let mut counts = [0usize; 10];
        items.iter().for_each(|i| counts[i.label as usize] += 1);
        assert!(counts.iter().all(|&c| c > 150), "{counts:?}");
    }

    #[test]
    fn split_is_deterministic_and_disjoint() {
        let (a, b) = split(load_digits().unwrap(), 7, 0.8);
        let (c, _) = split(load_digits().unwrap(), 7, 0.8);
        assert_eq!((a.len(), b.len()), (1438, 359));
        assert!(a.iter().zip(&c).all(|(x, y)| x.pixels == y.pixels));
    }
}
