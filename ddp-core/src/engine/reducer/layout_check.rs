//! The bucket-layout check: every rank must reduce the same buckets, element for element.
//!
//! The CPU transports compare each collective's kind, dtype and length and name a mismatch;
//! NCCL cannot: ranks that disagree on a bucket's size hang inside NCCL or add unrelated
//! gradients together. So before the first bucket is reduced, and after every re-layout, the
//! ranks exchange a fingerprint of their layout over the CPU process group (8 bytes each) and a
//! difference is a named [`DdpError::BucketLayoutMismatch`].

use super::reduction::Slot;
use crate::engine::bucket::BucketLayout;
use crate::error::DdpError;
use burn::tensor::backend::Backend;
use ddp_comm::ProcessGroup;

/// FNV-1a over the layout: per bucket, per slot, its path, shape and dtype. A hash of our own
/// (not `std`'s) so that every build and every machine of a job computes the same value.
pub(crate) fn fingerprint<I: Backend>(slots: &[Slot<I>], layout: &BucketLayout) -> u64 {
    let mut h = Fnv::default();
    h.u64(layout.buckets.len() as u64);
    for bucket in &layout.buckets {
        h.u64(bucket.slots.len() as u64);
        for &i in &bucket.slots {
            let slot = &slots[i];
            h.bytes(slot.path.as_bytes());
            h.u64(slot.shape.len() as u64);
            for &d in &slot.shape {
                h.u64(d as u64);
            }
            h.bytes(format!("{:?}", slot.dtype).as_bytes());
        }
    }
    h.0
}

/// Compares this rank's layout with every other rank's; `when` says at which point (for the
/// error).
///
/// # Collective
/// Every rank of `pg` calls it at the same point.
pub(crate) fn verify<I: Backend>(
    pg: &ProcessGroup,
    slots: &[Slot<I>],
    layout: &BucketLayout,
    when: &'static str,
) -> Result<(), DdpError> {
    // i64 carries the 64 bits (the transports have no u64); only equality matters.
    let mine = i64::from_le_bytes(fingerprint(slots, layout).to_le_bytes());
    let mut all = vec![0i64; pg.world_size()];
    pg.all_gather(&[mine], &mut all)
        .map_err(DdpError::comm("comparing bucket layouts across ranks"))?;
    let reference = all[0];
    let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != reference).collect();
    if differ.is_empty() {
        return Ok(());
    }
    let sizes: Vec<usize> = layout
        .buckets
        .iter()
        .map(|b| b.slots.iter().map(|&i| slots[i].numel()).sum())
        .collect();
    Err(DdpError::BucketLayoutMismatch {
        when,
        ranks: differ
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        rank: pg.rank(),
        buckets: format!("{sizes:?}"),
    })
}

#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::DType;

    type B = burn::backend::Flex;

    fn slot(path: &str, shape: &[usize]) -> Slot<B> {
        Slot {
            path: path.into(),
            shape: shape.to_vec(),
            dtype: DType::F32,
            device: Default::default(),
            entries: vec![0],
        }
    }

    fn print(slots: &[Slot<B>], order: Vec<usize>, cap: usize) -> u64 {
        let bytes: Vec<usize> = slots.iter().map(|s| s.numel() * 4).collect();
        let dtypes = vec![DType::F32; slots.len()];
        fingerprint(slots, &BucketLayout::new(order, &bytes, &dtypes, cap, cap))
    }

    #[test]
    fn the_fingerprint_sees_order_shapes_names_and_bucket_boundaries() {
        let a = [slot("w", &[4, 3]), slot("b", &[3])];
        let base = print(&a, vec![1, 0], 1 << 20);
        assert_eq!(base, print(&a, vec![1, 0], 1 << 20), "deterministic");
        assert_ne!(base, print(&a, vec![0, 1], 1 << 20), "order");
        assert_ne!(base, print(&a, vec![1, 0], 16), "bucket boundaries");
        let reshaped = [slot("w", &[3, 4]), slot("b", &[3])];
        assert_ne!(base, print(&reshaped, vec![1, 0], 1 << 20), "shape");
        let renamed = [slot("v", &[4, 3]), slot("b", &[3])];
        assert_ne!(base, print(&renamed, vec![1, 0], 1 << 20), "path");
    }
}
