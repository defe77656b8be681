//! Every collective x op x element type x world size {1,2,3,4} x lengths {0, 1, prime, not
//! divisible by the world size} (all-to-all: chunks of 0, 1, a prime and more than any
//! transport's internal buffer), checked against a result computed locally, on every transport:
//! TCP, shared memory (ranks as threads share a host), two pretend hosts (hierarchical), and
//! with the `mpi` feature MPI (ranks as processes under `mpirun`).

#[path = "comm/common/mod.rs"]
mod common;

use common::{SETUPS, SMALL_BUFFER, Setup, run_ok_with};
use ddp_comm::{Element, ProcessGroup, ReduceOp, bf16, f16};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Product,
];

/// Converts the small integers the tests use into each element type exactly.
trait TestValue: Element {
    fn from_i64(v: i64) -> Self;
    fn signed() -> bool;
    /// `Avg` of the ranks' `vals` (in rank order), as ddp-comm defines it for the type.
    fn avg(vals: &[Self]) -> Self;
}

/// The sum (exact for the test values) divided by the number of ranks.
fn sum_then_divide<T: TestValue>(vals: &[T], div: impl Fn(T, usize) -> T) -> T {
    div(
        vals[1..].iter().fold(vals[0], |a, &v| add(a, v)),
        vals.len(),
    )
}

macro_rules! int_value {
    ($($t:ty: $signed:expr),*) => {$(impl TestValue for $t {
        fn from_i64(v: i64) -> Self { v as $t }
        fn signed() -> bool { $signed }
        fn avg(vals: &[Self]) -> Self { sum_then_divide(vals, |s, n| s / n as $t) }
    })*};
}
int_value!(i32: true, i64: true, u8: false);

macro_rules! float_value {
    ($($t:ty, $from:expr),*) => {$(impl TestValue for $t {
        fn from_i64(v: i64) -> Self { $from(v as f32) }
        fn signed() -> bool { true }
        fn avg(vals: &[Self]) -> Self { sum_then_divide(vals, |s, n| s / $from(n as f32)) }
    })*};
}
float_value!(f32, |v: f32| v, f64, |v: f32| v as f64);

/// f16 and bf16: each value scaled by 1/n in f32, then summed in the type. The sum of the
/// scaled test values (multiples of one rounded third, quarter or half) is the same in any
/// order, so it does not depend on how a transport orders its additions.
macro_rules! half_value {
    ($($t:ty),*) => {$(impl TestValue for $t {
        fn from_i64(v: i64) -> Self { <$t>::from_f32(v as f32) }
        fn signed() -> bool { true }
        fn avg(vals: &[Self]) -> Self {
            let n = vals.len() as f32;
            let scaled = |v: $t| <$t>::from_f32(v.to_f32() / n);
            vals[1..].iter().fold(scaled(vals[0]), |a, &v| a + scaled(v))
        }
    })*};
}
half_value!(f16, bf16);

/// Rank `r`'s value at index `i`: small integers, so every sum and product is exact in every
/// type and the result does not depend on the order of reduction.
fn value<T: TestValue>(r: usize, i: usize) -> T {
    let v = ((r * 7 + i * 3) % 3) as i64;
    T::from_i64(if T::signed() { v - 1 } else { v })
}

fn input<T: TestValue>(r: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| value(r, i)).collect()
}

fn reduce_locally<T: TestValue + PartialOrd>(
    n: usize,
    len: usize,
    offset: usize,
    op: ReduceOp,
) -> Vec<T> {
    (0..len)
        .map(|i| {
            let vals: Vec<T> = (0..n).map(|r| value(r, i + offset)).collect();
            if op == ReduceOp::Avg {
                return T::avg(&vals);
            }
            let mut acc = vals[0];
            for &v in &vals[1..] {
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => add(acc, v),
                    ReduceOp::Product => mul(acc, v),
                    ReduceOp::Min => {
                        if v < acc {
                            v
                        } else {
                            acc
                        }
                    }
                    ReduceOp::Max => {
                        if v > acc {
                            v
                        } else {
                            acc
                        }
                    }
                };
            }
            acc
        })
        .collect()
}

// Exact for the small integers used here, in every type.
fn add<T: TestValue>(a: T, b: T) -> T {
    T::from_i64(to_i64(a) + to_i64(b))
}
fn mul<T: TestValue>(a: T, b: T) -> T {
    T::from_i64(to_i64(a) * to_i64(b))
}
fn to_i64<T: TestValue>(v: T) -> i64 {
    // Find the integer in the small range the tests use whose conversion matches.
    (-64..=64)
        .find(|&k| T::from_i64(k) == v)
        .expect("test values stay in -64..=64")
}

/// Lengths: empty, one, a prime, one not divisible by the world size; with small staging
/// buffers also one that takes several steps of every collective (and is odd).
fn lengths(setup: Setup, n: usize) -> Vec<usize> {
    let mut l = vec![0, 1, 13, 4 * n + 1];
    if matches!(setup, Setup::ShmSmall | Setup::TwoHosts) {
        l.push(3 * SMALL_BUFFER / 2 + 7);
    }
    l
}

/// Bytes of the largest all-to-all chunk: more than the TCP transport's scratch buffer
/// (256 KiB) and the shared-memory staging buffer (512 KiB by default, 4 KiB in the `*Small`
/// setups), so a chunk streams through several steps everywhere.
const LARGE_CHUNK_BYTES: usize = (512 << 10) + (8 << 10);

/// Elements per chunk of all-to-all: none, one, a prime, and [`LARGE_CHUNK_BYTES`] and one
/// (an odd count).
fn chunk_lengths<T: Element>() -> [usize; 4] {
    [0, 1, 13, LARGE_CHUNK_BYTES / size_of::<T>() + 1]
}

/// Element `i` of the chunk rank `src` sends to rank `dst`: every (source, destination) pair of
/// a world of up to 4 differs at every index, so a chunk from the wrong rank, or for the wrong
/// rank, never passes for the right one. Values stay in 0..61, exact in every type.
fn routed<T: TestValue>(src: usize, dst: usize, i: usize) -> T {
    T::from_i64(((src * 5 + dst * 11 + i) % 61) as i64)
}

/// All-to-all with chunks of every [`chunk_lengths`], blocking and async, against the chunks
/// computed locally; and `payload_bytes` counts the input.
fn check_all_to_all<T: TestValue>(pg: &ProcessGroup) -> ddp_comm::Result<()> {
    let (r, n) = (pg.rank(), pg.world_size());
    for c in chunk_lengths::<T>() {
        let input: Vec<T> = (0..n)
            .flat_map(|dst| (0..c).map(move |i| routed::<T>(r, dst, i)))
            .collect();
        let expected: Vec<T> = (0..n)
            .flat_map(|src| (0..c).map(move |i| routed::<T>(src, r, i)))
            .collect();
        let mut out = vec![T::zeroed(); n * c];
        let before = pg.payload_bytes();
        pg.all_to_all(&input, &mut out)?;
        assert_eq!(
            pg.payload_bytes() - before,
            (n * c * size_of::<T>()) as u64,
            "all_to_all counts its input"
        );
        assert!(
            out == expected,
            "all_to_all chunk {c} n {n} {}: first difference at {:?}",
            T::DTYPE,
            out.iter().zip(&expected).position(|(a, b)| a != b)
        );
        let got = pg.all_to_all_async(input).wait()?;
        assert!(got == expected, "all_to_all_async chunk {c} n {n}");
    }
    Ok(())
}

fn check_type<T: TestValue + PartialOrd>(setup: Setup, n: usize) {
    let results = run_ok_with(setup, n, |pg: ProcessGroup| {
        let r = pg.rank();
        for len in lengths(setup, n) {
            for op in OPS {
                let mut buf = input::<T>(r, len);
                pg.all_reduce(&mut buf, op)?;
                assert_eq!(
                    buf,
                    reduce_locally::<T>(n, len, 0, op),
                    "all_reduce {op} len {len} n {n} {}",
                    T::DTYPE
                );

                let got = pg.all_reduce_async(input::<T>(r, len), op).wait()?;
                assert_eq!(
                    got,
                    reduce_locally::<T>(n, len, 0, op),
                    "all_reduce_async {op}"
                );

                // Coalesced: the same input cut into pieces (an empty one included) at
                // points that differ between ranks.
                let flat = input::<T>(r, len);
                let cuts = [0, (len / 3 + r).min(len), (len / 3 + r).min(len), len];
                let mut pieces: Vec<Vec<T>> =
                    cuts.windows(2).map(|w| flat[w[0]..w[1]].to_vec()).collect();
                let mut views: Vec<&mut [T]> = pieces.iter_mut().map(|p| &mut p[..]).collect();
                pg.all_reduce_coalesced(&mut views, op)?;
                assert_eq!(
                    pieces.concat(),
                    reduce_locally::<T>(n, len, 0, op),
                    "all_reduce_coalesced {op} len {len}"
                );
                let got = pg
                    .all_reduce_coalesced_async(vec![Vec::new(), flat.clone(), Vec::new()], op)
                    .wait()?;
                assert_eq!(got.len(), 3);
                assert_eq!(
                    got.concat(),
                    reduce_locally::<T>(n, len, 0, op),
                    "all_reduce_coalesced_async {op}"
                );

                for root in [0, n - 1] {
                    let mine = input::<T>(r, len);
                    let mut buf = mine.clone();
                    pg.reduce(&mut buf, root, op)?;
                    if r == root {
                        assert_eq!(
                            buf,
                            reduce_locally::<T>(n, len, 0, op),
                            "reduce {op} root {root}"
                        );
                    } else {
                        assert_eq!(buf, mine, "reduce leaves non-root buffers unchanged");
                    }
                }

                // reduce_scatter: input of n*len, block r back.
                let whole: Vec<T> = (0..n * len).map(|i| value(r, i)).collect();
                let mut out = vec![T::zeroed(); len];
                pg.reduce_scatter(&whole, &mut out, op)?;
                assert_eq!(
                    out,
                    reduce_locally::<T>(n, len, r * len, op),
                    "reduce_scatter {op} len {len}"
                );
                let got = pg.reduce_scatter_async(whole, op).wait()?;
                assert_eq!(got, out, "reduce_scatter_async {op}");
            }

            for root in [0, n / 2, n - 1] {
                let mut buf = if r == root {
                    input::<T>(root, len)
                } else {
                    vec![T::zeroed(); len]
                };
                pg.broadcast(&mut buf, root)?;
                assert_eq!(
                    buf,
                    input::<T>(root, len),
                    "broadcast root {root} len {len}"
                );
                let got = pg.broadcast_async(buf, root).wait()?;
                assert_eq!(got, input::<T>(root, len));

                let mine = input::<T>(r, len);
                let expected: Vec<T> = (0..n).flat_map(|p| input::<T>(p, len)).collect();
                if r == root {
                    let mut out = vec![T::zeroed(); n * len];
                    pg.gather(&mine, Some(&mut out), root)?;
                    assert_eq!(out, expected, "gather root {root}");
                } else {
                    pg.gather(&mine, None, root)?;
                }

                let mut out = vec![T::zeroed(); len];
                let src = (r == root).then_some(expected.as_slice());
                pg.scatter(src, &mut out, root)?;
                assert_eq!(out, input::<T>(r, len), "scatter root {root}");
            }

            let expected: Vec<T> = (0..n).flat_map(|p| input::<T>(p, len)).collect();
            let mut out = vec![T::zeroed(); n * len];
            pg.all_gather(&input::<T>(r, len), &mut out)?;
            assert_eq!(out, expected, "all_gather len {len}");
            assert_eq!(pg.all_gather_async(input::<T>(r, len)).wait()?, expected);

            if n > 1 {
                // Pass a message around the ring.
                let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                let send = pg.send_async(input::<T>(r, len), right, 7);
                let mut got = vec![T::zeroed(); len];
                pg.recv(&mut got, left, 7)?;
                send.wait()?;
                assert_eq!(got, input::<T>(left, len), "send/recv len {len}");
            }
            pg.barrier()?;
        }
        check_all_to_all::<T>(&pg)?;
        Ok(())
    });
    assert_eq!(results.len(), setup.ranks_here(n));
}

macro_rules! per_type {
    ($($name:ident: $t:ty),*) => {$(
        mod $name {
            use super::*;

            #[test]
            fn tcp() {
                (1..=4).for_each(|n| check_type::<$t>(Setup::Tcp, n));
            }

            #[test]
            fn shm() {
                (1..=4).for_each(|n| check_type::<$t>(Setup::Shm, n));
            }

            #[test]
            fn shm_small_buffers() {
                (1..=4).for_each(|n| check_type::<$t>(Setup::ShmSmall, n));
            }

            #[test]
            fn shm_two_hosts() {
                (1..=4).for_each(|n| check_type::<$t>(Setup::TwoHosts, n));
            }

            /// Each world size under its own `mpirun`.
            #[cfg(feature = "mpi")]
            #[test]
            fn mpi() {
                let test = concat!(stringify!($name), "::mpi");
                common::mpi::run_test(test, 1..=4, |n| check_type::<$t>(Setup::Mpi, n));
            }
        }
    )*};
}

per_type!(
    every_collective_matches_local_f32: f32,
    every_collective_matches_local_f64: f64,
    every_collective_matches_local_i32: i32,
    every_collective_matches_local_i64: i64,
    every_collective_matches_local_u8: u8,
    every_collective_matches_local_f16: f16,
    every_collective_matches_local_bf16: bf16
);

/// 64 MiB buffers stream through the ring (larger than the socket buffers and the scratch) and
/// through the staging buffers of shared memory.
#[test]
fn large_buffers_stream_correctly() {
    const LEN: usize = 16 << 20; // 16 Mi f32 = 64 MiB
    for (setup, n) in SETUPS.iter().flat_map(|&s| (2..=4).map(move |n| (s, n))) {
        run_ok_with(setup, n, |pg| {
            let r = pg.rank();
            let mut buf: Vec<f32> = (0..LEN).map(|i| ((i + r) % 1000) as f32).collect();
            pg.all_reduce(&mut buf, ReduceOp::Sum)?;
            for (i, v) in buf.iter().enumerate().step_by(4099) {
                let want: f32 = (0..n).map(|q| ((i + q) % 1000) as f32).sum();
                assert_eq!(*v, want, "all_reduce at {i}");
            }
            let mut b: Vec<f32> = if r == 0 {
                (0..LEN).map(|i| i as f32).collect()
            } else {
                vec![0.0; LEN]
            };
            pg.broadcast(&mut b, 0)?;
            assert!(
                b.iter()
                    .enumerate()
                    .step_by(4099)
                    .all(|(i, v)| *v == i as f32),
                "broadcast"
            );
            drop(b);
            let part = LEN / n;
            let mine: Vec<f32> = vec![r as f32; part];
            let mut all = vec![0.0f32; part * n];
            pg.all_gather(&mine, &mut all)?;
            assert!(
                all.chunks(part)
                    .enumerate()
                    .all(|(q, c)| c.iter().all(|v| *v == q as f32)),
                "all_gather"
            );
            let mut out = vec![0.0f32; part];
            pg.reduce_scatter(&all, &mut out, ReduceOp::Max)?;
            assert!(out.iter().all(|v| *v == r as f32), "reduce_scatter");
            Ok(())
        });
    }
}

/// Replicas end bitwise identical even when float addition order would matter, including
/// buffers that take several shared-memory steps.
#[test]
fn all_reduce_results_are_bitwise_identical_across_ranks() {
    for setup in SETUPS {
        for n in [3, 4] {
            let results = run_ok_with(setup, n, |pg| {
                let r = pg.rank() as f32;
                let mut out = Vec::new();
                for len in [10_007, 700_001] {
                    let mut v: Vec<f32> = (0..len)
                        .map(|i| (i as f32 * 0.1 + r).sin() * 1e-3 + 1e3)
                        .collect();
                    pg.all_reduce(&mut v, ReduceOp::Avg)?;
                    out.extend(v.iter().map(|x| x.to_bits()));
                }
                Ok(out)
            });
            assert!(results.windows(2).all(|w| w[0] == w[1]), "{setup:?} n {n}");
        }
    }
}

/// Ranks of the half-precision `Avg` tests: their sum of [`HALF_MEAN`] overflows f16.
const HALF_RANKS: usize = 8;
/// Every rank's value in the half-precision `Avg` tests: the mean fits f16 (max 65504), the
/// sum over [`HALF_RANKS`] ranks (98304) does not. Its eighth (1536) and every partial sum of
/// eighths are exact in both half types, so the mean comes out exact in any order of addition
/// (10000 would not: f16 rounds 5 x 1250 = 6250 to 6248, and the mean to 9992).
const HALF_MEAN: f32 = 12_288.0;

/// `Avg` of every reducing collective over [`HALF_RANKS`] ranks of [`HALF_MEAN`] gives the
/// mean, not the overflow of the sum (inf in f16), in both half types.
fn check_half_avg_fits(setup: Setup) {
    // One group for both types: under mpirun a process forms one group.
    run_ok_with(setup, HALF_RANKS, |pg| {
        half_avg_fits::<f16>(&pg, setup, f16::from_f32)?;
        half_avg_fits::<bf16>(&pg, setup, bf16::from_f32)
    });
}

fn half_avg_fits<T: Element + PartialEq>(
    pg: &ProcessGroup,
    setup: Setup,
    from_f32: fn(f32) -> T,
) -> ddp_comm::Result<()> {
    let n = HALF_RANKS;
    let want = from_f32(HALF_MEAN);
    let ty = T::DTYPE;
    let mut buf = vec![want; 5];
    pg.all_reduce(&mut buf, ReduceOp::Avg)?;
    assert!(
        buf.iter().all(|v| *v == want),
        "all_reduce {ty} {setup:?}: {buf:?}"
    );

    let mut a = [want; 2];
    let mut b = [want; 3];
    pg.all_reduce_coalesced(&mut [&mut a[..], &mut b[..]], ReduceOp::Avg)?;
    assert!(
        a.iter().chain(&b).all(|v| *v == want),
        "all_reduce_coalesced {ty} {setup:?}"
    );

    for root in [0, n - 1] {
        let mut buf = vec![want; 5];
        pg.reduce(&mut buf, root, ReduceOp::Avg)?;
        // Off the root the buffer is left as it was, which is the mean here too.
        assert!(
            buf.iter().all(|v| *v == want),
            "reduce {ty} root {root} {setup:?}"
        );
    }

    let mut out = vec![from_f32(0.0); 3];
    pg.reduce_scatter(&[want; 3 * HALF_RANKS], &mut out, ReduceOp::Avg)?;
    assert!(
        out.iter().all(|v| *v == want),
        "reduce_scatter {ty} {setup:?}"
    );
    Ok(())
}

/// f16 and bf16 `Avg` scale each rank's input by 1/n before summing (as NCCL and PyTorch DDP
/// do), so a mean that fits the type is not lost to an overflowing sum.
#[test]
fn half_avg_does_not_overflow_where_the_mean_fits() {
    for setup in SETUPS {
        check_half_avg_fits(setup);
    }
}

/// [`half_avg_does_not_overflow_where_the_mean_fits`] on MPI.
#[cfg(feature = "mpi")]
#[test]
fn half_avg_does_not_overflow_where_the_mean_fits_mpi() {
    common::mpi::run_test(
        "half_avg_does_not_overflow_where_the_mean_fits_mpi",
        [HALF_RANKS],
        |_| check_half_avg_fits(Setup::Mpi),
    );
}

/// A mismatch, possibly wrapped with the rank it happened on.
#[cfg(feature = "mpi")]
fn is_mismatch(e: &ddp_comm::CommError) -> bool {
    match e {
        ddp_comm::CommError::Mismatch { .. } => true,
        ddp_comm::CommError::WithRank { source, .. } => is_mismatch(source),
        _ => false,
    }
}

/// Ranks that pass different lengths to the same collective get the named mismatch error on
/// every rank, before any data moves, instead of truncated, overrun or mispaired data. (Issue
/// 29: the MPI transport used to ignore fingerprints.)
#[cfg(feature = "mpi")]
#[test]
fn mismatched_lengths_are_an_error_not_corruption_mpi() {
    common::mpi::run_test(
        "mismatched_lengths_are_an_error_not_corruption_mpi",
        2..=3,
        |n| {
            let results =
                common::run_world_with(Setup::Mpi, n, std::time::Duration::from_secs(60), |pg| {
                    let r = pg.rank();
                    // Rank r passes 5 + r elements, all ones.
                    let mut buf = vec![1.0f32; 5 + r];
                    let e = pg
                        .all_reduce(&mut buf, ReduceOp::Sum)
                        .expect_err("different lengths must be refused");
                    assert!(is_mismatch(&e), "rank {r}: expected a mismatch, got {e}");
                    assert!(e.to_string().contains("all_reduce(f32 x"), "{e}");
                    assert_eq!(buf, vec![1.0f32; 5 + r], "rank {r}'s buffer was touched");
                    Ok(())
                });
            for res in results {
                res.expect("the test body");
            }
        },
    );
}

/// A receive whose length differs from the send's is the named mismatch, and the message is
/// not left behind to be taken for the next one.
#[cfg(feature = "mpi")]
#[test]
fn mismatched_send_recv_is_an_error_not_corruption_mpi() {
    common::mpi::run_test(
        "mismatched_send_recv_is_an_error_not_corruption_mpi",
        2..=2,
        |n| {
            let results =
                common::run_world_with(Setup::Mpi, n, std::time::Duration::from_secs(60), |pg| {
                    // Rank 0 hosts the store: it stays until rank 1 has checked its error.
                    if pg.rank() == 0 {
                        pg.send(&[3.0f32; 4], 1, 9)?;
                        pg.store().get("checked")?;
                    } else {
                        let mut got = [0.0f32; 6];
                        let e = pg.recv(&mut got, 0, 9).expect_err("length mismatch");
                        assert!(is_mismatch(&e), "expected a mismatch, got {e}");
                        assert_eq!(got, [0.0f32; 6], "the receive buffer was touched");
                        pg.store().set("checked", b"1")?;
                    }
                    Ok(())
                });
            for res in results {
                res.expect("the test body");
            }
        },
    );
}

/// A rank that rejects its own arguments (here: a scatter input on a rank that is not the
/// root) fails at once with its argument error, and its peers, already inside MPI's
/// fingerprint check, fail naming it and quoting its report, instead of waiting in MPI for ever
/// (MPI calls have no timeout).
#[cfg(feature = "mpi")]
#[test]
fn a_rank_that_rejects_its_arguments_fails_its_peers_mpi() {
    common::mpi::run_test(
        "a_rank_that_rejects_its_arguments_fails_its_peers_mpi",
        2..=3,
        |n| {
            let results =
                common::run_world_with(Setup::Mpi, n, std::time::Duration::from_secs(60), |pg| {
                    let (r, wrong) = (pg.rank(), n - 1);
                    let input = (r == 0 || r == wrong).then(|| vec![1.0f32; 2 * n]);
                    let mut out = [0.0f32; 2];
                    let e = pg
                        .scatter(input.as_deref(), &mut out, 0)
                        .expect_err("the last rank's arguments are wrong")
                        .to_string();
                    if r == wrong {
                        assert!(e.contains("only the root (0) passes"), "rank {r}: {e}");
                    } else {
                        // Its report ("only the root (0) passes ...") is appended when it
                        // comes within the report wait; on a busy machine it may not.
                        assert!(
                            e.contains(&format!("rank {wrong} rejected its arguments")),
                            "rank {r}: {e}"
                        );
                    }
                    // Rank 0 hosts the store: it stays until every rank has checked its error.
                    if r == 0 {
                        for peer in 1..n {
                            pg.store().get(&format!("checked/{peer}"))?;
                        }
                    } else {
                        pg.store().set(&format!("checked/{r}"), b"1")?;
                    }
                    Ok(())
                });
            for res in results {
                res.expect("the test body");
            }
        },
    );
}
