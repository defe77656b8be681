//! Where each parameter's gradient lives: bucket, offset and length in the flat buffers.

use super::plan::assign_buckets;
use std::ops::Range;

/// The bucket assignment for one ordering of the parameters.
#[derive(Debug, Clone)]
pub(crate) struct BucketLayout {
    /// Per bucket: the slots it holds and its length in elements.
    pub(crate) buckets: Vec<Bucket>,
    /// Per slot: `(bucket, range of elements in that bucket)`.
    pub(crate) location: Vec<(usize, Range<usize>)>,
    /// The order the slots were laid out in.
    pub(crate) order: Vec<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub(crate) slots: Vec<usize>,
    pub(crate) len: usize,
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
        let mut location = vec![(0, 0..0); numel.len()];
        let buckets = assign_buckets(&sizes, first_cap_bytes, cap_bytes)
            .into_iter()
            .enumerate()
            .map(|(b, range)| {
                let slots: Vec<usize> = order[range].to_vec();
                let mut offset = 0;
                for &s in &slots {
                    location[s] = (b, offset..offset + numel[s]);
                    offset += numel[s];
                }
                Bucket { slots, len: offset }
            })
            .collect();
        BucketLayout {
            buckets,
            location,
            order,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_tile_each_bucket() {
        let numel = [3, 5, 2, 7];
        let l = BucketLayout::new(vec![3, 2, 1, 0], &numel, 16, 32);
        for (b, bucket) in l.buckets.iter().enumerate() {
            let mut covered = 0;
            for &s in &bucket.slots {
                assert_eq!(l.location[s].0, b);
                assert_eq!(l.location[s].1.start, covered);
                covered = l.location[s].1.end;
            }
            assert_eq!(covered, bucket.len);
        }
        assert_eq!(
            l.buckets[0].slots,
            vec![3],
            "7 floats (28 B) exceed the 16 B first cap alone"
        );
    }
}
