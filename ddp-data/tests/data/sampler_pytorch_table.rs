//! The exact index lists `torch.utils.data.DistributedSampler(shuffle=False)`
//! produces, derived from PyTorch's algorithm:
//!
//! ```python
//! indices = list(range(len(dataset)))
//! if not drop_last:
//!     padding = total_size - len(indices)
//!     indices += (indices * math.ceil(padding / len(indices)))[:padding]
//! else:
//!     indices = indices[:total_size]
//! indices = indices[rank:total_size:num_replicas]
//! ```

use ddp_data::DistributedSamplerConfig;

/// (dataset len, world size, drop_last, expected list of every rank)
type Case = (usize, usize, bool, &'static [&'static [usize]]);

const CASES: &[Case] = &[
    // The issue's reference cases.
    (10, 3, false, &[&[0, 3, 6, 9], &[1, 4, 7, 0], &[2, 5, 8, 1]]),
    (10, 3, true, &[&[0, 3, 6], &[1, 4, 7], &[2, 5, 8]]),
    // Padding repeats the list more than once: [0, 1, 0, 1, 0].
    (2, 5, false, &[&[0], &[1], &[0], &[1], &[0]]),
    // drop_last with fewer items than ranks: ceil((2 - 5) / 5) = 0 samples.
    (2, 5, true, &[&[], &[], &[], &[], &[]]),
    // Padding of 5 over 3 items: [0, 1, 2] + [0, 1, 2, 0, 1, 2][:5].
    (
        3,
        8,
        false,
        &[&[0], &[1], &[2], &[0], &[1], &[2], &[0], &[1]],
    ),
    (1, 4, false, &[&[0], &[0], &[0], &[0]]),
    (7, 2, false, &[&[0, 2, 4, 6], &[1, 3, 5, 0]]),
    (7, 2, true, &[&[0, 2, 4], &[1, 3, 5]]),
    (
        12,
        4,
        false,
        &[&[0, 4, 8], &[1, 5, 9], &[2, 6, 10], &[3, 7, 11]],
    ),
    (
        12,
        4,
        true,
        &[&[0, 4, 8], &[1, 5, 9], &[2, 6, 10], &[3, 7, 11]],
    ),
    (5, 1, false, &[&[0, 1, 2, 3, 4]]),
];

#[test]
fn sampler_matches_pytorch_index_lists_without_shuffle() {
    for &(len, world, drop_last, expected) in CASES {
        assert_eq!(
            expected.len(),
            world,
            "table row for len {len} world {world}"
        );
        for (rank, &expected) in expected.iter().enumerate() {
            let mut sampler = DistributedSamplerConfig::new(world, rank)
                .with_shuffle(false)
                .with_drop_last(drop_last)
                .init(len)
                .expect("valid config");
            for epoch in [0, 3] {
                sampler.set_epoch(epoch);
                assert_eq!(
                    sampler.indices(),
                    expected,
                    "len {len} world {world} rank {rank} drop_last {drop_last} epoch {epoch}"
                );
                assert_eq!(sampler.iter().collect::<Vec<_>>(), expected);
            }
        }
    }
}

#[test]
fn sampler_num_samples_matches_pytorch_formula() {
    // drop_last and len % n != 0: ceil((len - n) / n), else ceil(len / n).
    let cases = [
        (10, 3, false, 4),
        (10, 3, true, 3),
        (2, 5, true, 0),
        (2, 5, false, 1),
        (11, 4, true, 2),
        (12, 4, true, 3),
    ];
    for (len, world, drop_last, expected) in cases {
        let sampler = DistributedSamplerConfig::new(world, 0)
            .with_drop_last(drop_last)
            .init(len)
            .expect("valid config");
        assert_eq!(
            sampler.num_samples(),
            expected,
            "len {len} world {world} drop_last {drop_last}"
        );
    }
}
