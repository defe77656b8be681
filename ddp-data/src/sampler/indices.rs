//! Pure index arithmetic of `torch.utils.data.DistributedSampler`.
//!
//! Everything the sampler does to split an epoch's order between ranks is in
//! these functions, so it can be checked in isolation.

/// Samples each rank yields per epoch, computed as PyTorch does.
///
/// PyTorch: with `drop_last` and `len % n != 0` it is
/// `ceil((len - n) / n)`, otherwise `ceil(len / n)`. With `drop_last` this
/// equals `floor(len / n)` (including `0` when `len < n`), which is what is
/// computed here without going through floating point.
///
/// A world size of 0 (rejected by the sampler's config) gives 0.
pub fn num_samples_per_rank(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    if num_replicas == 0 {
        0
    } else if drop_last {
        dataset_len / num_replicas
    } else {
        dataset_len.div_ceil(num_replicas)
    }
}

/// Samples all ranks yield together per epoch: `num_samples * num_replicas`.
///
/// Without `drop_last` this is `len` rounded up to a multiple of
/// `num_replicas` (padding); with it, rounded down (truncation).
pub fn total_size(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    num_samples_per_rank(dataset_len, num_replicas, drop_last) * num_replicas
}

/// The padded or truncated epoch order that is dealt out to the ranks,
/// literally as PyTorch builds it.
///
/// Without truncation the order is extended by repeating it from its start,
/// as many times as needed (`indices += (indices * ceil(padding / len))[:padding]`);
/// otherwise it is cut to `total_size`.
pub fn padded_order(order: &[usize], total_size: usize) -> Vec<usize> {
    if total_size <= order.len() {
        return order[..total_size].to_vec();
    }
    if order.is_empty() {
        return Vec::new();
    }
    order.iter().copied().cycle().take(total_size).collect()
}

/// The indices rank `rank` takes in one epoch, given the epoch `order`:
/// pad or truncate with [`padded_order`], then take positions
/// `rank, rank + num_replicas, ...`.
///
/// A world size of 0 gives an empty list.
pub fn rank_indices(
    order: &[usize],
    num_replicas: usize,
    rank: usize,
    drop_last: bool,
) -> Vec<usize> {
    let total = total_size(order.len(), num_replicas, drop_last);
    padded_order(order, total)
        .into_iter()
        .skip(rank)
        .step_by(num_replicas.max(1))
        .collect()
}

/// Position in the padded epoch order of the `position`-th sample of `rank`:
/// `rank + position * num_replicas`.
pub fn global_position(rank: usize, num_replicas: usize, position: usize) -> usize {
    rank + position * num_replicas
}

/// The dataset index of the `position`-th sample of `rank` in O(1):
/// `order[global_position % order.len()]`, or `None` for an empty order.
///
/// Equal to `rank_indices(order, num_replicas, rank, drop_last)[position]` for
/// every `position < num_samples_per_rank(..)`, since padding repeats the
/// order cyclically and truncation only shortens it.
pub fn index_at(
    order: &[usize],
    num_replicas: usize,
    rank: usize,
    position: usize,
) -> Option<usize> {
    let global = global_position(rank, num_replicas, position);
    global.checked_rem(order.len()).map(|i| order[i])
}

/// Samples each rank yields in an epoch whose first `offset` entries of the
/// order were already consumed (by a previous world size, see
/// [`SamplerState::resharded_for`](crate::SamplerState::resharded_for)):
/// [`num_samples_per_rank`] of the `len - offset` that are left. Equal to
/// `num_samples_per_rank(len, ..)` for `offset == 0`.
pub fn num_samples_from(
    dataset_len: usize,
    offset: usize,
    num_replicas: usize,
    drop_last: bool,
) -> usize {
    num_samples_per_rank(dataset_len.saturating_sub(offset), num_replicas, drop_last)
}

/// [`index_at`] for an epoch dealt out from global position `offset` on:
/// `order[(offset + rank + position * num_replicas) % order.len()]`, so
/// padding still repeats the order cyclically from its start. Equal to
/// [`index_at`] for `offset == 0`; `None` for an empty order.
pub fn index_at_from(
    order: &[usize],
    offset: usize,
    num_replicas: usize,
    rank: usize,
    position: usize,
) -> Option<usize> {
    let global = offset + global_position(rank, num_replicas, position);
    global.checked_rem(order.len()).map(|i| order[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PyTorch's formula, evaluated in floating point as Python does.
    fn pytorch_num_samples(len: usize, n: usize, drop_last: bool) -> usize {
        let (len, n) = (len as f64, n as f64);
        if drop_last && len % n != 0.0 {
            ((len - n) / n).ceil().max(0.0) as usize
        } else {
            (len / n).ceil() as usize
        }
    }

    #[test]
    fn num_samples_matches_pytorch_formula() {
        for len in 0..200 {
            for n in 1..12 {
                for drop_last in [false, true] {
                    assert_eq!(
                        num_samples_per_rank(len, n, drop_last),
                        pytorch_num_samples(len, n, drop_last),
                        "len {len} n {n} drop_last {drop_last}"
                    );
                }
            }
        }
    }

    #[test]
    fn total_size_pads_up_or_truncates_down() {
        assert_eq!(total_size(10, 3, false), 12);
        assert_eq!(total_size(10, 3, true), 9);
        assert_eq!(total_size(9, 3, false), 9);
        assert_eq!(total_size(9, 3, true), 9);
        assert_eq!(total_size(2, 5, true), 0);
    }

    #[test]
    fn padded_order_repeats_from_the_start_as_often_as_needed() {
        assert_eq!(padded_order(&[7, 8], 5), vec![7, 8, 7, 8, 7]);
        assert_eq!(padded_order(&[4, 2, 9], 4), vec![4, 2, 9, 4]);
        assert_eq!(padded_order(&[4, 2, 9], 2), vec![4, 2]);
        assert_eq!(padded_order(&[], 0), Vec::<usize>::new());
    }

    #[test]
    fn rank_indices_strides_by_world_size() {
        let order: Vec<usize> = (0..10).collect();
        assert_eq!(rank_indices(&order, 3, 1, false), vec![1, 4, 7, 0]);
        assert_eq!(rank_indices(&order, 3, 2, true), vec![2, 5, 8]);
    }

    #[test]
    fn degenerate_inputs_give_empty_results_instead_of_panicking() {
        assert_eq!(num_samples_per_rank(10, 0, false), 0);
        assert_eq!(rank_indices(&[1, 2], 0, 0, false), Vec::<usize>::new());
        assert_eq!(index_at(&[], 2, 1, 0), None);
    }

    #[test]
    fn index_at_from_shifts_by_the_offset_and_wraps() {
        let order = vec![5, 3, 0, 4, 1, 2, 6];
        // offset 3 on 2 ranks: rank 1 takes global 4, 6, 8 (wraps to 1), ...
        assert_eq!(index_at_from(&order, 3, 2, 1, 0), Some(1));
        assert_eq!(index_at_from(&order, 3, 2, 1, 1), Some(6));
        assert_eq!(index_at_from(&order, 3, 2, 1, 2), Some(3));
        assert_eq!(index_at_from(&order, 0, 3, 2, 1), index_at(&order, 3, 2, 1));
        assert_eq!(index_at_from(&[], 1, 2, 0, 0), None);
        assert_eq!(num_samples_from(7, 3, 2, false), 2);
        assert_eq!(num_samples_from(7, 3, 3, true), 1);
        assert_eq!(num_samples_from(7, 9, 3, false), 0);
    }

    #[test]
    fn index_at_agrees_with_rank_indices() {
        let order = vec![5, 3, 0, 4, 1, 2, 6];
        for n in 1..10 {
            for rank in 0..n {
                for drop_last in [false, true] {
                    let expected = rank_indices(&order, n, rank, drop_last);
                    let fast: Vec<usize> = (0..num_samples_per_rank(order.len(), n, drop_last))
                        .map(|p| index_at(&order, n, rank, p).unwrap())
                        .collect();
                    assert_eq!(fast, expected, "n {n} rank {rank} drop_last {drop_last}");
                }
            }
        }
    }
}
