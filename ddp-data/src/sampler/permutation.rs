//! The per-epoch order of the dataset, identical on every machine.
//!
//! # Algorithm
//!
//! The shuffled order of epoch `e` for a sampler with seed `s` over `len`
//! items is computed as follows, and nothing else is ever used:
//!
//! 1. `rng = ChaCha8Rng::seed_from_u64(s.wrapping_add(e))` (rand_chacha 0.9;
//!    `seed_from_u64` is rand_core 0.9's portable PCG32-based seed expansion).
//! 2. `order = [0, 1, ..., len - 1]`.
//! 3. Durstenfeld's Fisher–Yates shuffle: for `i` from `len - 1` down to `1`,
//!    draw `j` uniformly from `0..=i` with [`uniform_below`]`(rng, i + 1)` and
//!    swap `order[i]` and `order[j]`.
//!
//! [`uniform_below`]`(rng, n)` computes `t = (2^64 - n) mod n` and draws
//! `x = rng.next_u64()` until `x >= t`, then returns `x mod n` (rejection
//! sampling, unbiased; the same method as OpenBSD's `arc4random_uniform`
//! widened to 64 bits). All arithmetic is on `u64`, so 32- and 64-bit
//! targets produce the same order.
//!
//! The shuffle and the bounded draw are written here rather than taken from
//! `rand` so that a `rand` upgrade can never change the order; golden-value
//! tests pin the output.
//!
//! This is not PyTorch's `torch.randperm`: the *semantics* of the sampler match
//! PyTorch, but the shuffled order itself is this crate's.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// Draws a uniform integer in `0..bound` from `rng` (see the
/// [module docs](self) for the exact method).
///
/// Returns 0 without drawing for `bound == 0` (an empty range).
pub fn uniform_below(rng: &mut impl RngCore, bound: u64) -> u64 {
    if bound == 0 {
        return 0;
    }
    let threshold = bound.wrapping_neg() % bound;
    loop {
        let x = rng.next_u64();
        if x >= threshold {
            return x % bound;
        }
    }
}

/// The shuffled order `0..len` for `seed` and `epoch`, computed with the
/// algorithm in the [module docs](self).
pub fn shuffled_order(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(epoch));
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        // `i + 1 <= len`, which fits in a usize, so the result does too.
        let j = uniform_below(&mut rng, i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The order of epoch `epoch`: [`shuffled_order`] when `shuffle` is true,
/// otherwise the identity `0..len`.
pub fn epoch_order(len: usize, shuffle: bool, seed: u64, epoch: u64) -> Vec<usize> {
    if shuffle {
        shuffled_order(len, seed, epoch)
    } else {
        (0..len).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden values, cross-checked against an independent Python
    /// implementation of the documented algorithm (PCG32 seed expansion,
    /// ChaCha8 block function, the rejection draw and Fisher–Yates). If this
    /// fails, the order changed and every saved run would resume wrongly.
    #[test]
    fn shuffled_order_matches_pinned_golden_values() {
        assert_eq!(shuffled_order(10, 0, 0), [7, 8, 9, 0, 1, 5, 4, 6, 3, 2]);
        assert_eq!(shuffled_order(10, 42, 3), [7, 5, 4, 6, 2, 0, 8, 9, 3, 1]);
        // Long enough to use many ChaCha blocks.
        assert_eq!(
            shuffled_order(1000, 5, 1)[..12],
            [888, 458, 468, 559, 841, 569, 866, 274, 957, 883, 595, 689]
        );
    }

    #[test]
    fn shuffled_order_is_a_permutation() {
        for len in [0, 1, 2, 3, 17, 1000] {
            let mut order = shuffled_order(len, 7, 1);
            order.sort_unstable();
            assert_eq!(order, (0..len).collect::<Vec<_>>());
        }
    }

    #[test]
    fn seed_and_epoch_enter_only_through_their_wrapping_sum() {
        assert_eq!(shuffled_order(50, 3, 4), shuffled_order(50, 4, 3));
        assert_eq!(
            shuffled_order(50, u64::MAX, 2),
            shuffled_order(50, 0, 1),
            "seed + epoch wraps around"
        );
    }

    #[test]
    fn epoch_order_without_shuffle_is_identity() {
        assert_eq!(epoch_order(5, false, 9, 9), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn different_epochs_give_different_orders() {
        assert_ne!(shuffled_order(100, 0, 0), shuffled_order(100, 0, 1));
    }

    /// An RNG that replays fixed values, to pin the rejection rule.
    struct Replay(Vec<u64>);

    impl RngCore for Replay {
        fn next_u32(&mut self) -> u32 {
            self.next_u64() as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0.remove(0)
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            for chunk in dest.chunks_mut(8) {
                let bytes = self.next_u64().to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
        }
    }

    #[test]
    fn uniform_below_rejects_values_under_the_threshold() {
        // bound 3: 2^64 mod 3 == 1, so 0 is rejected and 4 % 3 == 1 returned.
        let mut rng = Replay(vec![0, 4]);
        assert_eq!(uniform_below(&mut rng, 3), 1);
        // bound a power of two: nothing rejected.
        let mut rng = Replay(vec![0]);
        assert_eq!(uniform_below(&mut rng, 8), 0);
        // bound 1 always yields 0.
        let mut rng = Replay(vec![u64::MAX]);
        assert_eq!(uniform_below(&mut rng, 1), 0);
    }

    #[test]
    fn uniform_below_is_roughly_uniform() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 6];
        for _ in 0..60_000 {
            counts[uniform_below(&mut rng, 6) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "counts {counts:?}");
        }
    }
}
