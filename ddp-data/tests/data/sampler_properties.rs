//! Property tests of the sampler's PyTorch semantics.

use std::collections::HashSet;

use ddp_data::sampler::indices::padded_order;
use ddp_data::{DistributedSampler, DistributedSamplerConfig};
use proptest::prelude::*;

fn samplers(
    len: usize,
    world: usize,
    seed: u64,
    drop_last: bool,
    epoch: u64,
) -> Vec<DistributedSampler> {
    (0..world)
        .map(|rank| {
            let mut sampler = DistributedSamplerConfig::new(world, rank)
                .with_seed(seed)
                .with_drop_last(drop_last)
                .init(len)
                .expect("valid config");
            sampler.set_epoch(epoch);
            sampler
        })
        .collect()
}

/// The global order the ranks consume together: position `g` is rank
/// `g % world`'s entry `g / world`.
fn interleave(lists: &[Vec<usize>]) -> Vec<usize> {
    let per_rank = lists[0].len();
    (0..per_rank * lists.len())
        .map(|g| lists[g % lists.len()][g / lists.len()])
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ranks_get_equally_long_lists_of_num_samples(
        len in 1usize..500, world in 1usize..9, seed: u64, drop_last: bool, epoch in 0u64..1000,
    ) {
        let samplers = samplers(len, world, seed, drop_last, epoch);
        let expected = if drop_last { len / world } else { len.div_ceil(world) };
        for sampler in &samplers {
            prop_assert_eq!(sampler.indices().len(), expected);
            prop_assert_eq!(sampler.num_samples(), expected);
            prop_assert_eq!(sampler.total_size(), expected * world);
        }
    }

    #[test]
    fn ranks_together_cover_every_index_without_drop_last(
        len in 1usize..500, world in 1usize..9, seed: u64, epoch in 0u64..1000,
    ) {
        let covered: HashSet<usize> = samplers(len, world, seed, false, epoch)
            .iter()
            .flat_map(DistributedSampler::indices)
            .collect();
        prop_assert_eq!(covered, (0..len).collect::<HashSet<_>>());
    }

    #[test]
    fn sampler_pads_from_start_of_permutation(
        len in 1usize..500, world in 1usize..9, seed: u64, drop_last: bool, epoch in 0u64..1000,
    ) {
        let samplers = samplers(len, world, seed, drop_last, epoch);
        let order = samplers[0].epoch_order().to_vec();
        let lists: Vec<Vec<usize>> = samplers.iter().map(DistributedSampler::indices).collect();
        let global = interleave(&lists);
        let total = samplers[0].total_size();
        prop_assert_eq!(global.len(), total);
        // The first min(len, total) come straight from the permutation ...
        prop_assert_eq!(&global[..len.min(total)], &order[..len.min(total)]);
        // ... and padding repeats it from its start, cyclically.
        for (g, &index) in global.iter().enumerate().skip(len) {
            prop_assert_eq!(index, order[g % len]);
        }
        prop_assert!(total - len.min(total) < world, "padding is less than one index per rank");
        prop_assert_eq!(global, padded_order(&order, total));
    }

    #[test]
    fn ranks_are_disjoint_when_size_divides_evenly_or_drop_last(
        per_rank in 1usize..60, world in 1usize..9, extra in 0usize..9, seed: u64, epoch in 0u64..1000,
    ) {
        let extra = extra % world;
        let len = per_rank * world + extra;
        // Divisible length: disjoint without drop_last; any length: disjoint with it.
        let cases = [(per_rank * world, false), (len, true)];
        for (len, drop_last) in cases {
            let mut seen = HashSet::new();
            for sampler in samplers(len, world, seed, drop_last, epoch) {
                for index in sampler.indices() {
                    prop_assert!(seen.insert(index), "index {} on two ranks (len {}, drop_last {})", index, len, drop_last);
                }
            }
        }
    }

    #[test]
    fn every_rank_computes_the_same_permutation(
        len in 1usize..500, world in 1usize..9, seed: u64, drop_last: bool, epoch in 0u64..1000,
    ) {
        let samplers = samplers(len, world, seed, drop_last, epoch);
        let mut sorted = samplers[0].epoch_order().to_vec();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..len).collect::<Vec<_>>(), "the order is a permutation");
        for sampler in &samplers[1..] {
            prop_assert_eq!(sampler.epoch_order(), samplers[0].epoch_order());
        }
    }

    #[test]
    fn a_new_epoch_gives_a_new_order(
        len in 2usize..500, world in 1usize..9, seed: u64, drop_last: bool, epoch in 0u64..1000,
    ) {
        let this = samplers(len, world, seed, drop_last, epoch).swap_remove(0);
        let next = samplers(len, world, seed, drop_last, epoch + 1).swap_remove(0);
        if len >= 12 {
            // Two independent permutations of >= 12 items coincide with
            // probability <= 1/12! (about 2e-9).
            prop_assert_ne!(this.epoch_order(), next.epoch_order());
        } else {
            // Tiny lengths can repeat an order; over 64 epochs they must not
            // all be the same (probability <= 2^-63 for len 2).
            let distinct: HashSet<Vec<usize>> = (epoch..epoch + 64)
                .map(|e| samplers(len, 1, seed, false, e).swap_remove(0).epoch_order().to_vec())
                .collect();
            prop_assert!(distinct.len() > 1);
        }
    }

    #[test]
    fn the_same_seed_and_epoch_give_the_same_order(
        len in 1usize..500, world in 1usize..9, seed: u64, drop_last: bool, epoch in 0u64..1000,
    ) {
        let first = samplers(len, world, seed, drop_last, epoch);
        // Reach the epoch by a different path: via other epochs.
        let second: Vec<DistributedSampler> = samplers(len, world, seed, drop_last, epoch + 7)
            .into_iter()
            .map(|mut s| { s.set_epoch(epoch); s })
            .collect();
        for (a, b) in first.iter().zip(&second) {
            prop_assert_eq!(a.indices(), b.indices());
        }
    }

    #[test]
    fn without_shuffle_the_order_is_the_identity_for_every_epoch(
        len in 1usize..500, world in 1usize..9, seed: u64, epoch in 0u64..1000,
    ) {
        let mut sampler = DistributedSamplerConfig::new(world, 0)
            .with_shuffle(false)
            .with_seed(seed)
            .init(len)
            .expect("valid config");
        sampler.set_epoch(epoch);
        prop_assert_eq!(sampler.epoch_order().to_vec(), (0..len).collect::<Vec<_>>());
    }
}
