//! Which rank owns which parameter: PyTorch's rule, largest tensors first, each to the rank
//! whose shard is smallest so far, so every rank's optimizer state is about `1/world` of the
//! total. It depends only on the tensors' sizes and order, so every rank computes the same
//! partition without talking to the others.

/// The owner of every float tensor of a module (in module order): `None` for tensors the
/// optimizer never steps (buffers, frozen parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Partition {
    owners: Vec<Option<usize>>,
    loads: Vec<usize>,
}

impl Partition {
    /// Partitions the tensors of `sizes` (bytes; `None` for tensors that are not trained) over
    /// `world` ranks. Ties go to the lower rank, then to the earlier tensor.
    pub(crate) fn balanced(sizes: &[Option<usize>], world: usize) -> Self {
        let world = world.max(1);
        let mut order: Vec<(usize, usize)> = sizes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .collect();
        // Stable: equal sizes keep module order.
        order.sort_by_key(|&(_, size)| std::cmp::Reverse(size));
        let mut owners = vec![None; sizes.len()];
        let mut loads = vec![0usize; world];
        for (index, size) in order {
            let rank = (0..world)
                .min_by_key(|&r| (loads[r], r))
                .unwrap_or_default();
            loads[rank] += size;
            owners[index] = Some(rank);
        }
        Partition { owners, loads }
    }

    /// The owner of each tensor, in module order.
    pub(crate) fn owners(&self) -> &[Option<usize>] {
        &self.owners
    }

    /// Bytes of parameters each rank owns.
    pub(crate) fn loads(&self) -> &[usize] {
        &self.loads
    }

    /// Which tensors `rank` owns, in module order.
    pub(crate) fn mask(&self, rank: usize) -> Vec<bool> {
        self.owners.iter().map(|o| *o == Some(rank)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trained_tensor_has_exactly_one_owner_and_others_none() {
        let sizes = [Some(40), None, Some(8), Some(40), None, Some(4)];
        let p = Partition::balanced(&sizes, 3);
        for (i, s) in sizes.iter().enumerate() {
            assert_eq!(p.owners()[i].is_some(), s.is_some(), "tensor {i}");
        }
        assert_eq!(p.loads().iter().sum::<usize>(), 92);
        let masks: Vec<Vec<bool>> = (0..3).map(|r| p.mask(r)).collect();
        for i in 0..sizes.len() {
            let n = masks.iter().filter(|m| m[i]).count();
            assert_eq!(n, usize::from(sizes[i].is_some()), "tensor {i}");
        }
    }

    #[test]
    fn largest_first_to_the_lightest_rank() {
        // 100 -> r0, 60 -> r1, 50 -> r1 (60 < 100), 30 -> r0 (100 < 110), 10 -> r1 (110 < 130).
        let p = Partition::balanced(&[Some(10), Some(50), Some(100), Some(30), Some(60)], 2);
        assert_eq!(
            p.owners(),
            &[Some(1), Some(1), Some(0), Some(0), Some(1)][..]
        );
        assert_eq!(p.loads(), &[130, 120][..]);
    }

    #[test]
    fn balanced_within_one_tensor_of_the_ideal() {
        let sizes: Vec<Option<usize>> = (0..37).map(|i| Some(1 + (i * 7919) % 97)).collect();
        let total: usize = sizes.iter().flatten().sum();
        let largest = sizes.iter().flatten().max().copied().unwrap_or(0);
        for world in 1..=8 {
            let p = Partition::balanced(&sizes, world);
            let max = p.loads().iter().max().copied().unwrap_or(0);
            assert!(
                max <= total.div_ceil(world) + largest,
                "world {world}: {:?}",
                p.loads()
            );
            assert_eq!(p, Partition::balanced(&sizes, world), "deterministic");
        }
    }

    #[test]
    fn equal_tensors_are_spread_round_robin() {
        let p = Partition::balanced(&[Some(8); 6], 3);
        assert_eq!(p.loads(), &[16, 16, 16][..]);
    }
}
