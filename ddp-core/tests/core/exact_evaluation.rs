//! Evaluation without padding: `ExactShard` + `EvalTotals` count every sample exactly once at
//! world 1-4 (lengths not divisible by the world), and the all-reduced accuracy and mean loss
//! equal those of one process scoring the whole set.
use crate::common::run_ranks;
use ddp_core::metrics::all_reduce_weighted_mean;
use ddp_core::{data::ExactShard, metrics::EvalTotals};

/// Whether the "model" gets sample `i` right, and its loss: fixed, uneven over the indices.
fn score(i: usize) -> (bool, f64) {
    (
        !i.is_multiple_of(3) && i % 7 != 5,
        (i % 5) as f64 * 0.25 + 0.1,
    )
}

fn single_process(len: usize) -> EvalTotals {
    let mut t = EvalTotals::default();
    for i in 0..len {
        let (right, loss) = score(i);
        t.add(right as u64, 1, loss);
    }
    t
}

#[test]
fn every_sample_is_scored_once_and_totals_match_one_process() {
    for world in 1..=4 {
        for len in [7, 10, 13] {
            let per_rank = run_ranks(world, |pg| {
                let shard = ExactShard::new(len, pg.world_size(), pg.rank()).expect("shard");
                let seen: Vec<usize> = shard.indices().collect();
                let mut local = EvalTotals::default();
                // In uneven batches of 2, as a loader would give them.
                for chunk in seen.chunks(2) {
                    let right = chunk.iter().filter(|&&i| score(i).0).count() as u64;
                    let loss: f64 = chunk.iter().map(|&i| score(i).1).sum();
                    local.add(right, chunk.len() as u64, loss);
                }
                let global = local.all_reduce(&pg).expect("all-reduce");
                (seen, global)
            });
            let mut counts = vec![0usize; len];
            for (seen, _) in &per_rank {
                for &i in seen {
                    counts[i] += 1;
                }
            }
            assert!(
                counts.iter().all(|&c| c == 1),
                "world {world} len {len}: times each index was scored {counts:?}"
            );
            let want = single_process(len);
            for (rank, (_, got)) in per_rank.iter().enumerate() {
                assert_eq!(got.count, len as u64, "world {world} len {len} rank {rank}");
                assert_eq!(
                    got.correct, want.correct,
                    "world {world} len {len} rank {rank}"
                );
                assert_eq!(got.accuracy(), want.accuracy());
                let (a, b) = (got.mean_loss().unwrap(), want.mean_loss().unwrap());
                assert!((a - b).abs() < 1e-12, "mean loss {a} vs {b}");
            }
        }
    }
}

#[test]
fn weighted_mean_weights_ranks_by_their_samples() {
    // Rank r reports mean r with r + 1 samples: (0*1 + 1*2 + 2*3) / 6.
    let means = run_ranks(3, |pg| {
        let r = pg.rank() as f64;
        all_reduce_weighted_mean(&pg, r, r + 1.0).expect("all-reduce")
    });
    for m in means {
        assert_eq!(m, Some(8.0 / 6.0));
    }
}
