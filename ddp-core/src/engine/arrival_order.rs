//! Rank 0's arrival order, agreed by every rank.
//!
//! DDP lays its buckets out, and FSDP launches its units, in the order gradients arrived on
//! rank 0 in one backward. Every rank must use the same order (collectives are matched by
//! position), so rank 0's is broadcast and checked to be a permutation before anyone adopts it.

use ddp_comm::{CommError, ProcessGroup};

/// Why no order was agreed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OrderError {
    /// The broadcast failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// What arrived is not a permutation of the items (a bug, or a peer out of step).
    #[error("rank 0 sent an order that is not a permutation of the {0} items")]
    NotPermutation(usize),
}

/// The items of `arrival` in order (as rank 0 saw them), then those that never arrived in
/// their `current` order; broadcast from rank 0 when `pg` is given, and checked to be a
/// permutation of `0..current.len()`.
pub(crate) fn agree_on_rank0_order(
    pg: Option<&ProcessGroup>,
    arrival: &[usize],
    current: &[usize],
) -> Result<Vec<usize>, OrderError> {
    let n = current.len();
    let mut arrived = vec![false; n];
    for &x in arrival {
        if let Some(a) = arrived.get_mut(x) {
            *a = true;
        }
    }
    let mut order: Vec<i64> = arrival.iter().map(|&x| x as i64).collect();
    order.extend(
        current
            .iter()
            .filter(|&&x| !arrived.get(x).copied().unwrap_or(false))
            .map(|&x| x as i64),
    );
    if let Some(pg) = pg.filter(|pg| pg.world_size() > 1) {
        pg.broadcast(&mut order, 0)?;
    }
    let mut seen = vec![false; n];
    let order: Option<Vec<usize>> = order
        .into_iter()
        .map(|x| {
            usize::try_from(x)
                .ok()
                .filter(|&x| x < n && !std::mem::replace(&mut seen[x], true))
        })
        .collect();
    order
        .filter(|o| o.len() == n)
        .ok_or(OrderError::NotPermutation(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_that_never_arrived_follow_in_their_current_order() {
        let order = agree_on_rank0_order(None, &[2, 0], &[3, 2, 1, 0]).unwrap();
        assert_eq!(order, vec![2, 0, 3, 1]);
    }

    #[test]
    fn repeated_or_out_of_range_items_are_refused() {
        assert!(matches!(
            agree_on_rank0_order(None, &[1, 1], &[0, 1]),
            Err(OrderError::NotPermutation(2))
        ));
        assert!(matches!(
            agree_on_rank0_order(None, &[5], &[0, 1]),
            Err(OrderError::NotPermutation(2))
        ));
    }
}
