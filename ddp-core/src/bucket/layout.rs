//! Which bucket each parameter's gradient belongs to, and each bucket's parameters in order.

use super::plan::assign_buckets;

/// The bucket assignment for one ordering of the parameters.
#[derive(Debug, Clone)]
pub(crate) struct BucketLayout {
    /// Per bucket: the slots it holds, in the order of its flat buffer.
    pub(crate) buckets: Vec<Bucket>,
    /// Per slot: its bucket.
    pub(crate) bucket_of: Vec<usize>,
    /// The order the slots were laid out in.
    pub(crate) order: Vec<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub(crate) slots: Vec<usize>,
}

impl BucketLayout {
    /// Lays out slots (with `numel` elements each) in `order` into buckets of the given caps.
    pub(crate) fn new(
        order: Vec<usize>,
        numel: &[usize],
        first_cap_bytes: usize,
        cap_bytes: usize,
    ) -> Self {
        let sizes: Vec<usize> = order.iter().map(|&s| numel[s] * 4).collect();
        let mut bucket_of = vec![0; numel.len()];
        let buckets = assign_buckets(&sizes, first_cap_bytes, cap_bytes)
            .into_iter()
            .enumerate()
            .map(|(b, range)| {
                let slots: Vec<usize> = order[range].to_vec();
                for &s in &slots {
                    bucket_of[s] = b;
                }
                Bucket { slots }
            })
            .collect();
        BucketLayout {
            buckets,
            bucket_of,
            order,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_in_exactly_its_bucket_in_order() {
        let numel = [3, 5, 2, 7];
        let l = BucketLayout::new(vec![3, 2, 1, 0], &numel, 16, 32);
        let flat: Vec<usize> = l.buckets.iter().flat_map(|b| b.slots.clone()).collect();
        assert_eq!(flat, vec![3, 2, 1, 0], "buckets follow the given order");
        for (b, bucket) in l.buckets.iter().enumerate() {
            assert!(bucket.slots.iter().all(|&s| l.bucket_of[s] == b));
        }
        assert_eq!(
            l.buckets[0].slots,
            vec![3],
            "7 floats (28 B) exceed the 16 B first cap alone"
        );
    }
}
