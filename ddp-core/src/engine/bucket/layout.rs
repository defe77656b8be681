//! Which bucket each parameter's gradient belongs to, and each bucket's parameters in order.

use super::assign::assign_buckets;

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
    /// Lays out slots (of `bytes` bytes and `dtypes` each) in `order` into buckets of the given
    /// caps. A bucket holds one dtype (it is reduced as one collective of that type): where the
    /// dtype changes along `order`, a new bucket starts.
    pub(crate) fn new<K: PartialEq>(
        order: Vec<usize>,
        bytes: &[usize],
        dtypes: &[K],
        first_cap_bytes: usize,
        cap_bytes: usize,
    ) -> Self {
        let mut bucket_of = vec![0; bytes.len()];
        let mut buckets = Vec::new();
        let mut run_start = 0;
        while run_start < order.len() {
            let dtype = &dtypes[order[run_start]];
            let run_end = order[run_start..]
                .iter()
                .position(|&s| &dtypes[s] != dtype)
                .map_or(order.len(), |k| run_start + k);
            let run = &order[run_start..run_end];
            let sizes: Vec<usize> = run.iter().map(|&s| bytes[s]).collect();
            let first = if buckets.is_empty() {
                first_cap_bytes
            } else {
                cap_bytes
            };
            for range in assign_buckets(&sizes, first, cap_bytes) {
                let slots: Vec<usize> = run[range].to_vec();
                for &s in &slots {
                    bucket_of[s] = buckets.len();
                }
                buckets.push(Bucket { slots });
            }
            run_start = run_end;
        }
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
        let bytes = [12, 20, 8, 28];
        let l = BucketLayout::new(vec![3, 2, 1, 0], &bytes, &[0; 4], 16, 32);
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

    #[test]
    fn a_bucket_never_mixes_dtypes() {
        // Slots 0 and 2 are f64 ("d"), 1 and 3 f32 ("f"); all fit in one bucket by size.
        let l = BucketLayout::new(
            vec![3, 1, 2, 0],
            &[8; 4],
            &["d", "f", "d", "f"],
            1 << 20,
            1 << 20,
        );
        let slots: Vec<Vec<usize>> = l.buckets.iter().map(|b| b.slots.clone()).collect();
        assert_eq!(slots, vec![vec![3, 1], vec![2, 0]]);
        assert_eq!(l.bucket_of, vec![1, 0, 1, 0]);
    }
}
