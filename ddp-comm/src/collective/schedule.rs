//! Ring schedules as pure functions.
//!
//! A ring over `n` ranks splits a buffer into `n` segments. In a reduce-scatter that leaves rank
//! `r` owning segment `(r + k) mod n`, at step `s` rank `r` sends segment `(r + k - 1 - s)` to
//! its right neighbour and receives segment `(r + k - 2 - s)` from its left one, adding it in; in
//! the matching all-gather it sends `(r + k - s)` and receives `(r + k - 1 - s)`. After `n - 1`
//! steps of each, every rank holds every fully reduced segment.
//!
//! All-to-all over point-to-point links is a pairwise exchange: at step `s` (`1..n`) rank `r`
//! sends its chunk for rank `(r + s) mod n` there and receives from rank `(r - s) mod n`, which
//! sends to `r` at that same step; every step pairs ranks up as a permutation, so no rank waits
//! on one that is busy elsewhere.

use std::ops::Range;

/// Splits `count` elements into `parts` contiguous ranges whose lengths differ by at most one.
///
/// ```text
/// segments(10, 3) == [0..3, 3..6, 6..10]
/// ```
pub(crate) fn segments(count: usize, parts: usize) -> Vec<Range<usize>> {
    (0..parts)
        .map(|i| (i * count / parts)..((i + 1) * count / parts))
        .collect()
}

/// `(x) mod n` for a possibly negative `x`.
pub(crate) fn wrap(x: isize, n: usize) -> usize {
    x.rem_euclid(n as isize) as usize
}

/// Segments `(send, receive)` of reduce-scatter step `step` for rank `rank` that ends owning
/// segment `(rank + shift) mod n`.
pub(crate) fn reduce_scatter_step(
    rank: usize,
    n: usize,
    shift: usize,
    step: usize,
) -> (usize, usize) {
    let base = (rank + shift) as isize - step as isize;
    (wrap(base - 1, n), wrap(base - 2, n))
}

/// Segments `(send, receive)` of all-gather step `step` for rank `rank` that starts owning
/// segment `(rank + shift) mod n`.
pub(crate) fn all_gather_step(rank: usize, n: usize, shift: usize, step: usize) -> (usize, usize) {
    let base = (rank + shift) as isize - step as isize;
    (wrap(base, n), wrap(base - 1, n))
}

/// Ranks `(send to, receive from)` at step `step` (`1..n`) of the pairwise all-to-all exchange
/// for rank `rank`. Step 0 would be the rank itself: its own chunk is a local copy.
pub(crate) fn pairwise_step(rank: usize, n: usize, step: usize) -> (usize, usize) {
    debug_assert!(rank < n && step < n, "rank {rank}, step {step} of {n}");
    ((rank + step) % n, (rank + n - step) % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_count_without_gaps() {
        for count in [0, 1, 7, 10, 1000] {
            for parts in 1..6 {
                let s = segments(count, parts);
                assert_eq!(s.len(), parts);
                assert_eq!(s[0].start, 0);
                assert_eq!(s[parts - 1].end, count);
                for w in s.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let lens: Vec<_> = s.iter().map(|r| r.len()).collect();
                let (min, max) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
                assert!(max - min <= 1, "{count}/{parts}: {lens:?}");
            }
        }
    }

    /// Runs the `n - 1` steps of a ring symbolically over `state[rank][segment]`, for the two
    /// tables the ring test keeps: at each step every rank checks that its left neighbour sends
    /// the segment it expects by `schedule` (`reduce_scatter_step` or `all_gather_step`), and
    /// takes it in with `receive(its own, the neighbour's as it was before the step)`.
    fn run_ring<T: Clone>(
        state: &mut [Vec<T>],
        shift: usize,
        schedule: fn(usize, usize, usize, usize) -> (usize, usize),
        mut receive: impl FnMut(&mut T, T),
    ) {
        let n = state.len();
        for step in 0..n.saturating_sub(1) {
            let snapshot = state.to_vec();
            for (r, segs) in state.iter_mut().enumerate() {
                let left = (r + n - 1) % n;
                let (send_l, _) = schedule(left, n, shift, step);
                let (_, recv) = schedule(r, n, shift, step);
                assert_eq!(send_l, recv, "left sends what right expects");
                receive(&mut segs[recv], snapshot[left][recv].clone());
            }
        }
    }

    /// Simulates the ring symbolically: each segment's set of contributing ranks.
    #[test]
    fn ring_schedule_reduces_every_segment_over_every_rank() {
        for n in 1usize..7 {
            for shift in 0..n {
                // held[r][seg] = set of ranks whose data rank r has summed into seg.
                let mut held: Vec<Vec<u64>> = (0..n)
                    .map(|r| (0..n).map(|_| 1u64 << r).collect())
                    .collect();
                run_ring(&mut held, shift, reduce_scatter_step, |mine, sent| {
                    *mine |= sent
                });
                let all = (1u64 << n) - 1;
                for r in 0..n {
                    assert_eq!(
                        held[r][(r + shift) % n],
                        all,
                        "n={n} shift={shift} rank {r}"
                    );
                }
                // all-gather: receive segments; check every rank ends with every full segment.
                let mut full: Vec<Vec<bool>> = (0..n)
                    .map(|r| (0..n).map(|s| s == (r + shift) % n).collect())
                    .collect();
                run_ring(&mut full, shift, all_gather_step, |mine, sent| {
                    assert!(sent, "left sends a segment it holds");
                    *mine = true;
                });
                assert!(full.iter().all(|f| f.iter().all(|&x| x)));
            }
        }
    }

    /// Every ordered pair of distinct ranks exchanges exactly once, at a step where the receiver
    /// expects that very sender.
    #[test]
    fn pairwise_schedule_connects_every_pair_once_with_matching_partners() {
        for n in 1usize..9 {
            let mut sent = vec![vec![0u32; n]; n];
            for step in 1..n {
                for (r, row) in sent.iter_mut().enumerate() {
                    let (to, from) = pairwise_step(r, n, step);
                    assert_ne!(to, r, "n={n} step {step}: rank {r} sends to itself");
                    assert_eq!(
                        pairwise_step(to, n, step).1,
                        r,
                        "n={n} step {step}: rank {to} receives from rank {r}"
                    );
                    assert_eq!(pairwise_step(from, n, step).0, r);
                    row[to] += 1;
                }
            }
            for (r, row) in sent.iter().enumerate() {
                for (q, &times) in row.iter().enumerate() {
                    assert_eq!(times, u32::from(q != r), "n={n}: {r} -> {q}");
                }
            }
        }
    }
}
