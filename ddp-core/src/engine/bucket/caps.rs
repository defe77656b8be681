//! How full buckets may get: the configured caps, lowered for small models.

/// The smallest cap [`BucketCaps::for_model`] lowers to: below it a collective costs mostly its
/// fixed latency, so splitting further buys no overlap.
pub(crate) const SMALLEST_SPLIT_BYTES: usize = 16 << 10;

/// The bucket caps in bytes: the first bucket's and the others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketCaps {
    pub(crate) first: usize,
    pub(crate) rest: usize,
}

impl BucketCaps {
    /// The caps for a model with `total_bytes` of gradients.
    ///
    /// A model whose gradients fit in one or two buckets cannot overlap: its last bucket is
    /// complete only when backward ends, and it holds nearly everything (PyTorch's 25 MiB cap
    /// puts all of a 6M-parameter MLP in one bucket). So the cap is lowered to `1/min_buckets`
    /// of the model's bytes, but not below [`SMALLEST_SPLIT_BYTES`]: no bucket holds more than
    /// that share unless one parameter alone is larger; the first cap is lowered with them.
    /// Large models keep the configured caps; `min_buckets` 1 keeps them always.
    pub(crate) fn for_model(
        first_cap_bytes: usize,
        cap_bytes: usize,
        min_buckets: usize,
        total_bytes: usize,
    ) -> Self {
        if min_buckets <= 1 {
            return BucketCaps {
                first: first_cap_bytes.max(1),
                rest: cap_bytes.max(1),
            };
        }
        let split = total_bytes.div_ceil(min_buckets).max(SMALLEST_SPLIT_BYTES);
        let rest = cap_bytes.min(split).max(1);
        BucketCaps {
            first: first_cap_bytes.min(rest).max(1),
            rest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn large_models_keep_the_configured_caps() {
        let caps = BucketCaps::for_model(MIB, 25 * MIB, 4, 400 * MIB);
        assert_eq!(
            caps,
            BucketCaps {
                first: MIB,
                rest: 25 * MIB
            }
        );
    }

    #[test]
    fn small_models_get_at_least_min_buckets_worth_of_cap() {
        // 24 MiB of gradients would be one 25 MiB bucket; with 4 buckets, 6 MiB each.
        let caps = BucketCaps::for_model(MIB, 25 * MIB, 4, 24 * MIB);
        assert_eq!(
            caps,
            BucketCaps {
                first: MIB,
                rest: 6 * MIB
            }
        );
        // Tiny models: the first cap is lowered too, down to the floor.
        let caps = BucketCaps::for_model(MIB, 25 * MIB, 4, 120_000);
        assert_eq!(
            caps,
            BucketCaps {
                first: 30_000,
                rest: 30_000
            }
        );
        let caps = BucketCaps::for_model(MIB, 25 * MIB, 4, 1000);
        assert_eq!(caps.rest, SMALLEST_SPLIT_BYTES);
    }

    #[test]
    fn one_min_bucket_and_smaller_configured_caps_are_left_alone() {
        assert_eq!(
            BucketCaps::for_model(MIB, 25 * MIB, 1, 24 * MIB),
            BucketCaps {
                first: MIB,
                rest: 25 * MIB
            }
        );
        assert_eq!(
            BucketCaps::for_model(100, 500, 4, 24 * MIB),
            BucketCaps {
                first: 100,
                rest: 500
            }
        );
    }
}
