//! A synthetic sequence task with a measurable accuracy: reverse a list of digits.
//!
//! Sequence `i` (deterministic in `seed` and `i`) is `BOS d1 .. dL SEP dL .. d1`; a decoder-only
//! model reads it left to right and is scored on predicting the reversed half.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// Digits 0..=9, then the two markers.
pub const VOCAB: usize = 12;
/// Begin-of-sequence marker.
pub const BOS: i64 = 10;
/// Separator between the input and its reversal.
pub const SEP: i64 = 11;

/// `len` digits of sequence `index` (splitmix64, so every platform agrees).
pub fn digits(seed: u64, index: u64, len: usize) -> Vec<i64> {
    let mut state = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % 10) as i64
        })
        .collect()
}

/// The full token sequence of item `index`: `2 * len + 2` tokens.
pub fn sequence(seed: u64, index: u64, len: usize) -> Vec<i64> {
    let d = digits(seed, index, len);
    let mut s = Vec::with_capacity(2 * len + 2);
    s.push(BOS);
    s.extend(&d);
    s.push(SEP);
    s.extend(d.iter().rev());
    s
}

/// Items `offset .. offset + count` of the task.
#[derive(Debug, Clone)]
pub struct ReverseDataset {
    /// Seed of the digits.
    pub seed: u64,
    /// Digits per sequence.
    pub digits: usize,
    /// First item index (train and test sets use disjoint ranges).
    pub offset: u64,
    /// Number of items.
    pub count: usize,
}

impl Dataset<Vec<i64>> for ReverseDataset {
    fn get(&self, index: usize) -> Option<Vec<i64>> {
        (index < self.count).then(|| sequence(self.seed, self.offset + index as u64, self.digits))
    }
    fn len(&self) -> usize {
        self.count
    }
}

/// Inputs (all tokens but the last) and targets (all but the first), `[n, 2L+1]` each.
#[derive(Debug, Clone)]
pub struct ReverseBatch<B: Backend> {
    /// Model input.
    pub inputs: Tensor<B, 2, Int>,
    /// Next tokens.
    pub targets: Tensor<B, 2, Int>,
}

/// Stacks sequences into a [`ReverseBatch`].
#[derive(Debug, Clone, Default)]
pub struct ReverseBatcher;

impl<B: Backend> Batcher<B, Vec<i64>, ReverseBatch<B>> for ReverseBatcher {
    fn batch(&self, items: Vec<Vec<i64>>, device: &B::Device) -> ReverseBatch<B> {
        let n = items.len();
        let t = items.first().map_or(0, |s| s.len() - 1);
        let inputs: Vec<i64> = items.iter().flat_map(|s| s[..t].to_vec()).collect();
        let targets: Vec<i64> = items.iter().flat_map(|s| s[1..].to_vec()).collect();
        ReverseBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, [n, t]), device),
            targets: Tensor::from_data(TensorData::new(targets, [n, t]), device),
        }
    }
}

/// Positions of the targets that are the reversed digits: targets are the sequence shifted by
/// one, so the reversal `s[len + 2 ..]` sits at target positions `len + 1 .. 2 * len + 1`.
pub fn scored_positions(len: usize) -> std::ops::Range<usize> {
    len + 1..2 * len + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_the_digits_then_their_reversal() {
        let s = sequence(1, 5, 4);
        assert_eq!(s.len(), 10);
        assert_eq!((s[0], s[5]), (BOS, SEP));
        let d = &s[1..5];
        let r: Vec<i64> = d.iter().rev().copied().collect();
        assert_eq!(&s[6..], r.as_slice());
        assert_eq!(s, sequence(1, 5, 4), "deterministic");
        assert_ne!(s, sequence(1, 6, 4));
    }

    #[test]
    fn scored_targets_are_the_reversed_half() {
        let s = sequence(3, 0, 4);
        let targets = &s[1..];
        assert_eq!(&targets[scored_positions(4)], &s[6..]);
    }
}
