//! Which parameters share a bucket: a pure function of their sizes and the caps.

use std::ops::Range;

/// Splits parameters, given in the order they should fill buckets, into consecutive buckets.
///
/// A bucket is closed when the next parameter would take it over its cap; the first bucket has
/// its own (small) cap so that the first all-reduce starts early, as in PyTorch. A parameter
/// larger than the cap gets a bucket of its own (see the first test below).
pub(crate) fn assign_buckets(
    sizes_bytes: &[usize],
    first_cap_bytes: usize,
    cap_bytes: usize,
) -> Vec<Range<usize>> {
    let mut buckets = Vec::new();
    let mut start = 0;
    let mut filled = 0;
    for (i, &size) in sizes_bytes.iter().enumerate() {
        let cap = if buckets.is_empty() {
            first_cap_bytes
        } else {
            cap_bytes
        };
        if i > start && filled + size > cap {
            buckets.push(start..i);
            start = i;
            filled = 0;
        }
        filled += size;
    }
    if start < sizes_bytes.len() {
        buckets.push(start..sizes_bytes.len());
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_close_buckets_and_a_large_parameter_stands_alone() {
        // 4-byte parameters, first bucket capped at 8 bytes, the rest at 12.
        let buckets = assign_buckets(&[4, 4, 4, 4, 4, 20, 4], 8, 12);
        assert_eq!(buckets, vec![0..2, 2..5, 5..6, 6..7]);
    }

    #[test]
    fn every_parameter_is_in_exactly_one_bucket_in_order() {
        let sizes: Vec<usize> = (0..50).map(|i| (i * 37) % 200 + 1).collect();
        let b = assign_buckets(&sizes, 100, 300);
        assert_eq!(b.first().map(|r| r.start), Some(0));
        assert_eq!(b.last().map(|r| r.end), Some(50));
        for w in b.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        for (k, r) in b.iter().enumerate() {
            let total: usize = sizes[r.clone()].iter().sum();
            let cap = if k == 0 { 100 } else { 300 };
            assert!(
                total <= cap || r.len() == 1,
                "bucket {k} over cap with several params"
            );
        }
    }

    #[test]
    fn empty_model_has_no_buckets() {
        assert!(assign_buckets(&[], 1, 1).is_empty());
    }
}
